// The codebook search aids and the IQ2/IQ3 scale search shared by the codebook quantizers
// (kernels/scalar/iq_grid_search.h). ggml builds the same tables in iq2xs_init_impl and
// iq3xs_init_impl; here each is built once, on first use, from the published codebooks.
#include "kernels/scalar/iq_grid_search.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <string>

#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::ref::iq {

GridSearch::GridSearch(const uint8_t* levels, int n_points, int dim, int bits, int top_level, int n_distances)
    : dim_(dim), bits_(bits), top_level_(top_level), levels_(levels, levels + size_t(n_points) * dim) {
  const int n_keys = 1 << (bits * dim);
  point_of_key_.assign(n_keys, -1);
  first_candidate_.assign(n_keys, 0);
  for (int p = 0; p < n_points; ++p) point_of_key_[key(reinterpret_cast<const int8_t*>(this->levels(p)))] = p;

  // Candidates only for keys a search can produce (every level <= top_level); a distance
  // is the sum of squared level differences (ggml's, on odd values 2l+1, is 4 times it:
  // same order, same ties).
  const int max_distance = dim * top_level * top_level;
  std::vector<int> distance(n_points);
  std::vector<int> count(max_distance + 1);
  std::vector<int8_t> point(dim);
  for (int k = 0; k < n_keys; ++k) {
    bool reachable = true;
    for (int i = 0; i < dim; ++i) {
      point[i] = int8_t((k >> (bits * i)) & ((1 << bits) - 1));
      reachable = reachable && point[i] <= top_level;
    }
    if (!reachable || point_of_key_[k] >= 0) continue;
    std::fill(count.begin(), count.end(), 0);
    for (int p = 0; p < n_points; ++p) {
      int d2 = 0;
      for (int i = 0; i < dim; ++i) d2 += (this->levels(p)[i] - point[i]) * (this->levels(p)[i] - point[i]);
      distance[p] = d2;
      ++count[d2];
    }
    first_candidate_[k] = uint32_t(candidates_.size());
    candidates_.push_back(0);
    int taken = 0;
    for (int d2 = 0; d2 <= max_distance && taken < n_distances; ++d2) {
      if (count[d2] == 0) continue;
      ++taken;
      for (int p = 0; p < n_points; ++p)
        if (distance[p] == d2) candidates_.push_back(uint16_t(p));
    }
    candidates_[first_candidate_[k]] = uint16_t(candidates_.size() - first_candidate_[k] - 1);
  }
}

namespace {

// A codebook's entries as levels: each byte of an entry is one of `values` (ascending),
// and its level is its position there.
template <class Entry>
std::vector<uint8_t> codebook_levels(const Entry* codebook, int n_points, std::span<const uint8_t> values) {
  constexpr int dim = int(sizeof(Entry));
  std::vector<uint8_t> levels(size_t(n_points) * dim);
  for (int p = 0; p < n_points; ++p) {
    for (int i = 0; i < dim; ++i) {
      const uint8_t byte = uint8_t(codebook[p] >> (8 * i));
      const auto it = std::find(values.begin(), values.end(), byte);
      if (it == values.end())
        throw Error("iq grid search: codebook entry " + std::to_string(p) + " has a byte off its grid");
      levels[size_t(p) * dim + i] = uint8_t(it - values.begin());
    }
  }
  return levels;
}

constexpr uint8_t kIq2Values[] = {0x08, 0x19, 0x2b};
constexpr uint8_t kIq3xxsValues[] = {0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e};
constexpr uint8_t kIq3sValues[] = {0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f};
constexpr uint8_t kIq1Values[] = {0xff, 0x00, 0x01};  // -1, 0, 1 as signed bytes

}  // namespace

