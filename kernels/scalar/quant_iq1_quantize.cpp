// Codebook quantizers of the 1.5-bit i-quants IQ1_S and IQ1_M: ggml's quantize_iq1_s /
// quantize_iq1_m, byte for byte.
//
// A value is one of -1, 0, 1 plus a shared shift delta = +-1/8, times the block scale. With
// three levels the best weighted least-squares split of a block can be found exactly: sort
// the values, and every pair of cut points (i1, i2) puts the smallest i1 on -1, the next on
// 0, the rest on 1. Each group of 8 is then snapped onto the 2048-point codebook (its
// nearest candidates, kernels/scalar/iq_grid_search.h). IQ1_S has blocks of 32 with one
// shift each; IQ1_M blocks of 16 with a shift per group of 8, and refits its fp16
// super-block scale to the 3-bit block scale codes at the end.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/quant_iq.h"
#include "kernels/scalar/iq_grid_search.h"

namespace kiln::kernels::ref {
namespace {

using iq::GridSearch;

// The values levels 0, 1, 2 stand for under each shift.
constexpr float kUp[3] = {-1 + kIq1Delta, kIq1Delta, 1 + kIq1Delta};
constexpr float kDown[3] = {-1 - kIq1Delta, -kIq1Delta, 1 - kIq1Delta};

constexpr float kZeroGroupIq1s = 1e-12f;  // ggml's GROUP_MAX_EPS_IQ1_S
constexpr float kZeroGroupIq1m = 1e-7f;   // ggml's GROUP_MAX_EPS_IQ1_M

float largest_magnitude(int n, const float* x) {
  float max = std::fabs(x[0]);
  for (int i = 1; i < n; ++i) max = iq::larger(max, std::fabs(x[i]));
  return max;
}

// Indices of x in ascending order of value. ggml sorts (value, index) pairs by value only
// with glibc's qsort, a merge sort for arrays this small: stable, so equal values stay in
// index order.
void sort_by_value(int n, const float* x, int* order) {
  std::iota(order, order + n, 0);
  std::stable_sort(order, order + n, [x](int a, int b) { return x[a] < x[b]; });
}

// Levels from a split: the first i1 of the sorted order on 0, up to i2 on 1, the rest on 2.
void levels_from_split(int n, const int* order, int i1, int i2, int8_t* levels) {
  for (int j = 0; j < n; ++j) levels[order[j]] = int8_t(j < i1 ? 0 : j < i2 ? 1 : 2);
}

// One group's codebook index. Off the grid, the candidate nearest x at `scale` (squared
// error weighted by `weight`) with level values `value`.
int snap_group(const GridSearch& grid, const int8_t* levels, const float* x, const float* weight, float scale,
               const float* value, bool* on_grid) {
  const int key = grid.key(levels);
  if (grid.point_at(key) >= 0) return grid.point_at(key);
  *on_grid = false;
  float best_error = FLT_MAX;
  // ggml aborts when no candidate's error is below FLT_MAX (non-finite input); the nearest
  // point by level distance stands in here.
  int best = grid.nearest(key)[0];
  for (const uint16_t p : grid.nearest(key)) {
    float error = 0;
    for (int i = 0; i < 8; ++i) {
      const float diff = scale * value[grid.levels(p)[i]] - x[i];
      error += weight[i] * diff * diff;
    }
    if (error < best_error) {
      best_error = error;
      best = p;
    }
  }
  return best;
}

// Adds a group's least-squares sums for codebook point `point` with level values `value`
// (each times `multiple`, IQ1_M's final refit).
void add_group_fit(const GridSearch& grid, int point, const float* x, const float* weight, const float* value,
                   float multiple, float* sumqx, float* sumq2) {
  for (int j = 0; j < 8; ++j) {
    const float q = value[grid.levels(point)[j]] * multiple;
    *sumqx += weight[j] * q * x[j];
    *sumq2 += weight[j] * q * q;
  }
}

// ---------------------------------------------------------------- IQ1_S

constexpr int kBlockS = 32;

struct SplitS {
  float scale;
  int i1 = -1, i2 = -1, shift = 0;  // shift +1: kUp, -1: kDown
};

// The exact search of IQ1_S: prefix sums over the sorted values make each split's sums
// three differences.
SplitS best_split_iq1_s(const float* xb, const float* weight, const int* order, float max) {
  float sumx[kBlockS + 1], sumw[kBlockS + 1];
  sumx[0] = sumw[0] = 0;
  for (int j = 0; j < kBlockS; ++j) {
    const int i = order[j];
    sumx[j + 1] = sumx[j] + weight[i] * xb[i];
    sumw[j + 1] = sumw[j] + weight[i];
  }
  SplitS best{max};
  float best_score = -FLT_MAX;
  for (int i1 = 0; i1 <= kBlockS; ++i1) {
    for (int i2 = i1; i2 <= kBlockS; ++i2) {
      for (const int shift : {1, -1}) {
        const float* v = shift == 1 ? kUp : kDown;
        const float sumqx =
            (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[kBlockS] - sumx[i2]) * v[2];
        const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                            (sumw[kBlockS] - sumw[i2]) * v[2] * v[2];
        if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
          best.scale = sumqx / sumq2;
          best_score = best.scale * sumqx;
          best.i1 = i1, best.i2 = i2, best.shift = shift;
        }
      }
    }
  }
  return best;
}

void quantize_block_iq1_s(const float* x, const float* importance, block_iq1_s* y) {
  const GridSearch& grid = iq::iq1_grid();
  std::memset(y, 0, sizeof *y);
  float scales[QK_K / kBlockS];
  int shifts[QK_K / kBlockS];
  float max_scale = 0;
  const float sigma2 = 2 * iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < int(QK_K) / kBlockS; ++ib) {
    const float* xb = x + kBlockS * ib;
    float weight[kBlockS];
    iq::importance_weights(kBlockS, xb, importance + kBlockS * ib, sigma2, weight);
    scales[ib] = 0;
    shifts[ib] = 1;
    const float max = largest_magnitude(kBlockS, xb);
    if (max < kZeroGroupIq1s) continue;
    int order[kBlockS];
    sort_by_value(kBlockS, xb, order);
    SplitS split = best_split_iq1_s(xb, weight, order, max);
    if (split.i1 < 0 || split.i2 < 0 || split.shift == 0) continue;
    int8_t levels[kBlockS];
    levels_from_split(kBlockS, order, split.i1, split.i2, levels);
    if (split.scale < 0) {  // mirror: -1 <-> 1 and the shift flips
      for (int8_t& l : levels) l = int8_t(2 - l);
      split.scale = -split.scale;
      split.shift = -split.shift;
    }
    const float* value = split.shift == 1 ? kUp : kDown;
    bool on_grid = true;
    int index[kBlockS / 8];
    for (int k = 0; k < kBlockS / 8; ++k)
      index[k] = snap_group(grid, levels + 8 * k, xb + 8 * k, weight + 8 * k, split.scale, value, &on_grid);
    if (!on_grid) {
      float sumqx = 0, sumq2 = 0;
      for (int k = 0; k < kBlockS / 8; ++k)
        add_group_fit(grid, index[k], xb + 8 * k, weight + 8 * k, value, 1, &sumqx, &sumq2);
      if (sumqx > 0 && sumq2 > 0) split.scale = sumqx / sumq2;
    }
    uint16_t high = 0;
    for (int k = 0; k < kBlockS / 8; ++k) {
      y->qs[(kBlockS / 8) * ib + k] = uint8_t(index[k] & 255);
      high |= uint16_t((index[k] >> 8) << (3 * k));
    }
    y->qh[ib] = high;
    scales[ib] = split.scale;
    shifts[ib] = split.shift;
    max_scale = iq::larger(max_scale, split.scale);
  }
  if (!max_scale) return;
  const float d = max_scale / 15;
  y->d = f32_to_fp16(d * 1.125f);  // ggml's fudge factor
  const float inverse_d = 1 / d;
  for (int ib = 0; ib < int(QK_K) / kBlockS; ++ib) {
    const int code = iq::scale_code(inverse_d, scales[ib], 7) | (shifts[ib] == -1 ? 8 : 0);
    y->qh[ib] |= uint16_t(code << 12);
  }
}

