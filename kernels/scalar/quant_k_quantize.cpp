// Reference quantizers for the K-quant super-blocks Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
//
// They give the bytes of ggml's deterministic quantize_row_q*_K_ref, the path llama-quantize
// takes when it has no importance matrix. Those are searches, not formulas: each 16- or
// 32-element sub-block gets a scale (and a min) fitted by trying a few candidate grids and
// keeping the one with the lowest weighted error, then the sub-block scales are themselves
// quantized to 4, 6 or 8 bits against one fp16 super-block scale, and finally every value
// is re-rounded against the scale it will really be decoded with.
//
// Bit-exactness therefore depends on every float operation happening as in ggml: the same
// association ((w * x) * q, never w * (x * q)), the same accumulation order, divisions where
// ggml divides and reciprocals where it multiplies, and no fused multiply-add (this file is
// compiled with -ffp-contract=off). Integer conversions keep ggml's truncations too, e.g. a
// rounded scale stored into a uint8_t before it is clamped. tests/quant_test.cpp checks the
// result byte for byte against llama.cpp's output.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/quant.h"

namespace kiln::kernels::ref {
namespace {

// Sub-blocks whose largest magnitude is below this are treated as all zero (ggml's
// GROUP_MAX_EPS).
constexpr float kZeroGroup = 1e-15f;

// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the low mantissa bits:
// ggml's nearest_int. Written as ggml writes it (rather than lrintf) so that even arguments
// beyond its valid range |x| < 2^22, or NaN, give the same integer as in llama.cpp.
int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// Fits x[i] ~ scale * q[i] - the_min with q in 0..qmax (the_min >= 0, i.e. the offset is
// never positive) for the affine K-quants Q2_K, Q4_K and Q5_K; writes q and the_min and
// returns scale (ggml's make_qkx2_quants).
//
// The first candidate spreads min(x, 0)..max(x) over the whole grid. Then nstep + 1 more
// grids are tried with the range stretched to qmax + rmin + rdelta * step steps; for each,
// the quants are fixed and scale/min come from the weighted least-squares solution (min
// forced to 0 if the solution wants a positive offset). The candidate with the smallest
// weighted error wins: absolute error when use_abs_error (Q2_K), squared otherwise.
// `scratch` holds n quants of the candidate under test.
float fit_scale_and_min(int n, int qmax, const float* x, const float* weights, uint8_t* q, float* the_min,
                        uint8_t* scratch, float rmin, float rdelta, int nstep, bool use_abs_error) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {  // every value equal and <= 0, e.g. all zero: q = 0 and the_min = -x
    for (int i = 0; i < n; ++i) q[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = qmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    q[i] = static_cast<uint8_t>(clamp_int(l, 0, qmax));
    float diff = scale * q[i] + min - x[i];
    diff = use_abs_error ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + qmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, qmax);
      scratch[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * scratch[i] + this_min - x[i];
        diff = use_abs_error ? std::fabs(diff) : diff * diff;
        error += weights[i] * diff;
      }
      if (error < best_error) {
        for (int i = 0; i < n; ++i) q[i] = scratch[i];
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// The value of largest magnitude, sign kept (the first of equals), or 0 when the whole
// group is below kZeroGroup: the symmetric fits put it on the -half end of their grid.
float largest_magnitude(int n, const float* x) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  return amax < kZeroGroup ? 0.0f : max;
}

// Fits x[i] ~ scale * (q[i] - half) with q in 0..2*half-1 for Q6_K, weighting each value by
// x^2 (ggml's make_qx_quants with rmse_type 1 and no importance weights). The value of
// largest magnitude sets the sign of the scale so that it lands on the full -half end; 18
// grids slightly wider or narrower than that (half +- 0.1..0.9 steps) are then tried and
// the one whose least-squares scale explains the most weighted energy is kept. Returns the
// scale; an all-zero group gives 0 with every q = 0 (not `half`), as in ggml.
float fit_symmetric_scale(int n, int half, const float* x, int8_t* q) {
  const float max = largest_magnitude(n, x);
  if (max == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  float iscale = -half / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -half, half - 1);
    q[i] = static_cast<int8_t>(l + half);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int tweak = -9; tweak <= 9; ++tweak) {
    if (tweak == 0) continue;
    iscale = -(half + 0.1f * tweak) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -half, half - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    // sumlx^2 / suml2 is the weighted energy the best scale for these quants explains.
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        q[i] = static_cast<int8_t>(half + clamp_int(nearest_int(iscale * x[i]), -half, half - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Fits x[i] ~ scale * (q[i] - half) with q in 0..2*half-1 for Q3_K (ggml's make_q3_quants
// with do_rmse): starts from the grid that puts the largest magnitude on -half, then up to
// five passes of coordinate descent move single quants whenever that raises the x^2-weighted
// energy the least-squares scale explains. Returns that scale (0 for an all-zero group).
float fit_q3_scale(int n, int half, const float* x, int8_t* q) {
  const float max = largest_magnitude(n, x);
  if (max == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  const float iscale = -half / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {  // q holds the signed quant (-half..half-1) until the end
    const int l = clamp_int(nearest_int(iscale * x[i]), -half, half - 1);
    q[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * q[i];  // the sums without element i
      if (slx > 0) {
        float sl2 = suml2 - w * q[i] * q[i];
        const int l = clamp_int(nearest_int(x[i] * sl2 / slx), -half, half - 1);
        if (l != q[i]) {
          slx += w * x[i] * l;
          sl2 += w * l * l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            q[i] = static_cast<int8_t>(l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(q[i] + half);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Element e of a super-block: where its low 2 bits go in Q2_K/Q3_K qs (byte, shift).
size_t low2_byte(size_t e) { return 32 * (e / 128) + e % 32; }
int low2_shift(size_t e) { return int(2 * (e % 128 / 32)); }

// Q4_K/Q5_K: the low 4 bits of element e sit in qs[32 * (e / 64) + e % 32], low nibble for
// even 32-element sub-blocks, high nibble for odd ones.
size_t nibble_byte(size_t e) { return 32 * (e / 64) + e % 32; }
int nibble_shift(size_t e) { return int(4 * (e / 32 % 2)); }

// The Q4_K/Q5_K scale stage shared by both formats: sub-block scales and mins (8 each, all
// >= 0) become 6-bit multiples of d = max_scale/63 and dmin = max_min/63, packed as
// kernels/quant.h describes. The rounded values pass through a uint8_t before the clamp to
// 63, as in ggml (the largest maps to exactly 63, so the clamp only catches rounding).
void pack_scales_and_mins_k4(const float* scales, const float* mins, uint8_t* packed, uint16_t* d,
                             uint16_t* dmin) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    if (ls > 63) ls = 63;
    if (lm > 63) lm = 63;
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {  // low 4 bits in bytes 8..11, top 2 bits in bits 6..7 of bytes 0..7
      packed[j + 4] = static_cast<uint8_t>((ls & 0x0F) | (lm & 0x0F) << 4);
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d = f32_to_fp16(max_scale / 63.0f);
  *dmin = f32_to_fp16(max_min / 63.0f);
}

// Q4_K/Q5_K: fits all 8 sub-blocks of 32 and returns the final quants (0..qmax) in q,
// re-rounded against the decoded d * sc and dmin * m. rmin/nstep are ggml's per-format
// search settings.
void quantize_super_block_k4(const float* x, int qmax, float rmin, int nstep, uint8_t* q, uint8_t* packed,
                             uint16_t* d, uint16_t* dmin) {
  float scales[8], mins[8], weights[32];
  uint8_t scratch[32];
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weights: |x| plus the sub-block's RMS, so large values matter more but small ones
    // are not ignored.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_scale_and_min(32, qmax, xs, weights, q + 32 * j, &mins[j], scratch, rmin, 0.1f, nstep, false);
  }
  std::memset(packed, 0, K_SCALE_SIZE);
  pack_scales_and_mins_k4(scales, mins, packed, d, dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(packed, j, &sc, &m);
    const float dl = fp16_to_f32(*d) * sc;
    if (!dl) continue;  // a zero scale keeps the quants of the fit
    const float ml = fp16_to_f32(*dmin) * m;
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + l] + ml) / dl), 0, qmax));
  }
}

}  // namespace

void quantize_row_q2_K(const float* x, block_q2_K* y, size_t n) {
  constexpr float kScaleLevels = 15.0f;  // 4-bit sub-block scales and mins
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K], scratch[16];
    float weights[16], scales[16], mins[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_and_min(16, 3, x + 16 * j, weights, q + 16 * j, &mins[j], scratch, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    // Scales in the low nibble, mins in the high one; the int results are stored into the
    // byte as ggml stores them (truncating).
    if (max_scale > 0) {
      const float iscale = kScaleLevels / max_scale;
      for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = f32_to_fp16(max_scale / kScaleLevels);
    } else {
      for (int j = 0; j < 16; ++j) y[i].scales[j] = 0;
      y[i].d = f32_to_fp16(0.0f);
    }
    if (max_min > 0) {
      const float iscale = kScaleLevels / max_min;
      for (int j = 0; j < 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(y[i].scales[j] | nearest_int(iscale * mins[j]) << 4);
      y[i].dmin = f32_to_fp16(max_min / kScaleLevels);
    } else {
      y[i].dmin = f32_to_fp16(0.0f);
    }
    const float d = fp16_to_f32(y[i].d), dmin = fp16_to_f32(y[i].dmin);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * (y[i].scales[j] & 0x0F);
      if (!dl) continue;
      const float ml = dmin * (y[i].scales[j] >> 4);
      for (int l = 0; l < 16; ++l) q[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + l] + ml) / dl), 0, 3));
    }
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[low2_byte(e)] |= static_cast<uint8_t>(q[e] << low2_shift(e));
  }
}

void quantize_row_q3_K(const float* x, block_q3_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t q[QK_K];
    float scales[16];
    float max_scale = 0, amax = 0;  // the sub-block scale of largest magnitude, signed
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_q3_scale(16, 4, x + 16 * j, q + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    // 6-bit signed sub-block scales (-32..31, stored +32) against d = max_scale / -32.
    std::memset(y[i].scales, 0, K_SCALE_SIZE);
    if (max_scale) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t rounded = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        const int sc = clamp_int(rounded, -32, 31) + 32;
        y[i].scales[j % 8] |= static_cast<uint8_t>((sc & 0x0F) << (j < 8 ? 0 : 4));
        y[i].scales[8 + j % 4] |= static_cast<uint8_t>((sc >> 4) << (2 * (j / 4)));
      }
      y[i].d = f32_to_fp16(1 / iscale);
    } else {
      y[i].d = f32_to_fp16(0.0f);
    }
    const float d = fp16_to_f32(y[i].d);
    for (int j = 0; j < 16; ++j) {
      const int low4 = j < 8 ? y[i].scales[j] & 0x0F : y[i].scales[j - 8] >> 4;
      const int high2 = (y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = d * static_cast<int8_t>((low4 | high2 << 4) - 32);
      if (!dl) continue;
      for (int l = 0; l < 16; ++l)
        q[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / dl), -4, 3) + 4);
    }
    // q is 0..7 here: bit 2 goes to hmask, the low 2 bits to qs.
    std::memset(y[i].hmask, 0, sizeof y[i].hmask);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) {
      if (q[e] > 3) y[i].hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
      y[i].qs[low2_byte(e)] |= static_cast<uint8_t>((q[e] & 3) << low2_shift(e));
    }
  }
}

