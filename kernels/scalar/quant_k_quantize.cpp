// Reference quantizers for the K-quant super-blocks Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
//
// A super-block of 256 values is cut into sub-blocks of 16 or 32. Each sub-block gets its
// own scale (and, in the affine formats Q2_K/Q4_K/Q5_K, an offset), chosen by a search:
// the values are rounded onto a series of candidate grids, each grid's levels are given
// the scale (and offset) that minimise the weighted squared error for those levels, and
// the grid whose fit is best by the format's measure wins. Q3_K refines one grid level by
// level instead. The sub-block scales are then stored as small integers times one fp16
// super-block scale, and every value is rounded again against the scale it will really be
// decoded with.
//
// The result must be the bytes of ggml's quantize_row_q*_K_ref (what llama-quantize writes
// without an importance matrix), so every float expression keeps ggml's association and
// accumulation order ((w * x) * l is not (w * l) * x), divisions stay divisions, and no
// multiply-add is fused (this file is compiled with -ffp-contract=off). Integer
// conversions keep ggml's truncations too (a rounded scale passes through a byte before it
// is clamped). tests/quant_test.cpp checks the bytes against llama.cpp's output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "kernels/quant.h"
#include "kernels/scalar/quant_k_fit.h"

namespace kiln::kernels::ref {
// The searches are in kfit (quant_k_fit.h) for the importance-weighted quantizers to share.
namespace kfit {

float signed_largest(int n, const float* v) {
  float largest = 0, magnitude = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(v[i]) > magnitude) {
      magnitude = std::fabs(v[i]);
      largest = v[i];
    }
  }
  return largest;
}

// The largest of v, or 0 when none is positive (NaNs are passed over).
float largest_positive(int n, const float* v) {
  float largest = 0;
  for (int i = 0; i < n; ++i)
    if (v[i] > largest) largest = v[i];
  return largest;
}

// The grid search shared by the affine and the symmetric fits. `best` is the fit of the
// starting grid, whose levels are in `levels`; try_grid(g, best, trial) rounds the
// sub-block onto candidate grid g (which may depend on the best fit so far), writes the
// levels to `trial` and returns their fit (nothing when they cannot be fitted). A
// candidate replaces the kept fit only when Fit::beats says it is strictly better, so ties
// keep the earlier grid.
template <class Fit, class TryGrid>
Fit keep_best_grid(int n, int n_grids, Fit best, int* levels, const TryGrid& try_grid) {
  int trial[kMaxSubBlock];
  for (int g = 0; g < n_grids; ++g) {
    const std::optional<Fit> fit = try_grid(g, best, trial);
    if (fit && fit->beats(best)) {
      best = *fit;
      std::copy_n(trial, n, levels);
    }
  }
  return best;
}

// ---------------------------------------------------------------- affine: x ~ scale * l + offset

struct AffineFit {
  float scale = 0, offset = 0, error = 0;
  bool beats(const AffineFit& other) const { return error < other.error; }
};

// Rounds x onto levels 0..qmax of inv_scale * (x - origin) and returns sum w*l, w*l^2, w*l*x.
struct AffineSums {
  float l = 0, l2 = 0, xl = 0;
};
AffineSums round_affine(int n, int qmax, const float* x, const float* w, float inv_scale, float origin, int* levels) {
  AffineSums s;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(inv_scale * (x[i] - origin)), 0, qmax);
    levels[i] = l;
    s.l += w[i] * l;
    s.l2 += w[i] * l * l;
    s.xl += w[i] * l * x[i];
  }
  return s;
}

float affine_error(int n, const float* x, const float* w, const int* levels, float scale, float offset,
                   bool abs_error) {
  float error = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * levels[i] + offset - x[i];
    diff = abs_error ? std::fabs(diff) : diff * diff;
    error += w[i] * diff;
  }
  return error;
}