// n_distances: ggml's nwant for each grid.
const GridSearch& iq2xxs_grid() {
  static const GridSearch grid(codebook_levels(kIq2xxsGrid, 256, kIq2Values).data(), 256, 8, 2, 2, 2);
  return grid;
}
const GridSearch& iq2xs_grid() {
  static const GridSearch grid(codebook_levels(kIq2xsGrid, 512, kIq2Values).data(), 512, 8, 2, 2, 2);
  return grid;
}
const GridSearch& iq2s_grid() {
  static const GridSearch grid(codebook_levels(kIq2sGrid, 1024, kIq2Values).data(), 1024, 8, 2, 2, 1);
  return grid;
}
const GridSearch& iq3xxs_grid() {
  static const GridSearch grid(codebook_levels(kIq3xxsGrid, 256, kIq3xxsValues).data(), 256, 4, 3, 7, 2);
  return grid;
}
const GridSearch& iq3s_grid() {
  static const GridSearch grid(codebook_levels(kIq3sGrid, 512, kIq3sValues).data(), 512, 4, 3, 7, 3);
  return grid;
}
const GridSearch& iq1_grid() {
  static const GridSearch grid(codebook_levels(kIq1sGrid, 2048, kIq1Values).data(), 2048, 8, 2, 2, 3);
  return grid;
}

uint8_t fold_signs(const float* x, float* xval) {
  uint8_t signs = 0;
  for (int i = 0; i < 8; ++i) {
    // Written as ggml tests it: -0.0 counts as positive, NaN as negative.
    if (x[i] >= 0) {
      xval[i] = x[i];
    } else {
      xval[i] = -x[i];
      signs |= uint8_t(1 << i);
    }
  }
  return signs;
}

uint8_t fold_signs_even(const float* x, const float* weight, float* xval) {
  uint8_t signs = fold_signs(x, xval);
  if (std::popcount(signs) % 2) {
    int least = 0;
    float least_error = weight[0] * x[0] * x[0];
    for (int i = 1; i < 8; ++i) {
      const float error = weight[i] * x[i] * x[i];
      if (error < least_error) {
        least_error = error;
        least = i;
      }
    }
    xval[least] = -xval[least];
    signs ^= uint8_t(1 << least);
  }
  return signs & 127;
}

namespace {

// Rounds one group to levels at inverse scale inv_scale; off the grid, takes the candidate
// nearest xval at `scale` (error weighted by sqrt_weight). Returns whether it was on it.
bool round_group(const GridSearch& grid, const float* xval, const float* sqrt_weight, float inv_scale, float scale,
                 int8_t* levels) {
  const int dim = grid.dim();
  for (int i = 0; i < dim; ++i)
    levels[i] = int8_t(clamp_int(nearest_int(0.5f * (inv_scale * xval[i] - 1)), 0, grid.top_level()));
  const int key = grid.key(levels);
  if (grid.point_at(key) >= 0) return true;
  float best_error = FLT_MAX;
  // ggml aborts when no candidate's error is below FLT_MAX (non-finite input); the nearest
  // point by level distance stands in here.
  int best = grid.nearest(key)[0];
  for (const uint16_t p : grid.nearest(key)) {
    float error = 0;
    for (int i = 0; i < dim; ++i) {
      const float diff = scale * float(2 * grid.levels(p)[i] + 1) - xval[i];
      error += sqrt_weight[i] * diff * diff;
    }
    if (error < best_error) {
      best_error = error;
      best = p;
    }
  }
  for (int i = 0; i < dim; ++i) levels[i] = int8_t(grid.levels(best)[i]);
  return false;
}

struct Fit {
  float sumqx = 0, sumq2 = 0;
};
// The weighted sums of the least-squares scale sumqx / sumq2 of xval on odd values 2l+1.
Fit fit_odd_levels(int n, const float* xval, const float* weight, const int8_t* levels) {
  Fit fit;
  for (int i = 0; i < n; ++i) {
    const float q = float(2 * levels[i] + 1);
    fit.sumqx += weight[i] * xval[i] * q;
    fit.sumq2 += weight[i] * q * q;
  }
  return fit;
}

constexpr int kMaxGroups = 8;
constexpr int kMaxBlock = 32;

}  // namespace

