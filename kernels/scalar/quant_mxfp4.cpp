// Reference (de)quantization of MXFP4 (OCP Microscaling, 4-bit E2M1 values sharing an
// E8M0 power-of-two scale per 32 elements), bit for bit as ggml's.
//
// The quantizer is ggml's deterministic one: the block's scale is the power of two that
// puts its largest magnitude in [4, 8) of the doubled value grid (floor(log2(amax)) - 2),
// so the largest value may exceed the grid's 12 (6 in E2M1) and clamp; every value then
// takes the nearest grid point, the lowest code winning a tie (+0 before -0, 1 before -1).
#include <cmath>

#include "kernels/quant.h"

namespace kiln::kernels::ref {
namespace {

// The E8M0 exponent byte ggml writes for a block whose largest magnitude is amax, 0 for
// an all-zero block. log2f (not an exact frexp) on purpose: ggml rounds a value just
// under a power of two up to it the same way. ggml converts an out-of-range float to
// uint8_t (undefined behaviour: amax below 2^-125, or infinite); kiln clamps those to 0
// and 254 (255 is E8M0's NaN, which ggml's validation rejects).
uint8_t shared_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  const float e = std::floor(std::log2(amax)) - 2 + 127;
  if (!(e >= 0.0f)) return 0;
  if (e > 254.0f) return 254;
  return static_cast<uint8_t>(e);
}

// The code whose doubled value times d is nearest x; strict comparison keeps the first of
// equals. A NaN x compares false everywhere and gets code 0, as in ggml.
uint8_t nearest_code(float x, float d) {
  uint8_t best = 0;
  float best_err = std::fabs(kMxfp4Values[0] * d - x);
  for (uint8_t i = 1; i < 16; ++i) {
    const float err = std::fabs(kMxfp4Values[i] * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

void dequantize_row_mxfp4(const block_mxfp4* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = mxfp4_half_scale(x[i].e);
    for (size_t j = 0; j < QK / 2; ++j) {
      y[j] = kMxfp4Values[x[i].qs[j] & 0x0F] * d;
      y[j + QK / 2] = kMxfp4Values[x[i].qs[j] >> 4] * d;
    }
  }
}

void quantize_row_mxfp4(const float* x, block_mxfp4* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    float amax = 0.0f;
    for (size_t j = 0; j < QK; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    y[i].e = shared_exponent(amax);
    const float d = mxfp4_half_scale(y[i].e);
    for (size_t j = 0; j < QK / 2; ++j)
      y[i].qs[j] = static_cast<uint8_t>(nearest_code(x[j], d) | nearest_code(x[j + QK / 2], d) << 4);
  }
}

}  // namespace kiln::kernels::ref
