// ggml's importance-weighted quantizers of the legacy and K types (the quantize_<type>
// that ggml_quantize_chunk calls with an imatrix; without one they are the *_ref bytes
// of quantize_row).
//
// An imatrix holds, per column j, the mean squared activation that multiplies it: an error
// in a heavily used column costs more. ggml turns it into per-value weights
// importance[j] * sqrt(sigma^2 + x_j^2), sigma^2 being the mean square of the row (the
// legacy types, Q2_K) or twice that of the super-block (Q3_K..Q5_K), and runs the same
// scale searches as the reference under those weights. The K types also fit the
// super-block scales to the sub-block scales by weighted least squares (weights: each
// sub-block's total weight) where the reference simply divides by the largest.
//
// Bit-exact with ggml as quant_k_quantize.cpp is: same association of every float
// expression, no fused multiply-adds (-ffp-contract=off), ggml's integer truncations.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kernels/scalar/quant_k_fit.h"

namespace kiln::kernels::ref {
namespace {

using namespace kfit;

// The searches ggml's weighted paths use: 37 grids stretched by 0.05 from -0.9, squared error
// (make_qkx3_quants' settings in every caller).
constexpr AffineSearch weighted_search(int qmax) { return {qmax, -0.9f, 0.05f, 37, false}; }

float sum_of_squares(const float* x, size_t n) {
  float s = 0;
  for (size_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s;
}

// w[j] = importance[j] * sqrt(sigma2 + x[j]^2); returns their sum.
float importance_weights(int n, const float* x, const float* importance, float sigma2, float* w) {
  float sum = 0;
  for (int j = 0; j < n; ++j) {
    w[j] = importance[j] * std::sqrt(sigma2 + x[j] * x[j]);
    sum += w[j];
  }
  return sum;
}

// The super-block scale of n non-negative sub-block values x (scales or mins), each to be
// stored as an integer 0..nmax times it (ggml's make_qp_quants): tries the plain grid
// nmax / max(x) and 8 stretched ones by weighted squared error, then moves single levels
// by coordinate descent as Q3_K's reference fit does, and returns the least-squares scale
// of the final levels L. Levels are kept in bytes as ggml keeps them (a negative one
// wraps).
float fit_level_scale(int n, int nmax, const float* x, const float* w, uint8_t* L) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
  if (max < kZeroGroup) {
    std::memset(L, 0, size_t(n));
    return 0.0f;
  }
  float inv_scale = nmax / max;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest_int(inv_scale * x[i]));
  const float scale = 1 / inv_scale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * L[i];
    best_error += w[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float inv_trial = (0.1f * is + nmax) / max;
    const float trial = 1 / inv_trial;
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(inv_trial * x[i]));
      const float diff = x[i] - trial * l;
      error += w[i] * diff * diff;
    }
    if (error < best_error) {
      best_error = error;
      inv_scale = inv_trial;
    }
  }
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(inv_scale * x[i]));
    L[i] = static_cast<uint8_t>(l);
    sum_lx += w[i] * x[i] * l;
    sum_l2 += w[i] * l * l;
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    bool changed = false;
    for (int i = 0; i < n; ++i) {
      float lx = sum_lx - w[i] * x[i] * L[i];
      float l2 = sum_l2 - w[i] * L[i] * L[i];
      if (!(lx > 0 && l2 > 0)) continue;
      const int l = std::min(nmax, nearest_int(x[i] * l2 / lx));
      if (l == L[i]) continue;
      lx += w[i] * x[i] * l;
      l2 += w[i] * l * l;
      if (lx * lx * sum_l2 > sum_lx * sum_lx * l2) {
        L[i] = static_cast<uint8_t>(l);
        sum_lx = lx;
        sum_l2 = l2;
        changed = true;
      }
    }
    if (!changed) break;
  }
  return sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
}

// ---------------------------------------------------------------- legacy types

// Bit 4 of each 5-bit quant into a little-endian uint32 (element j -> bit j).
void store_high_bits(const uint8_t* q, uint8_t qh[4]) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= uint32_t(q[j] >> 4 & 1) << j;
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<uint8_t>(bits >> (8 * b));
}

void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

// One row of a legacy type: weights from the row's mean square, then fit(values, weights,
// block) per block of 32.
template <class Block, class Fit>
void legacy_row(const float* x, Block* y, size_t n_per_row, const float* importance, const Fit& fit) {
  const float sigma2 = sum_of_squares(x, n_per_row) / float(n_per_row);
  float w[QK];
  for (size_t ib = 0; ib < n_per_row / QK; ++ib) {
    importance_weights(int(QK), x + QK * ib, importance + QK * ib, sigma2, w);
    fit(x + QK * ib, w, y[ib]);
  }
}

