#pragma once
// Contiguous per-layer KV cache, preallocated for the whole context: keys and values of
// every position processed so far, so decoding computes only the new token's K and V.
// Keys are stored by position (a row per token); values transposed (a row per dimension)
// so that both attention products, Q K^T and P V, are gemms over contiguous rows.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln {

class KvCache {
 public:
  KvCache(size_t n_layers, size_t n_ctx, size_t kv_dim)
      : n_layers_(n_layers), n_ctx_(n_ctx), kv_dim_(kv_dim), k_(n_layers * n_ctx * kv_dim), vt_(n_layers * n_ctx * kv_dim) {}

  // Key row of kv_dim floats for (layer, position).
  const float* k(size_t layer, size_t pos) const { return &k_[(layer * n_ctx_ + pos) * kv_dim_]; }
  // Values of a layer as [kv_dim][n_ctx]: row d holds dimension d of every position.
  const float* vt(size_t layer) const { return &vt_[layer * kv_dim_ * n_ctx_]; }

  void store(size_t layer, size_t pos, const float* k_row, const float* v_row) {
    std::copy_n(k_row, kv_dim_, &k_[(layer * n_ctx_ + pos) * kv_dim_]);
    float* vt = &vt_[layer * kv_dim_ * n_ctx_ + pos];
    for (size_t d = 0; d < kv_dim_; ++d) vt[d * n_ctx_] = v_row[d];
  }

  size_t n_layers() const { return n_layers_; }
  size_t n_ctx() const { return n_ctx_; }
  size_t kv_dim() const { return kv_dim_; }

  // Saved state (session files): the first n positions of a layer as the cache holds
  // them minus the unused tail, keys [n][kv_dim] then values [kv_dim][n]. Both directions
  // are whole-row copies whatever n_ctx is on either side, so a 2,000-token state moves
  // at memcpy speed. Only this block knows the layout; a new cache type (f16, q8_0) gets
  // a new kState* number and its own rows here.
  static constexpr uint32_t kStateF32 = 0;
  static constexpr uint32_t kStateType = kStateF32;
  static uint64_t state_layer_bytes(size_t n, size_t kv_dim) { return 2 * uint64_t(n) * kv_dim * sizeof(float); }
  template <typename Sink>  // sink(const void* data, size_t bytes)
  void write_state(size_t layer, size_t n, Sink&& sink) const {
    if (n == 0) return;
    sink(k(layer, 0), n * kv_dim_ * sizeof(float));
    for (size_t d = 0; d < kv_dim_; ++d) sink(vt(layer) + d * n_ctx_, n * sizeof(float));
  }
  // The mirror of write_state: source(void* dst, size_t bytes) fills each row in the same
  // order; n <= n_ctx().
  template <typename Source>
  void read_state(size_t layer, size_t n, Source&& source) {
    if (n == 0) return;
    source(&k_[layer * n_ctx_ * kv_dim_], n * kv_dim_ * sizeof(float));
    for (size_t d = 0; d < kv_dim_; ++d) source(&vt_[(layer * kv_dim_ + d) * n_ctx_], n * sizeof(float));
  }

  // Bytes of keys and values for a cache of this shape (before allocating one).
  static double bytes_for(size_t n_layers, size_t n_ctx, size_t kv_dim) {
    return 2.0 * double(n_layers) * double(n_ctx) * double(kv_dim) * sizeof(float);
  }

 private:
  size_t n_layers_, n_ctx_, kv_dim_;
  std::vector<float> k_;   // [n_layers][n_ctx][kv_dim]
  std::vector<float> vt_;  // [n_layers][kv_dim][n_ctx]
};

}  // namespace kiln
