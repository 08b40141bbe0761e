// Codebook quantizers of the 3-bit i-quants IQ3_XXS and IQ3_S: ggml's quantize_iq3_xxs /
// quantize_iq3_s, byte for byte.
//
// Each block of 32 values is stored as magnitudes, one codebook point per 4 (levels 0..7
// meaning 1, 3, ..., 15 times the block scale), plus signs; the magnitudes come from the
// candidate-scale search of kernels/scalar/iq_grid_search.h, and the block scales are
// coded as 4-bit odd multiples of one fp16 scale per 256 values. Without an importance
// vector a value's weight is x^2.
#include <cstring>

#include "kernels/quant_iq.h"
#include "kernels/scalar/iq_grid_search.h"

namespace kiln::kernels::ref {
namespace {

using iq::GridSearch;

constexpr int kBlock = 32;
constexpr int kBlocks = int(QK_K) / kBlock;
constexpr int kTopLevel = 7;  // ggml's kMaxQ = 8
constexpr float kOddTop = 2 * kTopLevel + 1;
constexpr float kZeroGroupIq3xxs = 1e-8f;  // ggml's GROUP_MAX_EPS_IQ3_XXS

struct Block32 {
  float weight[kBlock], sqrt_weight[kBlock], xval[kBlock];
  int8_t levels[kBlock] = {};
  float max = 0;
};

// The block's weights (importance-scaled, or x^2) and their square roots (the searches
// weigh a group's distance to the grid by those).
void weigh_block(const float* xb, const float* importance, float sigma2, Block32& b) {
  if (importance) {
    iq::importance_weights(kBlock, xb, importance, sigma2, b.weight);
  } else {
    for (int i = 0; i < kBlock; ++i) b.weight[i] = xb[i] * xb[i];
  }
  iq::square_roots(kBlock, b.weight, b.sqrt_weight);
}

float largest(const float* v) {
  float max = v[0];
  for (int i = 1; i < kBlock; ++i) max = iq::larger(max, v[i]);
  return max;
}

// IQ3_XXS: 64 bytes of codebook indices (8 per block), then per block a 32-bit word of four
// 7-bit even-parity sign sets with the 4-bit scale code on top.
void quantize_block_iq3_xxs(const float* x, const float* importance, block_iq3_xxs* y) {
  const GridSearch& grid = iq::iq3xxs_grid();
  constexpr iq::ScaleSearch kPlan{15, 0.2f, true, iq::Refit::kOffGridGroups};
  uint8_t indices[QK_K / 4] = {};
  uint32_t words[kBlocks] = {};
  float scales[kBlocks];
  float max_scale = 0;
  const float sigma2 = 2 * iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < kBlocks; ++ib) {
    const float* xb = x + kBlock * ib;
    Block32 b;
    weigh_block(xb, importance ? importance + kBlock * ib : nullptr, sigma2, b);
    uint8_t signs[4];
    for (int k = 0; k < 4; ++k) signs[k] = iq::fold_signs_even(xb + 8 * k, b.weight + 8 * k, b.xval + 8 * k);
    const float max = largest(b.xval);
    scales[ib] = 0;
    if (max < kZeroGroupIq3xxs) continue;
    float scale = iq::search_scale(grid, kPlan, kBlock, b.xval, b.weight, b.sqrt_weight, max, max / kOddTop, b.levels);
    if (scale < 0) {  // never in practice; ggml flips the signs to keep the stored scale positive
      scale = -scale;
      for (uint8_t& s : signs) s = ~s & 127;
    }
    for (int k = 0; k < 8; ++k) indices[8 * ib + k] = uint8_t(iq::grid_index(grid, b.levels + 4 * k));
    words[ib] = uint32_t(signs[0]) | uint32_t(signs[1]) << 7 | uint32_t(signs[2]) << 14 | uint32_t(signs[3]) << 21;
    scales[ib] = scale;
    max_scale = iq::larger(max_scale, scale);
  }
  y->d = 0;
  if (!max_scale) {
    std::memset(y->qs, 0, sizeof y->qs);
    return;
  }
  const float d = max_scale / 31;
  y->d = f32_to_fp16(d * 1.0125f);  // ggml's fudge factor
  const float inverse_d = 1 / d;
  for (int ib = 0; ib < kBlocks; ++ib) words[ib] |= uint32_t(iq::scale_code(inverse_d, scales[ib], 15)) << 28;
  std::memcpy(y->qs, indices, sizeof indices);
  std::memcpy(y->qs + sizeof indices, words, sizeof words);
}

// IQ3_S: per block 8 codebook indices of 9 bits (low bytes in qs, top bits in qh) and 4
// full sign bytes; 4-bit scale codes in pairs.
void quantize_block_iq3_s(const float* x, const float* importance, block_iq3_s* y) {
  const GridSearch& grid = iq::iq3s_grid();
  constexpr iq::ScaleSearch kPlan{9, 0.2f, false, iq::Refit::kAllGroupsIfAnyOffGrid};
  std::memset(y, 0, sizeof *y);
  float scales[kBlocks];
  float max_scale = 0;
  // ggml advances its qs and signs write positions only past the blocks it quantizes, so
  // an all-zero block takes no slots there and the next block's bytes land in its place
  // (qh, indexed by block, does not shift). Kept for the same bytes.
  int written = 0;
  const float sigma2 = 2 * iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < kBlocks; ++ib) {
    const float* xb = x + kBlock * ib;
    Block32 b;
    weigh_block(xb, importance ? importance + kBlock * ib : nullptr, sigma2, b);
    uint8_t signs[4];
    for (int k = 0; k < 4; ++k) signs[k] = iq::fold_signs(xb + 8 * k, b.xval + 8 * k);
    const float max = largest(b.xval);
    scales[ib] = 0;
    if (!max) continue;
    float scale = iq::search_scale(grid, kPlan, kBlock, b.xval, b.weight, b.sqrt_weight, max, max / kOddTop, b.levels);
    if (scale < 0) {
      scale = -scale;
      for (uint8_t& s : signs) s = ~s;
    }
    for (int k = 0; k < 8; ++k) {
      const int index = iq::grid_index(grid, b.levels + 4 * k), group = 8 * ib + k;
      y->qs[8 * written + k] = uint8_t(index & 255);
      y->qh[group / 8] |= uint8_t((index >> 8) << (group % 8));
    }
    std::memcpy(y->signs + 4 * written, signs, 4);
    ++written;
    scales[ib] = scale;
    max_scale = iq::larger(max_scale, scale);
  }
  if (!max_scale) return;
  const float d = max_scale / 31;
  y->d = f32_to_fp16(d * 1.033f);  // ggml's fudge factor
  const float inverse_d = 1 / d;
  for (int ib = 0; ib < kBlocks; ib += 2)
    y->scales[ib / 2] =
        uint8_t(iq::scale_code(inverse_d, scales[ib], 15) | iq::scale_code(inverse_d, scales[ib + 1], 15) << 4);
}

}  // namespace

void quantize_iq3_xxs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::quantize_rows("IQ3_XXS", quantize_block_iq3_xxs, src, dst, n_rows, n_per_row, importance);
}

void quantize_iq3_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::quantize_rows("IQ3_S", quantize_block_iq3_s, src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::kernels::ref
