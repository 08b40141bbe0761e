#pragma once
// RoPE frequencies with scaling, as ggml computes them (linear position interpolation,
// YaRN's ramp and magnitude scaling, per-pair frequency factors) plus NTK-aware base
// scaling. The session turns them into a cos/sin table once; the rope kernel only
// rotates by the table, so scaling costs nothing per token and the kernels stay unaware.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/rope.h"

namespace kiln {

// What the cos/sin of one (position, pair) depends on, once a session's overrides have
// met the model's metadata.
struct RopeConfig {
  RopeScaling scaling = RopeScaling::None;
  uint32_t n_rot = 0;
  double factor = 1;       // as given: the context extension factor
  double freq_base = 10000;  // after --rope-freq-base and the NTK adjustment
  double freq_scale = 1;   // interpolated angles are multiplied by it (1/factor: linear, yarn)
  double ext_factor = 0;   // how much of the extrapolated angle YaRN's ramp mixes back in
  double attn_factor = 1;  // magnitude of cos/sin
  uint32_t orig_ctx = 0;   // the context YaRN's correction dimensions are computed for
  double beta_fast = 32, beta_slow = 1;
  std::vector<float> freq_factors;  // empty, or n_rot/2 divisors of the pair frequencies
  std::string factors_from;         // where freq_factors came from, for describe_rope
};

// The model's settings with the session's overrides applied (nothing in `p` set: the
// model's) for a session of n_ctx positions, which picks LongRoPE's long factors when it
// exceeds the original context (0: the short ones, what the model is without a session).
// Throws kiln::Error naming the RopeParams field for a bad value.
RopeConfig resolve_rope(const ModelConfig& c, const RopeParams& p, int64_t n_ctx = 0);

// YaRN's correction range in pairs: pairs below [0] rotate more than beta_fast times over
// the original context and keep their frequency; pairs above [1] rotate fewer than
// beta_slow times and are interpolated; a linear ramp in between.
std::array<double, 2> yarn_corr_dims(const RopeConfig& r);

// cos and sin of every pair at position `pos`: out[2i], out[2i + 1] for i < n_rot/2.
void rope_cos_sin(const RopeConfig& r, int64_t pos, float* out);
// The same for positions 0..n_pos-1: [n_pos][n_rot/2][2].
std::vector<float> rope_cos_sin_table(const RopeConfig& r, int32_t n_pos);

// One line for people: "none", "linear x2", "yarn x4, original context 8192, ...".
std::string describe_rope(const RopeConfig& r);

}  // namespace kiln
