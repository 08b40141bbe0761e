#include "runtime/sliding_window.h"

#include <algorithm>

#include "kiln/error.h"
#include "families/architecture.h"

namespace kiln {

std::vector<uint32_t> layer_windows(const ModelConfig& c, const SessionParams& p) {
  std::vector<uint32_t> w = c.swa_window;
  w.resize(c.n_layers, 0);
  if (p.swa_window < 0 && p.swa_pattern < 0) return w;
  const uint32_t model_size = w.empty() ? 0 : *std::max_element(w.begin(), w.end());
  const uint32_t size = p.swa_window >= 0 ? uint32_t(p.swa_window) : model_size;
  if (size == 0 && p.swa_pattern >= 0 && p.swa_window < 0)
    throw Error("a sliding-window pattern (--swa-pattern) needs a window: this model has none, give --swa-window");
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const bool slides = p.swa_pattern >= 0 ? swa_pattern_slides(l, uint32_t(p.swa_pattern)) : model_size == 0 || w[l] > 0;
    w[l] = slides ? size : 0;
  }
  return w;
}

std::vector<size_t> layer_capacities(const std::vector<uint32_t>& windows, size_t n_ctx, size_t n_batch, bool full) {
  std::vector<size_t> cap(windows.size(), n_ctx);
  bool ring = false;
  for (size_t l = 0; l < windows.size(); ++l) {
    if (full || windows[l] == 0) continue;
    cap[l] = std::min<size_t>(n_ctx, size_t(windows[l]) + n_batch - 1);
    ring |= cap[l] < n_ctx;
  }
  if (!ring) cap.clear();
  return cap;
}

uint32_t windows_code(const std::vector<uint32_t>& windows) {
  if (std::all_of(windows.begin(), windows.end(), [](uint32_t w) { return w == 0; })) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the list
  for (uint32_t w : windows)
    for (int b = 0; b < 4; ++b) h = (h ^ ((w >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  const uint32_t code = uint32_t(h ^ (h >> 24) ^ (h >> 48)) & 0xffffff;
  return code ? code : 1;
}

std::string describe_windows(const std::vector<uint32_t>& windows) {
  const uint32_t size = windows.empty() ? 0 : *std::max_element(windows.begin(), windows.end());
  if (size == 0) return "";
  const auto ranges = [&](auto pick) {
    std::string out;
    for (size_t l = 0; l < windows.size();) {
      if (!pick(windows[l])) { ++l; continue; }
      size_t e = l;
      while (e + 1 < windows.size() && pick(windows[e + 1])) ++e;
      if (!out.empty()) out += ", ";
      out += std::to_string(l);
      if (e > l) out.append("-").append(std::to_string(e));
      l = e + 1;
    }
    return out;
  };
  const bool uniform = std::all_of(windows.begin(), windows.end(), [&](uint32_t w) { return w == 0 || w == size; });
  if (!uniform) {
    std::string out;
    for (size_t l = 0; l < windows.size(); ++l) {
      if (l) out += ' ';
      out += std::to_string(windows[l]);
    }
    return "per layer " + out;
  }
  const std::string global = ranges([](uint32_t w) { return w == 0; });
  if (global.empty()) return std::to_string(size) + " on every layer";
  return std::to_string(size) + " on layers " + ranges([](uint32_t w) { return w > 0; }) + "; global " + global;
}

}  // namespace kiln