void quantize_row_q4_K(const float* x, block_q4_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    quantize_super_block_k4(x, 15, -1.0f, 20, q, y[i].scales, &y[i].d, &y[i].dmin);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>(q[e] << nibble_shift(e));
  }
}

void quantize_row_q5_K(const float* x, block_q5_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    quantize_super_block_k4(x, 31, -0.5f, 15, q, y[i].scales, &y[i].d, &y[i].dmin);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (size_t e = 0; e < QK_K; ++e) {
      y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>((q[e] & 0x0F) << nibble_shift(e));
      if (q[e] > 15) y[i].qh[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
  }
}

void quantize_row_q6_K(const float* x, block_q6_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t q[QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_scale(16, 32, x + 16 * j, q + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kZeroGroup) {  // nothing to encode: an all-zero block
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // int8 sub-block scales against d = max_scale / -128; the opposite extreme would be
    // +128 and clamps to 127.
    const float iscale = -128.0f / max_scale;
    y[i].d = f32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; ++j) {
      const int sc = nearest_int(iscale * scales[j]);
      y[i].scales[j] = static_cast<int8_t>(sc < 127 ? sc : 127);
    }
    const float d = fp16_to_f32(y[i].d);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * y[i].scales[j];
      if (!dl) continue;
      for (int l = 0; l < 16; ++l)
        q[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / dl), -32, 31) + 32);
    }
    // q is 0..63: low 4 bits to ql, high 2 bits to qh (layout in kernels/quant.h).
    std::memset(y[i].ql, 0, sizeof y[i].ql);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (size_t e = 0; e < QK_K; ++e) {
      const size_t h = e / 128, g = e % 128 / 32, l = e % 32;
      y[i].ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((q[e] & 0x0F) << (4 * (g / 2)));
      y[i].qh[32 * h + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * g));
    }
  }
}

}  // namespace kiln::kernels::ref