// Fits x[i] ~ scale * q[i] - *neg_offset with q in 0..qmax and an offset that is never
// positive (the affine K-quants store it as a non-negative "min"); returns the scale.
// The starting grid spreads min(x, 0)..max(x) over the whole range with scale
// (max - min) / qmax. Each candidate grid starts at the offset of the best fit so far
// (so a better offset found early moves the later grids) and spans from there to max(x);
// its scale and offset are the weighted least-squares solution for its levels (the offset
// forced to 0, and the scale refitted, when the solution wants it positive).
float fit_affine(int n, const AffineSearch& search, const float* x, const float* w, uint8_t* q, float* neg_offset) {
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {  // every value equal and <= 0, e.g. all zero: q = 0, offset = the value
    std::fill_n(q, n, uint8_t{0});
    *neg_offset = -min;
    return 0.0f;
  }
  const int qmax = search.qmax;
  int levels[kMaxSubBlock];
  const float inv_scale = qmax / (max - min);
  AffineFit start{1 / inv_scale, min, 0};
  round_affine(n, qmax, x, w, inv_scale, min, levels);
  start.error = affine_error(n, x, w, levels, start.scale, start.offset, search.abs_error);

  auto try_grid = [&](int g, const AffineFit& so_far, int* trial) {
    const float origin = so_far.offset;
    const float stretched = (search.first_stretch + search.stretch_step * g + qmax) / (max - origin);
    const AffineSums s = round_affine(n, qmax, x, w, stretched, origin, trial);
    const float det = sum_w * s.l2 - s.l * s.l;
    if (!(det > 0)) return std::optional<AffineFit>{};
    AffineFit fit{(sum_w * s.xl - sum_x * s.l) / det, (s.l2 * sum_x - s.l * s.xl) / det, 0};
    if (fit.offset > 0) {
      fit.offset = 0;
      fit.scale = s.xl / s.l2;
    }
    fit.error = affine_error(n, x, w, trial, fit.scale, fit.offset, search.abs_error);
    return std::optional<AffineFit>{fit};
  };
  const AffineFit best = keep_best_grid(n, search.n_grids, start, levels, try_grid);
  for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(levels[i]);
  *neg_offset = -best.offset;
  return best.scale;
}

// Q2_K, Q4_K, Q5_K (ggml's settings for each; Q2_K judges by |error|).
constexpr AffineSearch kQ2Search{3, -0.5f, 0.1f, 16, true};
constexpr AffineSearch kQ4Search{15, -1.0f, 0.1f, 21, false};
constexpr AffineSearch kQ5Search{31, -0.5f, 0.1f, 16, false};

void reround_affine(int n, int qmax, const float* x, float scale, float neg_offset, uint8_t* q) {
  for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(clamp_int(nearest_int((x[i] + neg_offset) / scale), 0, qmax));
}

// ---------------------------------------------------------------- symmetric: x ~ scale * l

// Levels l in -half..half-1, each value weighted by w[i], or by x^2 without weights (large
// values matter most).
struct SymmetricSums {
  float lx = 0, l2 = 0;
};
SymmetricSums round_symmetric(int n, int half, const float* x, const float* weights, float inv_scale, int* levels) {
  SymmetricSums s;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(inv_scale * x[i]), -half, half - 1);
    levels[i] = l;
    const float w = weights ? weights[i] : x[i] * x[i];
    s.lx += w * x[i] * l;
    s.l2 += w * l * l;
  }
  return s;
}

// The least-squares scale sum_lx / sum_l2 of a set of levels leaves a weighted error of
// sum(w x^2) - sum_lx^2 / sum_l2: the fit that explains the most energy sum_lx^2 / sum_l2
// is the best, compared without dividing.
struct SymmetricFit {
  SymmetricSums sums;
  float scale = 0, energy = 0;
  explicit SymmetricFit(SymmetricSums s) : sums(s), scale(s.l2 ? s.lx / s.l2 : 0.0f), energy(scale * s.lx) {}
  bool beats(const SymmetricFit& other) const { return sums.l2 > 0 && sums.lx * sums.lx > other.energy * sums.l2; }
};

// The starting grid of both symmetric fits maps the sub-block's signed largest value (its
// anchor) to exactly -half, the end of the range that is one level longer. Returns the
// anchor and the grid's sums, or nothing for an all-zero sub-block (largest magnitude
// below kZeroGroup), whose q are then all 0 (not `half`), as in ggml.
struct SymmetricStart {
  float anchor;
  SymmetricSums sums;
};
std::optional<SymmetricStart> start_symmetric(int n, int half, const float* x, const float* weights, int* levels,
                                              int8_t* q) {
  const float anchor = signed_largest(n, x);
  if (std::fabs(anchor) < kZeroGroup) {
    std::fill_n(q, n, int8_t{0});
    return std::nullopt;
  }
  return SymmetricStart{anchor, round_symmetric(n, half, x, weights, -half / anchor, levels)};
}

// Q6_K: after the starting grid, tries 18 grids that map the anchor to
// -(half +- 0.1 .. 0.9).
float fit_symmetric(int n, int half, const float* x, const float* weights, int8_t* q) {
  int levels[kMaxSubBlock];
  const std::optional<SymmetricStart> start = start_symmetric(n, half, x, weights, levels, q);
  if (!start) return 0.0f;
  const SymmetricFit first(start->sums);
  const SymmetricFit best = keep_best_grid(n, 18, first, levels, [&](int g, const SymmetricFit&, int* trial) {
    const int tweak = g < 9 ? g - 9 : g - 8;  // -9..-1, 1..9
    const float inv_scale = -(half + 0.1f * tweak) / start->anchor;
    return std::optional<SymmetricFit>{SymmetricFit(round_symmetric(n, half, x, weights, inv_scale, trial))};
  });
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(levels[i] + half);
  return best.scale;
}

