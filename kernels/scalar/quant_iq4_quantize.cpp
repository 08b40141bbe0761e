// Reference quantizers of IQ4_NL, IQ4_XS (4-bit indices into the 16 non-uniform values
// kIq4nlValues) and the ternary TQ1_0, TQ2_0, bit-exact with ggml (ggml_quantize_chunk's
// bytes, which are llama-quantize's).
//
// IQ4: each group of 32 gets the scale d whose grid d * kIq4nlValues fits it best in
// weighted least squares: the values are snapped to the grid for 15 trial scales around
// the one that maps the group's largest magnitude onto the grid's end (-127), and the
// least-squares scale of the best snapping wins. IQ4_NL stores that scale as fp16 per
// group; IQ4_XS stores 6-bit multiples of one fp16 scale per 256. The values are then
// snapped again against the scale they will be decoded with (unrounded, as ggml does).
// Weights: importance[j] * sqrt(sigma^2 + x_j^2) (sigma^2: twice the mean square of the
// super-block), or x_j^2 without importance.
//
// TQ: values rounded to {-1, 0, 1} times the block's largest magnitude.
#include <cmath>
#include <cstring>

#include "kernels/quant_iq.h"
#include "kernels/scalar/quant_k_fit.h"

namespace kiln::kernels::ref {
namespace {

using kfit::nearest_int;

// Trial scales on each side of the starting one (ggml's ntry).
constexpr int kIq4Tries = 7;
constexpr int kIq4Group = 32;

// The index of the grid value nearest x (a tie goes to the upper one), as ggml's
// best_index_int8: bisection over the sorted table.
int nearest_iq4_index(float x) {
  const int8_t* v = kIq4nlValues;
  if (x <= v[0]) return 0;
  if (x >= v[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < v[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

// The best scale of one group of 32 (0 for an all-zero group). The indices of the winning
// fit are not kept: every caller snaps the group again against the scale it stores.
float fit_iq4_group(const float* x, const float* w) {
  float amax = 0, max = 0;
  for (int j = 0; j < kIq4Group; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < kfit::kZeroGroup) return 0.0f;
  const int8_t* v = kIq4nlValues;
  float inv_scale = 1 / (-max / v[0]);
  float sum_qx = 0, sum_q2 = 0;
  for (int j = 0; j < kIq4Group; ++j) {
    const float q = v[nearest_iq4_index(inv_scale * x[j])];
    sum_qx += w[j] * q * x[j];
    sum_q2 += w[j] * q * q;
  }
  float d = sum_q2 > 0 ? sum_qx / sum_q2 : 0.0f;
  float best = d * sum_qx;
  for (int t = -kIq4Tries; t <= kIq4Tries; ++t) {
    inv_scale = (t + v[0]) / max;
    sum_qx = sum_q2 = 0;
    for (int j = 0; j < kIq4Group; ++j) {
      const float q = v[nearest_iq4_index(inv_scale * x[j])];
      sum_qx += w[j] * q * x[j];
      sum_q2 += w[j] * q * q;
    }
    // The fit with the most explained energy sum_qx^2 / sum_q2 wins, compared without
    // dividing; a tie keeps the earlier one.
    if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
      d = sum_qx / sum_q2;
      best = d * sum_qx;
    }
  }
  return d;
}

// Fits the n / 32 groups of one super-block (n = 32 for IQ4_NL, 256 for IQ4_XS) into
// scales; importance: n weights or nullptr.
void fit_iq4_groups(const float* x, int n, const float* importance, float* scales) {
  float sigma2 = 0;
  for (int j = 0; j < n; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.f / n;
  float w[kIq4Group];
  for (int g = 0; g < n / kIq4Group; ++g) {
    const float* xg = x + kIq4Group * g;
    for (int j = 0; j < kIq4Group; ++j)
      w[j] = importance ? importance[kIq4Group * g + j] * std::sqrt(sigma2 + xg[j] * xg[j]) : xg[j] * xg[j];
    scales[g] = fit_iq4_group(xg, w);
  }
}

void snap_iq4(const float* x, int n, float inv_scale, uint8_t* L) {
  for (int j = 0; j < n; ++j) L[j] = static_cast<uint8_t>(nearest_iq4_index(inv_scale * x[j]));
}

// Nibbles as Q4_0: element j of a group in the low nibble of qs[j], j + 16 in the high one.
void pack_iq4(const uint8_t* L, int n, uint8_t* qs) {
  for (int g = 0; g < n / kIq4Group; ++g)
    for (int j = 0; j < 16; ++j) qs[16 * g + j] = static_cast<uint8_t>(L[32 * g + j] | L[32 * g + 16 + j] << 4);
}

void iq4_nl_block(const float* x, block_iq4_nl& y, const float* importance) {
  float scale;
  uint8_t L[kIq4Group];
  fit_iq4_groups(x, kIq4Group, importance, &scale);
  y.d = f32_to_fp16(scale);
  snap_iq4(x, kIq4Group, scale ? 1 / scale : 0.0f, L);
  pack_iq4(L, kIq4Group, y.qs);
}

// The 8 group scales become levels -32..31 of d = -(largest by magnitude) / 32.
void iq4_xs_block(const float* x, block_iq4_xs& y, const float* importance) {
  float scales[QK_K / kIq4Group];
  uint8_t L[QK_K];
  fit_iq4_groups(x, int(QK_K), importance, scales);
  float largest = 0, amax = 0;
  for (float s : scales) {
    if (std::fabs(s) > amax) {
      amax = std::fabs(s);
      largest = s;
    }
  }
  const float d = -largest / 32;
  y.d = f32_to_fp16(d);
  const float inv_d = d ? 1 / d : 0.0f;
  y.scales_h = 0;
  for (int g = 0; g < int(QK_K) / kIq4Group; ++g) {
    const int l = kfit::clamp_int(nearest_int(inv_d * scales[g]), -32, 31);
    const float dl = d * l;
    snap_iq4(x + kIq4Group * g, kIq4Group, dl ? 1 / dl : 0.0f, L + kIq4Group * g);
    const int stored = l + 32;
    if (g % 2 == 0) {
      y.scales_l[g / 2] = static_cast<uint8_t>(stored & 0x0F);
    } else {
      y.scales_l[g / 2] |= static_cast<uint8_t>((stored & 0x0F) << 4);
    }
    y.scales_h |= static_cast<uint16_t>((stored >> 4) << (2 * g));
  }
  pack_iq4(L, int(QK_K), y.qs);
}

// x / amax rounded half away from zero to -1, 0, 1, as the digit 0, 1, 2.
uint8_t trit(float x, float inv_amax) { return static_cast<uint8_t>(std::lround(x * inv_amax) + 1); }

// Digits (first most significant) as the base-3 fraction value / 243, rounded up to 8
// bits, so that a digit is recovered by multiplying by 3 and taking the top bits.
uint8_t pack_trits(uint8_t value) { return static_cast<uint8_t>((uint16_t(value) * 256 + 242) / 243); }

float largest_magnitude(const float* x) {
  float amax = 0;
  for (size_t j = 0; j < QK_K; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  return amax;
}

}  // namespace

void quantize_row_iq4_nl(const float* x, block_iq4_nl* y, size_t n) {
  for (size_t i = 0; i < n / QK4_NL; ++i) iq4_nl_block(x + QK4_NL * i, y[i], nullptr);
}

void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) iq4_xs_block(x + QK_K * i, y[i], nullptr);
}

void quantize_iq4_nl(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto* y = static_cast<block_iq4_nl*>(dst);
  for (size_t r = 0; r < n_rows; ++r, src += n_per_row)
    for (size_t i = 0; i < n_per_row / QK4_NL; ++i, ++y)
      iq4_nl_block(src + QK4_NL * i, *y, importance ? importance + QK4_NL * i : nullptr);
}

void quantize_iq4_xs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto* y = static_cast<block_iq4_xs*>(dst);
  for (size_t r = 0; r < n_rows; ++r, src += n_per_row)
    for (size_t i = 0; i < n_per_row / QK_K; ++i, ++y)
      iq4_xs_block(src + QK_K * i, *y, importance ? importance + QK_K * i : nullptr);
}

// 5 digits per byte: element m + 32n (n < 5) of the first 160 in qs[m] (m < 32), element
// 160 + m + 16n in qs[32 + m] (m < 16); then 4 per byte: element 240 + j + 4n in qh[j],
// shifted up one digit so all bytes decode alike.
void quantize_row_tq1_0(const float* x, block_tq1_0* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    const float amax = largest_magnitude(x);
    const float inv = amax ? 1.0f / amax : 0.0f;
    y[i].d = f32_to_fp16(amax);
    for (size_t m = 0; m < 32; ++m) {
      uint8_t q = 0;
      for (size_t d = 0; d < 5; ++d) q = static_cast<uint8_t>(q * 3 + trit(x[m + 32 * d], inv));
      y[i].qs[m] = pack_trits(q);
    }
    for (size_t m = 0; m < 16; ++m) {
      uint8_t q = 0;
      for (size_t d = 0; d < 5; ++d) q = static_cast<uint8_t>(q * 3 + trit(x[160 + m + 16 * d], inv));
      y[i].qs[32 + m] = pack_trits(q);
    }
    for (size_t j = 0; j < 4; ++j) {
      uint8_t q = 0;
      for (size_t d = 0; d < 4; ++d) q = static_cast<uint8_t>(q * 3 + trit(x[240 + j + 4 * d], inv));
      y[i].qh[j] = pack_trits(static_cast<uint8_t>(q * 3));
    }
  }
}

// Element 128h + 32l + m (digit 0..2) in bits 2l..2l+1 of qs[32h + m].
void quantize_row_tq2_0(const float* x, block_tq2_0* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    const float amax = largest_magnitude(x);
    const float inv = amax ? 1.0f / amax : 0.0f;
    y[i].d = f32_to_fp16(amax);
    for (size_t h = 0; h < 2; ++h) {
      for (size_t m = 0; m < 32; ++m) {
        uint8_t q = 0;
        for (size_t l = 0; l < 4; ++l) q = static_cast<uint8_t>(q + ((trit(x[128 * h + 32 * l + m], inv) & 3) << (2 * l)));
        y[i].qs[32 * h + m] = q;
      }
    }
  }
}

}  // namespace kiln::kernels::ref
