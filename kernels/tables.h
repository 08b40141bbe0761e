#pragma once
// Internal: the per-ISA Ops tables that dispatch.cpp chooses from. Each lives in a TU
// compiled with its own ISA flags, so nothing here may be inline code. Every table names
// each Ops member it fills (designated initializers, in declaration order), so a member
// added to Ops is a -Wmissing-field-initializers warning in any table that lacks it.
#include "kernels/kernels.h"

namespace kiln::kernels {

const Ops& scalar_ops();
#ifdef KILN_HAVE_X86
const Ops& avx2_ops();
const Ops& avx512_ops();
#endif
#ifdef KILN_HAVE_AVXVNNI
const Ops& avxvnni_ops();
#endif

}  // namespace kiln::kernels
