// Codebook quantizers of the 2-bit i-quants IQ2_XXS, IQ2_XS and IQ2_S: ggml's
// quantize_iq2_xxs / quantize_iq2_xs / quantize_iq2_s, byte for byte.
//
// Each block of 32 (IQ2_XXS) or 16 values is stored as magnitudes, one codebook point per
// 8 (levels 0..2 meaning 1, 3, 5 times the block scale), plus signs. The magnitudes are
// searched for (kernels/scalar/iq_grid_search.h): candidate block scales, each rounding
// the magnitudes onto the levels and snapping every group of 8 to the codebook, keep the
// best weighted least-squares fit. The block scales are then coded as 4-bit odd multiples
// of one fp16 scale per 256 values. Float expressions keep ggml's order throughout.
#include <cstring>

#include "kernels/quant_iq.h"
#include "kernels/scalar/iq_grid_search.h"

namespace kiln::kernels::ref {
namespace {

using iq::GridSearch;

constexpr float kZeroGroup = 1e-15f;     // ggml's GROUP_MAX_EPS
constexpr float kZeroGroupIq2s = 1e-8f;  // ggml's GROUP_MAX_EPS_IQ2_S
constexpr int kTopLevel = 2;             // levels 0..2 (ggml's kMaxQ = 3)
constexpr float kOddTop = 2 * kTopLevel + 1;

float largest(int n, const float* v) {
  float max = v[0];
  for (int i = 1; i < n; ++i) max = iq::larger(max, v[i]);
  return max;
}

// Stores the fp16 super-block scale d = max_scale / 31 times ggml's fudge factor for the
// type (1 where it has none: exact) and returns the inverse the block scales are coded with.
float store_superblock_scale(float max_scale, float fudge, uint16_t* d_field) {
  const float d = max_scale / 31;
  *d_field = f32_to_fp16(d * fudge);
  return 1 / d;
}

// IQ2_XXS: blocks of 32, each 4 codebook indices (bytes), then a 32-bit word of four 7-bit
// even-parity sign sets and the 4-bit scale code on top.
void quantize_block_iq2_xxs(const float* x, const float* importance, block_iq2_xxs* y) {
  const GridSearch& grid = iq::iq2xxs_grid();
  // The search starts from the scale of the unconstrained fit on levels 0..3, and its
  // candidates spread around that fit's reach.
  constexpr iq::ScaleSearch kPlan{6, 0.1f, true, iq::Refit::kAllGroups};
  uint32_t words[2 * QK_K / 32] = {};
  float scales[QK_K / 32];
  float max_scale = 0;
  const float sigma2 = iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < int(QK_K / 32); ++ib) {
    const float* xb = x + 32 * ib;
    float weight[32], sqrt_weight[32], xval[32];
    int8_t levels[32] = {};
    iq::importance_weights(32, xb, importance + 32 * ib, sigma2, weight);
    iq::square_roots(32, weight, sqrt_weight);
    uint8_t signs[4];
    for (int k = 0; k < 4; ++k) signs[k] = iq::fold_signs_even(xb + 8 * k, weight + 8 * k, xval + 8 * k);
    scales[ib] = 0;
    if (largest(32, xval) < kZeroGroup) continue;
    float scale = iq::fit_nonnegative_levels(32, kTopLevel + 2, xval, weight);
    const float reach = scale * (kTopLevel + 1);
    if (reach <= 0) continue;
    scale = iq::search_scale(grid, kPlan, 32, xval, weight, sqrt_weight, reach, scale, levels);
    if (scale < 0) {  // never in practice; ggml flips the signs to keep the stored scale positive
      scale = -scale;
      for (uint8_t& s : signs) s = ~s & 127;
    }
    for (int k = 0; k < 4; ++k) {
      words[2 * ib] |= uint32_t(iq::grid_index(grid, levels + 8 * k)) << (8 * k);
      words[2 * ib + 1] |= uint32_t(signs[k]) << (7 * k);
    }
    scales[ib] = scale;
    max_scale = iq::larger(max_scale, scale);
  }
  y->d = 0;
  if (!max_scale) {
    std::memset(y->qs, 0, sizeof y->qs);
    return;
  }
  const float inverse_d = store_superblock_scale(max_scale, 1, &y->d);
  for (int ib = 0; ib < int(QK_K / 32); ++ib)
    words[2 * ib + 1] |= uint32_t(iq::scale_code(inverse_d, scales[ib], 15)) << 28;
  std::memcpy(y->qs, words, sizeof y->qs);
}

// IQ2_XS: blocks of 16, each two 16-bit words of a 9-bit codebook index and 7 even-parity
// signs; 4-bit scale codes in pairs.
void quantize_block_iq2_xs(const float* x, const float* importance, block_iq2_xs* y) {
  const GridSearch& grid = iq::iq2xs_grid();
  constexpr iq::ScaleSearch kPlan{9, 0.1f, true, iq::Refit::kOffGridGroups};
  uint16_t words[QK_K / 8] = {};
  float scales[QK_K / 16];
  float max_scale = 0;
  std::memset(y->scales, 0, sizeof y->scales);
  const float sigma2 = iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < int(QK_K / 16); ++ib) {
    const float* xb = x + 16 * ib;
    float weight[16], sqrt_weight[16], xval[16];
    int8_t levels[16] = {};
    iq::importance_weights(16, xb, importance + 16 * ib, sigma2, weight);
    iq::square_roots(16, weight, sqrt_weight);
    uint8_t signs[2];
    for (int k = 0; k < 2; ++k) signs[k] = iq::fold_signs_even(xb + 8 * k, weight + 8 * k, xval + 8 * k);
    const float max = largest(16, xval);
    scales[ib] = 0;
    if (max < kZeroGroup) continue;
    float scale = iq::search_scale(grid, kPlan, 16, xval, weight, sqrt_weight, max, max / kOddTop, levels);
    if (scale < 0) {
      scale = -scale;
      for (uint8_t& s : signs) s = ~s & 127;
    }
    for (int k = 0; k < 2; ++k) words[2 * ib + k] = uint16_t(iq::grid_index(grid, levels + 8 * k) | signs[k] << 9);
    scales[ib] = scale;
    max_scale = iq::larger(max_scale, scale);
  }
  y->d = 0;
  if (!max_scale) {
    std::memset(y->qs, 0, sizeof y->qs);
    return;
  }
  const float inverse_d = store_superblock_scale(max_scale, 1, &y->d);
  for (int ib = 0; ib < int(QK_K / 16); ++ib) {
    const int code = iq::scale_code(inverse_d, scales[ib], 15);
    y->scales[ib / 2] |= uint8_t(ib % 2 ? code << 4 : code);
  }
  std::memcpy(y->qs, words, sizeof y->qs);
}