// ---------------------------------------------------------------- IQ1_M

constexpr int kBlockM = 16;

// Shift combination k of an IQ1_M block: bit 1 set = the first group shifted down, bit 0
// set = the second group shifted down. Returns the level values of group `group`.
const float* shift_values(int k, int group) { return (group == 0 ? k < 2 : k % 2 == 0) ? kUp : kDown; }

struct SplitM {
  float scale;
  int i1 = -1, i2 = -1, k = -1;
};

// The exact search of IQ1_M, for all four shift combinations at once. Unlike IQ1_S, ggml
// sums each split from scratch (in sorted order), which rounds differently.
SplitM best_split_iq1_m(const float* xb, const float* weight, const int* order, float max) {
  SplitM best{max};
  float best_score = -FLT_MAX;
  for (int i1 = 0; i1 <= kBlockM; ++i1) {
    for (int i2 = i1; i2 <= kBlockM; ++i2) {
      float sumqx[4] = {}, sumq2[4] = {};
      for (int j = 0; j < kBlockM; ++j) {
        const int i = order[j], level = j < i1 ? 0 : j < i2 ? 1 : 2, group = i < kBlockM / 2 ? 0 : 1;
        for (int k = 0; k < 4; ++k) {
          const float v = shift_values(k, group)[level];
          sumqx[k] += weight[i] * v * xb[i];
          sumq2[k] += weight[i] * v * v;
        }
      }
      for (int k = 0; k < 4; ++k) {
        if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
          best.scale = sumqx[k] / sumq2[k];
          best_score = best.scale * sumqx[k];
          best.i1 = i1, best.i2 = i2, best.k = k;
        }
      }
    }
  }
  return best;
}