// Q3_K: the same model and starting grid as fit_symmetric, then coordinate descent: each
// level in turn is moved to where the least-squares scale of the others would put it,
// kept if that raises the explained energy; at most five sweeps, fewer once a sweep
// changes nothing. Returns the final least-squares scale (0 for an all-zero sub-block).
float fit_symmetric_by_descent(int n, int half, const float* x, int8_t* q) {
  int levels[kMaxSubBlock];
  const std::optional<SymmetricStart> start = start_symmetric(n, half, x, nullptr, levels, q);
  if (!start) return 0.0f;
  SymmetricSums sums = start->sums;
  for (int sweep = 0; sweep < 5; ++sweep) {
    bool changed = false;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      SymmetricSums others{sums.lx - w * x[i] * levels[i], 0};
      if (!(others.lx > 0)) continue;
      others.l2 = sums.l2 - w * levels[i] * levels[i];
      const int l = clamp_int(nearest_int(x[i] * others.l2 / others.lx), -half, half - 1);
      if (l == levels[i]) continue;
      const SymmetricSums moved{others.lx + w * x[i] * l, others.l2 + w * l * l};
      if (moved.l2 > 0 && moved.lx * moved.lx * sums.l2 > sums.lx * sums.lx * moved.l2) {
        levels[i] = l;
        sums = moved;
        changed = true;
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(levels[i] + half);
  return sums.l2 > 0.0f ? sums.lx / sums.l2 : 0.0f;
}

void reround_symmetric(int n, int half, const float* x, float scale, int8_t* q) {
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(clamp_int(nearest_int(x[i] / scale), -half, half - 1) + half);
}

// ---------------------------------------------------------------- scale stages

// The Q4_K/Q5_K scale stage: sub-block scales and mins (8 each, all >= 0) become 6-bit
// multiples of d = max_scale/63 and dmin = max_min/63, packed as kernels/quant.h
// describes. The rounded values pass through a uint8_t before the clamp to 63, as in
// ggml (the largest maps to exactly 63, so the clamp only catches rounding).
void pack_scales_and_mins_k4(const float* scales, const float* mins, uint8_t* packed, uint16_t* d,
                             uint16_t* dmin) {
  const float max_scale = largest_positive(8, scales);
  const float max_min = largest_positive(8, mins);
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, K_SCALE_SIZE);
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(static_cast<uint8_t>(nearest_int(inv_scale * scales[j])), 63);
    const uint8_t lm = std::min<uint8_t>(static_cast<uint8_t>(nearest_int(inv_min * mins[j])), 63);
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

// Q4_K/Q5_K: fits the 8 sub-blocks of 32 and returns the final levels (0..qmax) in q.
void quantize_super_block_k4(const float* x, const AffineSearch& search, uint8_t* q, uint8_t* packed, uint16_t* d,
                             uint16_t* dmin) {
  float scales[8], mins[8], weights[32];
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weights: |x| plus the sub-block's RMS, so large values matter more but small ones
    // are not ignored.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_affine(32, search, xs, weights, q + 32 * j, &mins[j]);
  }
  pack_scales_and_mins_k4(scales, mins, packed, d, dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(packed, j, &sc, &m);
    const float scale = fp16_to_f32(*d) * sc;
    if (scale) reround_affine(32, search.qmax, x + 32 * j, scale, fp16_to_f32(*dmin) * m, q + 32 * j);
  }
}

}  // namespace kfit

using namespace kfit;

void quantize_row_q2_K(const float* x, block_q2_K* y, size_t n) {
  constexpr float kScaleLevels = 15.0f;  // 4-bit sub-block scales and mins
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    float weights[16], scales[16], mins[16];
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_affine(16, kQ2Search, x + 16 * j, weights, q + 16 * j, &mins[j]);
    }
    const float max_scale = largest_positive(16, scales);
    const float max_min = largest_positive(16, mins);
    // Scales in the low nibble, mins in the high one; the int results are stored into the
    // byte as ggml stores them (truncating).
    const float inv_scale = max_scale > 0 ? kScaleLevels / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? kScaleLevels / max_min : 0.0f;
    for (int j = 0; j < 16; ++j) {
      const int sc = max_scale > 0 ? nearest_int(inv_scale * scales[j]) : 0;
      const int m = max_min > 0 ? nearest_int(inv_min * mins[j]) : 0;
      y[i].scales[j] = static_cast<uint8_t>(static_cast<uint8_t>(sc) | m << 4);
    }
    y[i].d = f32_to_fp16(max_scale > 0 ? max_scale / kScaleLevels : 0.0f);
    y[i].dmin = f32_to_fp16(max_min > 0 ? max_min / kScaleLevels : 0.0f);
    const float d = fp16_to_f32(y[i].d), dmin = fp16_to_f32(y[i].dmin);
    for (int j = 0; j < 16; ++j) {
      const float scale = d * (y[i].scales[j] & 0x0F);
      if (scale) reround_affine(16, 3, x + 16 * j, scale, dmin * (y[i].scales[j] >> 4), q + 16 * j);
    }
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[low2_byte(e)] |= static_cast<uint8_t>(q[e] << low2_shift(e));
  }
}

