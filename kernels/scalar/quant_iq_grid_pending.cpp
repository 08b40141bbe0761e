// Placeholders for the codebook i-quant quantizers declared in kernels/quant_iq.h, so that
// quantize_chunk links before they exist: each throws. The branch that implements them
// (iq-quantgrid) deletes this file.
#include <string>

#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::ref {
namespace {
[[noreturn]] void pending(const char* type) {
  throw Error(std::string("quantize_chunk: no ") + type + " quantizer in this build");
}
}  // namespace

void quantize_iq2_xxs(const float*, void*, size_t, size_t, const float*) { pending("IQ2_XXS"); }
void quantize_iq2_xs(const float*, void*, size_t, size_t, const float*) { pending("IQ2_XS"); }
void quantize_iq2_s(const float*, void*, size_t, size_t, const float*) { pending("IQ2_S"); }
void quantize_iq3_xxs(const float*, void*, size_t, size_t, const float*) { pending("IQ3_XXS"); }
void quantize_iq3_s(const float*, void*, size_t, size_t, const float*) { pending("IQ3_S"); }
void quantize_iq1_s(const float*, void*, size_t, size_t, const float*) { pending("IQ1_S"); }
void quantize_iq1_m(const float*, void*, size_t, size_t, const float*) { pending("IQ1_M"); }

}  // namespace kiln::kernels::ref
