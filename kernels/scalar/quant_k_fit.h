#pragma once
// The scale searches of the K-quant reference (kernels/scalar/quant_k_quantize.cpp), shared
// with the importance-weighted quantizers (quant_weighted*.cpp) and the i-quants: ggml runs
// the same searches there with other weights and settings. Internal to kernels/scalar/.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/quant.h"

namespace kiln::kernels::ref::kfit {

// Sub-blocks whose largest magnitude is below this are treated as all zero (ggml's
// GROUP_MAX_EPS).
inline constexpr float kZeroGroup = 1e-15f;
inline constexpr int kMaxSubBlock = 32;

// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the low mantissa bits:
// ggml's nearest_int. Written that way (rather than lrintf) so that arguments beyond its
// valid range |x| < 2^22, or NaN, give the same integer as in llama.cpp.
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// The value of largest magnitude, sign kept (the first of equals).
float signed_largest(int n, const float* v);

// The search settings of one affine fit x ~ scale * l + offset, l in 0..qmax. Candidate g
// stretches the range over qmax + first_stretch + g * stretch_step steps.
struct AffineSearch {
  int qmax;
  float first_stretch;  // negative: the first candidates are coarser than the plain grid
  float stretch_step;
  int n_grids;
  bool abs_error;  // judge by weighted |error| instead of squared
};

// Fits x[i] ~ scale * q[i] - *neg_offset (q in 0..qmax, the offset never positive) under
// weights w, by ggml's grid search (make_qkx2_quants / make_qkx3_quants); returns the scale.
float fit_affine(int n, const AffineSearch& search, const float* x, const float* w, uint8_t* q, float* neg_offset);
// Final levels of an affine sub-block against its decoded scale and offset.
void reround_affine(int n, int qmax, const float* x, float scale, float neg_offset, uint8_t* q);

// Fits x[i] ~ scale * (q[i] - half), q - half in -half..half-1, under weights w (nullptr:
// x^2), trying the plain grid and 18 stretched ones (ggml's make_qx_quants, rmse_type 1);
// returns the scale, 0 (and q all 0) for an all-zero sub-block.
float fit_symmetric(int n, int half, const float* x, const float* w, int8_t* q);
// Final levels of a symmetric sub-block (stored + half) against its decoded scale.
void reround_symmetric(int n, int half, const float* x, float scale, int8_t* q);
// Q3_K's last step once y.d and y.scales are set (plain and weighted alike): every
// sub-block's levels q re-rounded against its decoded scale, then split into hmask and qs.
void reround_and_pack_q3_K(const float* x, int8_t* q, block_q3_K& y);

// Q6_K super-blocks of n values (quantize_row_q6_K with importance nullptr); importance:
// n weights of one row, used as the fit's weights.
void quantize_q6_K_blocks(const float* x, block_q6_K* y, size_t n, const float* importance);

// Element e of a super-block: where its low 2 bits go in Q2_K/Q3_K qs (byte, shift).
inline size_t low2_byte(size_t e) { return 32 * (e / 128) + e % 32; }
inline int low2_shift(size_t e) { return int(2 * (e % 128 / 32)); }
// Q4_K/Q5_K: the low 4 bits of element e sit in qs[32 * (e / 64) + e % 32], low nibble for
// even 32-element sub-blocks, high nibble for odd ones.
inline size_t nibble_byte(size_t e) { return 32 * (e / 64) + e % 32; }
inline int nibble_shift(size_t e) { return int(4 * (e / 32 % 2)); }

}  // namespace kiln::kernels::ref::kfit