void weigh_iq1_m(const float* xb, const float* importance, float sigma2, float* weight) {
  if (importance) {
    iq::importance_weights(kBlockM, xb, importance, sigma2, weight);
  } else {
    for (int i = 0; i < kBlockM; ++i) weight[i] = xb[i] * xb[i];
  }
}

void quantize_block_iq1_m(const float* x, const float* importance, block_iq1_m* y) {
  constexpr int kBlocks = int(QK_K) / kBlockM;
  const GridSearch& grid = iq::iq1_grid();
  std::memset(y, 0, sizeof *y);
  float scales[kBlocks];
  int shifts[kBlocks];
  int indices[kBlocks][2] = {};
  float max_scale = 0;
  const float sigma2 = 2 * iq::superblock_sum_of_squares(x) / float(QK_K);
  for (int ib = 0; ib < kBlocks; ++ib) {
    const float* xb = x + kBlockM * ib;
    float weight[kBlockM];
    weigh_iq1_m(xb, importance ? importance + kBlockM * ib : nullptr, sigma2, weight);
    scales[ib] = 0;
    shifts[ib] = 0;
    const float max = largest_magnitude(kBlockM, xb);
    if (max < kZeroGroupIq1m) continue;
    int order[kBlockM];
    sort_by_value(kBlockM, xb, order);
    SplitM split = best_split_iq1_m(xb, weight, order, max);
    if (split.i1 < 0 || split.i2 < 0 || split.k < 0) continue;
    int8_t levels[kBlockM];
    levels_from_split(kBlockM, order, split.i1, split.i2, levels);
    if (split.scale < 0) {  // mirror: -1 <-> 1 and both shifts flip
      for (int8_t& l : levels) l = int8_t(2 - l);
      split.scale = -split.scale;
      split.k = 3 - split.k;
    }
    bool on_grid = true;
    for (int k = 0; k < 2; ++k)
      indices[ib][k] =
          snap_group(grid, levels + 8 * k, xb + 8 * k, weight + 8 * k, split.scale, shift_values(split.k, k), &on_grid);
    if (!on_grid) {
      float sumqx = 0, sumq2 = 0;
      for (int k = 0; k < 2; ++k)
        add_group_fit(grid, indices[ib][k], xb + 8 * k, weight + 8 * k, shift_values(split.k, k), 1, &sumqx, &sumq2);
      if (sumqx > 0 && sumq2 > 0) split.scale = sumqx / sumq2;
    }
    y->qs[2 * ib] = uint8_t(indices[ib][0] & 255);
    y->qs[2 * ib + 1] = uint8_t(indices[ib][1] & 255);
    y->qh[ib] = uint8_t(indices[ib][0] >> 8 | (indices[ib][1] >> 8) << 4);
    scales[ib] = split.scale;
    shifts[ib] = split.k;
    max_scale = iq::larger(max_scale, split.scale);
  }
  if (!max_scale) return;

  // The block scale codes, the shift bits (bit 3: first group down, bit 7: second), and a
  // least-squares refit of the super-block scale to the codes, over every block (the
  // all-zero ones too, as index 0 with shifts up).
  uint16_t words[4] = {};
  float d = max_scale / 15;
  const float inverse_d = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int ib = 0; ib < kBlocks; ++ib) {
    const int code = iq::scale_code(inverse_d, scales[ib], 7);
    words[ib / 4] |= uint16_t(code << (3 * (ib % 4)));
    y->qh[ib] |= uint8_t((shifts[ib] >= 2 ? 0x08 : 0) | (shifts[ib] % 2 ? 0x80 : 0));
    const float* xb = x + kBlockM * ib;
    float weight[kBlockM];
    weigh_iq1_m(xb, importance ? importance + kBlockM * ib : nullptr, sigma2, weight);
    for (int k = 0; k < 2; ++k)
      add_group_fit(grid, indices[ib][k], xb + 8 * k, weight + 8 * k, shift_values(shifts[ib], k), float(2 * code + 1),
                    &sumqx, &sumq2);
  }
  if (sumq2 > 0) d = sumqx / sumq2;
  // The fp16 scale (times ggml's fudge factor) in the top nibbles of the four words.
  const uint16_t d_bits = f32_to_fp16(d * 1.1125f);
  words[0] |= uint16_t((d_bits & 0x000f) << 12);
  words[1] |= uint16_t((d_bits & 0x00f0) << 8);
  words[2] |= uint16_t((d_bits & 0x0f00) << 4);
  words[3] |= uint16_t(d_bits & 0xf000);
  std::memcpy(y->scales, words, sizeof words);
}

}  // namespace

void quantize_iq1_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::require_importance("IQ1_S", importance);
  iq::quantize_rows("IQ1_S", quantize_block_iq1_s, src, dst, n_rows, n_per_row, importance);
}

void quantize_iq1_m(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  iq::quantize_rows("IQ1_M", quantize_block_iq1_m, src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::kernels::ref