// Symmetric legacy types (Q4_0: half 8, Q5_0: half 16): q = l + half.
template <class Block>
void symmetric_legacy_row(const float* x, Block* y, size_t n_per_row, const float* importance, int half) {
  legacy_row(x, y, n_per_row, importance, [half](const float* xb, const float* w, Block& b) {
    int8_t levels[QK];
    b.d = f32_to_fp16(fit_symmetric(int(QK), half, xb, w, levels));
    const uint8_t* q = reinterpret_cast<const uint8_t*>(levels);
    pack_nibbles(q, b.qs);
    if constexpr (std::is_same_v<Block, block_q5_0>) store_high_bits(q, b.qh);
  });
}

// Affine legacy types (Q4_1: qmax 15, Q5_1: 31): x ~ d * q + m.
template <class Block>
void affine_legacy_row(const float* x, Block* y, size_t n_per_row, const float* importance, int qmax) {
  legacy_row(x, y, n_per_row, importance, [qmax](const float* xb, const float* w, Block& b) {
    uint8_t q[QK];
    float neg_offset;
    b.d = f32_to_fp16(fit_affine(int(QK), weighted_search(qmax), xb, w, q, &neg_offset));
    b.m = f32_to_fp16(-neg_offset);
    pack_nibbles(q, b.qs);
    if constexpr (std::is_same_v<Block, block_q5_1>) store_high_bits(q, b.qh);
  });
}

// ---------------------------------------------------------------- K types

// Q2_K: 16 sub-blocks of 16, 4-bit scales and mins; sigma^2 is the plain mean square.
void q2_K_row(const float* x, block_q2_K* y, size_t n_per_row, const float* importance) {
  for (size_t i = 0; i < n_per_row / QK_K; ++i, x += QK_K) {
    const float sigma2 = sum_of_squares(x, QK_K) / float(QK_K);
    uint8_t q[QK_K], ls[16], lm[16];
    float scales[16], mins[16], sw[16], w[16];
    for (int j = 0; j < 16; ++j) {
      sw[j] = importance_weights(16, x + 16 * j, importance + QK_K * i + 16 * j, sigma2, w);
      scales[j] = fit_affine(16, weighted_search(3), x + 16 * j, w, q + 16 * j, &mins[j]);
    }
    y[i].d = f32_to_fp16(fit_level_scale(16, 15, scales, sw, ls));
    y[i].dmin = f32_to_fp16(fit_level_scale(16, 15, mins, sw, lm));
    const float d = fp16_to_f32(y[i].d), dmin = fp16_to_f32(y[i].dmin);
    for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(ls[j] | lm[j] << 4);
    for (int j = 0; j < 16; ++j) {
      const float scale = d * (y[i].scales[j] & 0x0F);
      if (scale) reround_affine(16, 3, x + 16 * j, scale, dmin * (y[i].scales[j] >> 4), q + 16 * j);
    }
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[low2_byte(e)] |= static_cast<uint8_t>(q[e] << low2_shift(e));
  }
}

// Q3_K: 16 symmetric sub-blocks of 16 (levels -4..3), 6-bit signed scales fitted as
// levels -32..31 of the super-block scale.
void q3_K_row(const float* x, block_q3_K* y, size_t n_per_row, const float* importance) {
  for (size_t i = 0; i < n_per_row / QK_K; ++i, x += QK_K) {
    const float sigma2 = 2 * sum_of_squares(x, QK_K) / float(QK_K);
    int8_t q[QK_K], ls[16];
    float scales[16], sw[16], w[16];
    for (int j = 0; j < 16; ++j) {
      sw[j] = importance_weights(16, x + 16 * j, importance + QK_K * i + 16 * j, sigma2, w);
      scales[j] = fit_symmetric(16, 4, x + 16 * j, w, q + 16 * j);
    }
    const float d_block = fit_symmetric(16, 32, scales, sw, ls);
    std::memset(y[i].scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < 16; ++j) {
      const int l = ls[j];
      y[i].scales[j % 8] |= static_cast<uint8_t>((l & 0x0F) << (j < 8 ? 0 : 4));
      y[i].scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    y[i].d = f32_to_fp16(d_block);
    reround_and_pack_q3_K(x, q, y[i]);
  }
}

// Q4_K/Q5_K: 8 affine sub-blocks of 32 (levels 0..qmax) whose scales and mins become
// levels 0..63 of two fitted super-block scales. Q5_K clamps those levels to 63 before
// packing, Q4_K (as in ggml) does not.
template <class Block>
void k4_super_block(const float* x, Block& y, const float* importance, int qmax, uint8_t* q) {
  const float sigma2 = 2 * sum_of_squares(x, QK_K) / float(QK_K);
  uint8_t ls[8], lm[8];
  float scales[8], mins[8], sw[8], w[32];
  for (int j = 0; j < 8; ++j) {
    sw[j] = importance_weights(32, x + 32 * j, importance + 32 * j, sigma2, w);
    scales[j] = fit_affine(32, weighted_search(qmax), x + 32 * j, w, q + 32 * j, &mins[j]);
  }
  const float d_block = fit_level_scale(8, 63, scales, sw, ls);
  const float m_block = fit_level_scale(8, 63, mins, sw, lm);
  for (int j = 0; j < 8; ++j) {
    uint8_t s = ls[j], m = lm[j];
    if (qmax == 31) {
      s = std::min<uint8_t>(63, s);
      m = std::min<uint8_t>(63, m);
    }
    if (j < 4) {
      y.scales[j] = s;
      y.scales[j + 4] = m;
    } else {  // low 4 bits in bytes 8..11, top 2 bits in bits 6..7 of bytes 0..7
      y.scales[j + 4] = static_cast<uint8_t>((s & 0x0F) | (m & 0x0F) << 4);
      y.scales[j - 4] |= static_cast<uint8_t>((s >> 4) << 6);
      y.scales[j] |= static_cast<uint8_t>((m >> 4) << 6);
    }
  }
  y.d = f32_to_fp16(d_block);
  y.dmin = f32_to_fp16(m_block);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(y.scales, j, &sc, &m);
    const float scale = fp16_to_f32(y.d) * sc;
    if (scale) reround_affine(32, qmax, x + 32 * j, scale, fp16_to_f32(y.dmin) * m, q + 32 * j);
  }
}