float search_scale(const GridSearch& grid, const ScaleSearch& plan, int n, const float* xval, const float* weight,
                   const float* sqrt_weight, float reach, float scale, int8_t* levels) {
  const int dim = grid.dim(), n_groups = n / dim;
  const float odd_top = float(2 * grid.top_level() + 1);
  bool on_grid[kMaxGroups], trial_on_grid[kMaxGroups];
  int8_t trial[kMaxBlock];
  std::fill(on_grid, on_grid + n_groups, plan.assume_on_grid);
  float best = 0;
  for (int is = -plan.steps; is <= plan.steps; ++is) {
    const float inv_scale = (odd_top + float(is) * plan.step) / reach;
    const float trial_scale = 1 / inv_scale;
    for (int k = 0; k < n_groups; ++k)
      trial_on_grid[k] =
          round_group(grid, xval + dim * k, sqrt_weight + dim * k, inv_scale, trial_scale, trial + dim * k);
    const Fit fit = fit_odd_levels(n, xval, weight, trial);
    // Compares sumqx^2 / sumq2 (the error the fit removes) without dividing.
    if (fit.sumq2 > 0 && fit.sumqx * fit.sumqx > best * fit.sumq2) {
      scale = fit.sumqx / fit.sumq2;
      best = scale * fit.sumqx;
      std::copy(trial, trial + n, levels);
      std::copy(trial_on_grid, trial_on_grid + n_groups, on_grid);
    }
  }

  const bool any_off_grid = std::count(on_grid, on_grid + n_groups, false) > 0;
  const bool refit = plan.refit == Refit::kAllGroups ? scale > 0 : any_off_grid && scale > 0;
  if (!refit) return scale;
  const float inv_scale = 1 / scale;
  for (int k = 0; k < n_groups; ++k) {
    if (plan.refit == Refit::kOffGridGroups && on_grid[k]) continue;
    round_group(grid, xval + dim * k, sqrt_weight + dim * k, inv_scale, scale, levels + dim * k);
  }
  const Fit fit = fit_odd_levels(n, xval, weight, levels);
  if (fit.sumq2 > 0) scale = fit.sumqx / fit.sumq2;
  return scale;
}

int grid_index(const GridSearch& grid, const int8_t* levels) {
  const int point = grid.point_at(grid.key(levels));
  if (point < 0) throw Error("iq quantize: internal error, a group left off its grid");
  return point;
}

float fit_nonnegative_levels(int n, int nmax, const float* x, const float* weight) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = larger(max, x[i]);
  if (max < 1e-15f) return 0.f;
  // ggml keeps the levels in bytes: a negative level (of a negative x) reads back as
  // 256 + level where the code below reads `levels`, and that changes the sums.
  uint8_t levels[kMaxBlock];
  float inv_scale = float(nmax) / max;
  for (int i = 0; i < n; ++i) levels[i] = uint8_t(nearest_int(inv_scale * x[i]));
  float scale = 1 / inv_scale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * float(levels[i]);
    best_error += weight[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float trial_inv = (0.1f * float(is) + float(nmax)) / max;
    const float trial_scale = 1 / trial_inv;
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(trial_inv * x[i]));
      const float diff = x[i] - trial_scale * float(l);
      error += weight[i] * diff * diff;
    }
    if (error < best_error) {
      best_error = error;
      inv_scale = trial_inv;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(inv_scale * x[i]));
    levels[i] = uint8_t(l);
    sumlx += weight[i] * x[i] * float(l);
    suml2 += weight[i] * float(l) * float(l);
  }
  // Coordinate descent: move one level at a time to where the others' fit puts it, while
  // that improves sumlx^2 / suml2.
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = weight[i];
      float slx = sumlx - w * x[i] * float(levels[i]);
      float sl2 = suml2 - w * float(levels[i]) * float(levels[i]);
      if (slx > 0 && sl2 > 0) {
        const int l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
        if (l != levels[i]) {
          slx += w * x[i] * float(l);
          sl2 += w * float(l) * float(l);
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            levels[i] = uint8_t(l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void require_superblock_rows(const char* type, size_t n_per_row) {
  if (n_per_row % QK_K != 0)
    throw Error(std::string("quantize ") + type + ": rows of " + std::to_string(n_per_row) +
                " values are not a multiple of " + std::to_string(QK_K));
}

void require_importance(const char* type, const float* importance) {
  if (!importance) throw Error(std::string("quantize ") + type + ": needs importance weights (an imatrix), as in ggml");
}

}  // namespace kiln::kernels::ref::iq
