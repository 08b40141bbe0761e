#pragma once
// RoPE scaling: running a model at positions it was not trained on (issue 5). A model's
// GGUF may say how it was extended (rope.scaling.*, rope_freqs.weight); a session may
// override that, as llama.cpp's context parameters do. The runtime turns both into one
// cos/sin table (src/runtime/rope.h), so the attention kernels never see the difference.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class RopeScaling {
  None,    // theta_i = pos * base^(-2i/n_rot)
  Linear,  // position interpolation: pos / factor
  Ntk,     // "NTK-aware": base * factor^(n_rot/(n_rot-2)), positions unchanged
  Yarn,    // interpolate slow dimensions, keep fast ones, scale cos/sin (YaRN paper)
};
const char* rope_scaling_name(RopeScaling s);  // "none", "linear", "ntk", "yarn"
std::optional<RopeScaling> parse_rope_scaling(std::string_view name);

// A session's overrides. Fields the GGUF can carry are optional: unset means the model's
// value. The others have llama.cpp's defaults.
struct RopeParams {
  std::optional<RopeScaling> scaling;    // unset: rope.scaling.type; a factor alone on a
                                         // model without scaling means linear
  std::optional<float> factor;           // context extension factor (freq_scale = 1/factor)
  std::optional<float> freq_base;        // instead of rope.freq_base
  std::optional<uint32_t> yarn_orig_ctx; // instead of rope.scaling.original_context_length
  std::optional<float> yarn_attn_factor; // instead of rope.scaling.attn_factor
  float yarn_ext_factor = -1.0f;         // < 0: 1 for yarn, 0 otherwise
  float yarn_beta_fast = 32.0f;          // dimensions with more rotations than this over
  float yarn_beta_slow = 1.0f;           // the original context extrapolate, fewer interpolate
};

}  // namespace kiln