void kfit::reround_and_pack_q3_K(const float* x, int8_t* q, block_q3_K& y) {
  const float d = fp16_to_f32(y.d);
  for (int j = 0; j < 16; ++j) {
    const int low4 = j < 8 ? y.scales[j] & 0x0F : y.scales[j - 8] >> 4;
    const int high2 = (y.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float scale = d * static_cast<int8_t>((low4 | high2 << 4) - 32);
    if (scale) reround_symmetric(16, 4, x + 16 * j, scale, q + 16 * j);
  }
  // q is 0..7 here: bit 2 goes to hmask, the low 2 bits to qs.
  std::memset(y.hmask, 0, sizeof y.hmask);
  std::memset(y.qs, 0, sizeof y.qs);
  for (size_t e = 0; e < QK_K; ++e) {
    if (q[e] > 3) y.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    y.qs[low2_byte(e)] |= static_cast<uint8_t>((q[e] & 3) << low2_shift(e));
  }
}

void quantize_row_q3_K(const float* x, block_q3_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t q[QK_K];
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = fit_symmetric_by_descent(16, 4, x + 16 * j, q + 16 * j);
    // 6-bit signed sub-block scales (-32..31, stored + 32) against d = largest / -32.
    const float largest = signed_largest(16, scales);
    std::memset(y[i].scales, 0, K_SCALE_SIZE);
    if (largest) {
      const float inv_scale = -32.0f / largest;
      for (int j = 0; j < 16; ++j) {
        const int8_t rounded = static_cast<int8_t>(nearest_int(inv_scale * scales[j]));
        const int sc = clamp_int(rounded, -32, 31) + 32;
        y[i].scales[j % 8] |= static_cast<uint8_t>((sc & 0x0F) << (j < 8 ? 0 : 4));
        y[i].scales[8 + j % 4] |= static_cast<uint8_t>((sc >> 4) << (2 * (j / 4)));
      }
      y[i].d = f32_to_fp16(1 / inv_scale);
    } else {
      y[i].d = f32_to_fp16(0.0f);
    }
    reround_and_pack_q3_K(x, q, y[i]);
  }
}

void quantize_row_q4_K(const float* x, block_q4_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    quantize_super_block_k4(x, kQ4Search, q, y[i].scales, &y[i].d, &y[i].dmin);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>(q[e] << nibble_shift(e));
  }
}

void quantize_row_q5_K(const float* x, block_q5_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    quantize_super_block_k4(x, kQ5Search, q, y[i].scales, &y[i].d, &y[i].dmin);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (size_t e = 0; e < QK_K; ++e) {
      y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>((q[e] & 0x0F) << nibble_shift(e));
      if (q[e] > 15) y[i].qh[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
  }
}

void quantize_row_q6_K(const float* x, block_q6_K* y, size_t n) { kfit::quantize_q6_K_blocks(x, y, n, nullptr); }

// ggml's weighted Q6_K differs from the reference only in the fit's weights: the
// importance itself (of one row) instead of x^2.
void kfit::quantize_q6_K_blocks(const float* x, block_q6_K* y, size_t n, const float* importance) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    int8_t q[QK_K];
    float scales[16];
    for (int j = 0; j < 16; ++j)
      scales[j] = fit_symmetric(16, 32, x + 16 * j, importance ? importance + QK_K * i + 16 * j : nullptr, q + 16 * j);
    const float largest = signed_largest(16, scales);
    if (std::fabs(largest) < kZeroGroup) {  // nothing to encode: an all-zero block
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // int8 sub-block scales against d = largest / -128; the opposite extreme would be
    // +128 and clamps to 127.
    const float inv_scale = -128.0f / largest;
    y[i].d = f32_to_fp16(1 / inv_scale);
    for (int j = 0; j < 16; ++j)
      y[i].scales[j] = static_cast<int8_t>(std::min(nearest_int(inv_scale * scales[j]), 127));
    const float d = fp16_to_f32(y[i].d);
    for (int j = 0; j < 16; ++j) {
      const float scale = d * y[i].scales[j];
      if (scale) reround_symmetric(16, 32, x + 16 * j, scale, q + 16 * j);
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
