#pragma once
// Sliding-window attention, the session's side: which layers slide and how far (the
// model's windows with the SessionParams overrides), how many cache slots each layer gets,
// and how that is named in session files and logs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/model.h"
#include "kiln/session.h"

namespace kiln {

// The window of every layer (0: global), n_layers entries. Throws kiln::Error for an
// override that cannot work (a pattern with no window to apply).
std::vector<uint32_t> layer_windows(const ModelConfig& c, const SessionParams& p);

// Cache slots per layer: a sliding layer needs its window plus the rest of a batch (the
// first query of a batch of n_batch sees W - 1 keys before it, the last n_batch - 1
// after), a ring of W + n_batch - 1 slots; never more than n_ctx. Empty when every layer
// gets n_ctx (no window, or full).
std::vector<size_t> layer_capacities(const std::vector<uint32_t>& windows, size_t n_ctx, size_t n_batch, bool full);

// First key position a query at position p sees on a layer of window w.
inline size_t window_start(size_t p, uint32_t w) { return w == 0 || p + 1 < w ? 0 : p + 1 - w; }

// A 24-bit code of the windows for the session-file KV type (bits 8..31): 0 without any,
// so files of models without windows keep their codes.
uint32_t windows_code(const std::vector<uint32_t>& windows);

// "4096 on layers 0-4, 6-10; global 5, 11" or "512 on every layer"; "" without windows.
std::string describe_windows(const std::vector<uint32_t>& windows);

}  // namespace kiln
