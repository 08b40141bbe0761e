// Sliding-window attention keys, shared by the families that may carry them. Which layers
// slide is data: a file states it, the runtime only reads ModelConfig::swa_window.
#include "families/architecture.h"

#include <algorithm>
#include <cstdint>

#include "kiln/error.h"

namespace kiln {

void read_sliding_window(const gguf::File& f, const std::string& p, ModelConfig& c, uint32_t default_window,
                         uint32_t default_pattern) {
  const uint64_t window = f.get_uint(p + "attention.sliding_window", default_window);
  const gguf::Value* pattern = f.find(p + "attention.sliding_window_pattern");
  if (window == 0) return;  // a pattern without a window slides nothing
  if (window > UINT32_MAX) throw Error(f.path() + ": " + p + "attention.sliding_window " + std::to_string(window) + " is too large");
  check_layer_count(f, c);
  c.swa_window.assign(c.n_layers, uint32_t(window));
  if (!pattern) {
    for (uint32_t l = 0; l < c.n_layers; ++l)
      if (!swa_pattern_slides(l, default_pattern)) c.swa_window[l] = 0;
    return;
  }
  const auto bad = [&](const std::string& why) {
    throw Error(f.path() + ": " + p + "attention.sliding_window_pattern " + why);
  };
  if (pattern->type == gguf::ValueType::ARRAY) {
    if (pattern->size() != c.n_layers)
      bad("has " + std::to_string(pattern->size()) + " entries for " + std::to_string(c.n_layers) + " layers");
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      const gguf::Value v = pattern->at(l);
      if (!v.is_integer() && v.type != gguf::ValueType::BOOL) bad("must hold booleans");
      if (v.u == 0 && v.i == 0) c.swa_window[l] = 0;  // false: a global layer
    }
    return;
  }
  if (!pattern->is_integer()) bad("must be a number or an array of booleans");
  const uint64_t n = f.get_uint(p + "attention.sliding_window_pattern");
  for (uint32_t l = 0; l < c.n_layers; ++l)
    if (!swa_pattern_slides(l, uint32_t(std::min<uint64_t>(n, UINT32_MAX)))) c.swa_window[l] = 0;
}

}  // namespace kiln