// IQ2_S: blocks of 16, each two 10-bit codebook indices (low bytes in qs, top bits in qh)
// and two full sign bytes (in the second half of qs). Weights without an importance
// vector: sigma2 / 4 + x^2.
void quantize_block_iq2_s(const float* x, const float* importance, block_iq2_s* y) {
  const GridSearch& grid = iq::iq2s_grid();
  constexpr iq::ScaleSearch kPlan{9, 0.1f, true, iq::Refit::kOffGridGroups};
  std::memset(y, 0, sizeof *y);
  float scales[QK_K / 16];
  float max_scale = 0;
  const float sigma2 = 2 * iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < int(QK_K / 16); ++ib) {
    const float* xb = x + 16 * ib;
    float weight[16], sqrt_weight[16], xval[16];
    int8_t levels[16] = {};
    if (importance) {
      iq::importance_weights(16, xb, importance + 16 * ib, sigma2, weight);
    } else {
      for (int i = 0; i < 16; ++i) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
    }
    iq::square_roots(16, weight, sqrt_weight);
    uint8_t signs[2];
    for (int k = 0; k < 2; ++k) signs[k] = iq::fold_signs(xb + 8 * k, xval + 8 * k);
    const float max = largest(16, xval);
    scales[ib] = 0;
    if (max < kZeroGroupIq2s) continue;
    float scale = iq::search_scale(grid, kPlan, 16, xval, weight, sqrt_weight, max, max / kOddTop, levels);
    if (scale < 0) {
      scale = -scale;
      for (uint8_t& s : signs) s = ~s;
    }
    for (int k = 0; k < 2; ++k) {
      const int group = 2 * ib + k, index = iq::grid_index(grid, levels + 8 * k);
      y->qs[group] = uint8_t(index & 255);
      y->qh[group / 4] |= uint8_t((index >> 8) << (2 * (group % 4)));
      y->qs[QK_K / 8 + group] = signs[k];
    }
    scales[ib] = scale;
    max_scale = iq::larger(max_scale, scale);
  }
  // ggml leaves the indices and signs it wrote when every block scale is zero.
  if (!max_scale) return;
  const float inverse_d = store_superblock_scale(max_scale, 0.9875f, &y->d);
  for (int ib = 0; ib < int(QK_K / 16); ++ib) {
    const int code = iq::scale_code(inverse_d, scales[ib], 15);
    y->scales[ib / 2] |= uint8_t(ib % 2 ? code << 4 : code);
  }
}

}  // namespace

void quantize_iq2_xxs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::require_importance("IQ2_XXS", importance);
  iq::quantize_rows("IQ2_XXS", quantize_block_iq2_xxs, src, dst, n_rows, n_per_row, importance);
}

void quantize_iq2_xs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::require_importance("IQ2_XS", importance);
  iq::quantize_rows("IQ2_XS", quantize_block_iq2_xs, src, dst, n_rows, n_per_row, importance);
}

void quantize_iq2_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::quantize_rows("IQ2_S", quantize_block_iq2_s, src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::kernels::ref
