#pragma once
// What ggml's codebook-search quantizers (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S) share: each codebook (kernels/iq_grids.cpp) seen as lattice points of small
// integer levels, a map from any rounded point to its codebook entry (or, off the grid, to
// the entries nearest it), and the scale search of the IQ2/IQ3 types.
//
// The quantizers must write ggml's bytes, so every float expression keeps ggml's
// association and accumulation order, and the searches break ties as ggml does (first
// candidate wins, strict comparisons). Internal to kernels/scalar (compiled with
// -ffp-contract=off).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/quant.h"

namespace kiln::kernels::ref::iq {

// Round to nearest, ties to even, through the float's mantissa bits: ggml's nearest_int
// (its results outside |x| < 2^22 are garbage, but the same garbage).
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// ggml's MAX(a, b): b unless a is strictly larger.
inline float larger(float a, float b) { return a > b ? a : b; }

// Sum of x[i]^2 over one super-block, in order.
inline float superblock_sum_of_squares(const float* x) {
  float sum = 0;
  for (size_t i = 0; i < QK_K; ++i) sum += x[i] * x[i];
  return sum;
}

// ggml's weights from an importance vector: importance[i] * sqrt(sigma2 + x[i]^2).
inline void importance_weights(int n, const float* x, const float* importance, float sigma2, float* weight) {
  for (int i = 0; i < n; ++i) weight[i] = importance[i] * std::sqrt(sigma2 + x[i] * x[i]);
}
inline void square_roots(int n, const float* x, float* root) {
  for (int i = 0; i < n; ++i) root[i] = std::sqrt(x[i]);
}

// A codebook as points of `dim` levels each (level l of an IQ2/IQ3 point stands for the
// odd multiple 2l+1 of the scale; of an IQ1 point for l-1, shifted by a delta). A point
// rounded level by level is looked up by its key, the levels packed `bits` apiece, element
// 0 lowest (ggml's kmap index).
class GridSearch {
 public:
  // n_distances: an off-grid point's candidates are the codebook points at its
  // n_distances smallest distinct distances (ggml's nwant).
  GridSearch(const uint8_t* levels, int n_points, int dim, int bits, int top_level, int n_distances);

  int dim() const { return dim_; }
  // The highest level a rounded point may have (ggml's kMaxQ - 1).
  int top_level() const { return top_level_; }
  int key(const int8_t* levels) const {
    int k = 0;
    for (int i = 0; i < dim_; ++i) k |= levels[i] << (bits_ * i);
    return k;
  }
  // The codebook index of the point with this key, or -1 when it is not in the codebook.
  int point_at(int key) const { return point_of_key_[key]; }
  // For a key not in the codebook: its candidates, nearest first and, at equal distance,
  // in codebook order (the order of ggml's sorted (distance, index) pairs).
  std::span<const uint16_t> nearest(int key) const {
    const uint32_t first = first_candidate_[key];
    return {candidates_.data() + first + 1, candidates_[first]};
  }
  const uint8_t* levels(int point) const { return &levels_[size_t(point) * dim_]; }

 private:
  int dim_, bits_, top_level_;
  std::vector<uint8_t> levels_;
  std::vector<int32_t> point_of_key_;
  std::vector<uint32_t> first_candidate_;  // into candidates_: a count, then the points
  std::vector<uint16_t> candidates_;
};

// Built on first use (thread-safe), then shared and immutable.
const GridSearch& iq2xxs_grid();
const GridSearch& iq2xs_grid();
const GridSearch& iq2s_grid();
const GridSearch& iq3xxs_grid();
const GridSearch& iq3s_grid();
const GridSearch& iq1_grid();  // IQ1_S and IQ1_M

// Sign handling. Both store |x| in xval and return the sign bits (bit i: x[i] < 0).
// The plain one keeps all 8 signs (IQ2_S, IQ3_S).
uint8_t fold_signs(const float* x, float* xval);
// IQ2_XXS, IQ2_XS, IQ3_XXS store 7 signs: the 8th follows from an even count of negatives.
// With an odd count, the element of least weight * x^2 (the first of equals) keeps its
// sign, i.e. its xval is negative, and its bit is dropped.
uint8_t fold_signs_even(const float* x, const float* weight, float* xval);

// The IQ2/IQ3 scale search over one block of n values (groups of grid.dim()).
enum class Refit {
  kAllGroups,              // IQ2_XXS: re-round every group at the best scale
  kOffGridGroups,          // IQ2_XS, IQ2_S, IQ3_XXS: only groups snapped to a neighbour
  kAllGroupsIfAnyOffGrid,  // IQ3_S
};
// The candidate inverse scales put the block's reach (its largest value, or IQ2_XXS's
// first fit) at the top odd value 2 top_level + 1, nudged by is * step, |is| <= steps.
struct ScaleSearch {
  int steps;
  float step;
  bool assume_on_grid;  // whether the start counts as on the grid when no candidate beats it
  Refit refit;
};
// Tries each candidate inverse scale (rounding xval to levels, snapping each group onto
// the grid), keeps the levels whose weighted least-squares scale fits best, refits as
// plan.refit says, and returns that scale; levels[0..n) are grid points' levels. scale is
// the fallback when no candidate beats zero; levels must hold its levels (or zeros).
float search_scale(const GridSearch& grid, const ScaleSearch& plan, int n, const float* xval, const float* weight,
                   const float* sqrt_weight, float reach, float scale, int8_t* levels);

// The grid index of a group's levels (which the search left on the grid).
int grid_index(const GridSearch& grid, const int8_t* levels);

// ggml's make_qp_quants: the weighted least-squares scale of x on levels 0..nmax.
float fit_nonnegative_levels(int n, int nmax, const float* x, const float* weight);

// A block scale as the 4-bit (or 3-bit) odd multiple of the super-block scale d:
// round((scale / d - 1) / 2), with ggml's inverse id = 1 / d.
inline int scale_code(float inverse_d, float scale, int top) {
  return clamp_int(nearest_int(0.5f * (inverse_d * scale - 1)), 0, top);
}

// kiln::Error unless rows are whole super-blocks, or for a missing importance vector (of
// the types ggml will not quantize without one).
void require_superblock_rows(const char* type, size_t n_per_row);
void require_importance(const char* type, const float* importance);

// Quantizes rows of whole super-blocks; each row's super-block b uses importance[256 b..]
// (the same weights for every row: they are per column).
template <class Block>
void quantize_rows(const char* type, void (*quantize_block)(const float* x, const float* importance, Block* y),
                   const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance) {
  require_superblock_rows(type, n_per_row);
  Block* y = static_cast<Block*>(dst);
  const size_t n_blocks = n_per_row / QK_K;
  for (size_t r = 0; r < n_rows; ++r)
    for (size_t b = 0; b < n_blocks; ++b)
      quantize_block(src + r * n_per_row + b * QK_K, importance ? importance + b * QK_K : nullptr, y++);
}

}  // namespace kiln::kernels::ref::iq
