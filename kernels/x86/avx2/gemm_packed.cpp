// AVX2 gemm on packed quantized weights without VNNI: the kernels of packed_kernels.h
// with vpmaddubsw + vpmaddwd. Activations come from the shared x86 prepare
// (kernels/x86/packed_entry.h over the AVX2 traits), as in the avxvnni table.
#define KILN_PACKED_VNNI 0
#include "kernels/x86/avx2/packed_kernels.h"

namespace kiln::kernels::avx2 {

void gemm_packed(const GemmArgs& a) { gemm_packed_impl(a); }

}  // namespace kiln::kernels::avx2