void q4_K_row(const float* x, block_q4_K* y, size_t n_per_row, const float* importance) {
  for (size_t i = 0; i < n_per_row / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    k4_super_block(x, y[i], importance + QK_K * i, 15, q);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (size_t e = 0; e < QK_K; ++e) y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>(q[e] << nibble_shift(e));
  }
}

void q5_K_row(const float* x, block_q5_K* y, size_t n_per_row, const float* importance) {
  for (size_t i = 0; i < n_per_row / QK_K; ++i, x += QK_K) {
    uint8_t q[QK_K];
    k4_super_block(x, y[i], importance + QK_K * i, 31, q);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (size_t e = 0; e < QK_K; ++e) {
      y[i].qs[nibble_byte(e)] |= static_cast<uint8_t>((q[e] & 0x0F) << nibble_shift(e));
      if (q[e] > 15) y[i].qh[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
  }
}

void q6_K_row(const float* x, block_q6_K* y, size_t n_per_row, const float* importance) {
  quantize_q6_K_blocks(x, y, n_per_row, importance);
}

// ggml_quantize_chunk's shape for these types: without importance the whole chunk through
// the reference; with it row by row, the weights restarting at each row.
template <class Block, size_t kBlockSize, class Row>
void by_rows(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance, const Row& row,
             void (*ref_row)(const float*, Block*, size_t)) {
  Block* y = static_cast<Block*>(dst);
  if (!importance) return ref_row(src, y, n_rows * n_per_row);
  for (size_t r = 0; r < n_rows; ++r) row(src + r * n_per_row, y + r * (n_per_row / kBlockSize), n_per_row, importance);
}

}  // namespace

void quantize_q4_0(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto row = [](const float* x, block_q4_0* y, size_t n, const float* imp) { symmetric_legacy_row(x, y, n, imp, 8); };
  by_rows<block_q4_0, QK>(src, dst, n_rows, n_per_row, importance, row, quantize_row_q4_0);
}
void quantize_q5_0(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto row = [](const float* x, block_q5_0* y, size_t n, const float* imp) { symmetric_legacy_row(x, y, n, imp, 16); };
  by_rows<block_q5_0, QK>(src, dst, n_rows, n_per_row, importance, row, quantize_row_q5_0);
}
void quantize_q4_1(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto row = [](const float* x, block_q4_1* y, size_t n, const float* imp) { affine_legacy_row(x, y, n, imp, 15); };
  by_rows<block_q4_1, QK>(src, dst, n_rows, n_per_row, importance, row, quantize_row_q4_1);
}
void quantize_q5_1(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  auto row = [](const float* x, block_q5_1* y, size_t n, const float* imp) { affine_legacy_row(x, y, n, imp, 31); };
  by_rows<block_q5_1, QK>(src, dst, n_rows, n_per_row, importance, row, quantize_row_q5_1);
}
void quantize_q2_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  by_rows<block_q2_K, QK_K>(src, dst, n_rows, n_per_row, importance, q2_K_row, quantize_row_q2_K);
}
void quantize_q3_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  by_rows<block_q3_K, QK_K>(src, dst, n_rows, n_per_row, importance, q3_K_row, quantize_row_q3_K);
}
void quantize_q4_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  by_rows<block_q4_K, QK_K>(src, dst, n_rows, n_per_row, importance, q4_K_row, quantize_row_q4_K);
}
void quantize_q5_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  by_rows<block_q5_K, QK_K>(src, dst, n_rows, n_per_row, importance, q5_K_row, quantize_row_q5_K);
}
void quantize_q6_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  by_rows<block_q6_K, QK_K>(src, dst, n_rows, n_per_row, importance, q6_K_row, quantize_row_q6_K);
}

}  // namespace kiln::kernels::ref
