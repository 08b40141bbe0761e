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
      : n_ctx_(n_ctx), kv_dim_(kv_dim), k_(n_layers * n_ctx * kv_dim), vt_(n_layers * n_ctx * kv_dim) {}

  // Key row of kv_dim floats for (layer, position).
  const float* k(size_t layer, size_t pos) const { return &k_[(layer * n_ctx_ + pos) * kv_dim_]; }
  // Values of a layer as [kv_dim][n_ctx]: row d holds dimension d of every position.
  const float* vt(size_t layer) const { return &vt_[layer * kv_dim_ * n_ctx_]; }

  void store(size_t layer, size_t pos, const float* k_row, const float* v_row) {
    std::copy_n(k_row, kv_dim_, &k_[(layer * n_ctx_ + pos) * kv_dim_]);
    float* vt = &vt_[layer * kv_dim_ * n_ctx_ + pos];
    for (size_t d = 0; d < kv_dim_; ++d) vt[d * n_ctx_] = v_row[d];
  }

  size_t n_ctx() const { return n_ctx_; }
  size_t kv_dim() const { return kv_dim_; }
  // Bytes of keys and values for a cache of this shape (before allocating one).
  static double bytes_for(size_t n_layers, size_t n_ctx, size_t kv_dim) {
    return 2.0 * double(n_layers) * double(n_ctx) * double(kv_dim) * sizeof(float);
  }

 private:
  size_t n_ctx_, kv_dim_;
  std::vector<float> k_;   // [n_layers][n_ctx][kv_dim]
  std::vector<float> vt_;  // [n_layers][kv_dim][n_ctx]
};

}  // namespace kiln
