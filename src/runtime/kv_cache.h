#pragma once
// Contiguous per-layer KV cache, preallocated for the whole context: keys and values of
// every position processed so far, so decoding computes only the new token's K and V.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln {

class KvCache {
 public:
  KvCache(size_t n_layers, size_t n_ctx, size_t kv_dim)
      : n_ctx_(n_ctx), kv_dim_(kv_dim), k_(n_layers * n_ctx * kv_dim), v_(n_layers * n_ctx * kv_dim) {}

  // Row of kv_dim floats for (layer, position).
  float* k(size_t layer, size_t pos) { return &k_[(layer * n_ctx_ + pos) * kv_dim_]; }
  float* v(size_t layer, size_t pos) { return &v_[(layer * n_ctx_ + pos) * kv_dim_]; }
  const float* k(size_t layer, size_t pos) const { return &k_[(layer * n_ctx_ + pos) * kv_dim_]; }
  const float* v(size_t layer, size_t pos) const { return &v_[(layer * n_ctx_ + pos) * kv_dim_]; }

  size_t n_ctx() const { return n_ctx_; }
  size_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  size_t n_ctx_, kv_dim_;
  std::vector<float> k_, v_;  // [n_layers][n_ctx][kv_dim]
};

}  // namespace kiln
