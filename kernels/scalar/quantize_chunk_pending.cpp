// PLACEHOLDER until branch iq-quant4 lands: delete this file when merging it (its
// quantize_chunk replaces this one; both together fail to link, on purpose).
// Without importance weights ggml_quantize_chunk is the plain reference quantizer, and
// Q8_0 ignores the weights; anything else weighted is not written yet.
#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::ref {

void quantize_chunk(TensorType type, const float* src, void* dst, size_t n_rows, size_t n_per_row,
                    const float* importance) {
  if (importance && type != TensorType::Q8_0)
    throw Error("importance-weighted " + type_name(type) + " quantization is not implemented yet");
  const TypeInfo& info = type_info(type);
  for (size_t r = 0; r < n_rows; ++r)
    quantize_row(type, src + r * n_per_row, static_cast<uint8_t*>(dst) + r * (n_per_row / info.block_size) * info.block_bytes,
                 n_per_row);
}

}  // namespace kiln::kernels::ref
