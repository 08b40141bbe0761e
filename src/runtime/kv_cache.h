#pragma once
// Per-layer KV cache, preallocated for the whole context: keys and values of every
// position processed so far, so decoding computes only the new token's K and V.
//
// Storage types: f32, f16, bf16 (one value each) and q8_0, q4_0 (blocks of 32 values
// along a position's row, as in GGUF; a block may span heads when head_dim < 32).
// Keys are stored by position: [layer][pos][kv_dim]. Values are either transposed,
// [layer][kv_dim][n_ctx], so that attention's P V is a gemm over contiguous rows (only
// for one-value types: a quantized block cannot be written one position at a time), or
// by position like keys, read a block of positions at a time by tiled attention.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor_type.h"

namespace kiln {

class KvCache {
 public:
  struct Shape {
    size_t n_layers = 0, n_ctx = 0, kv_dim = 0, head_dim = 0;
    TensorType k_type = TensorType::F32, v_type = TensorType::F32;
    bool v_transposed = true;
  };

  // Throws kiln::Error when a type is not a cache type or does not fit the shape.
  explicit KvCache(const Shape& shape);

  static bool is_cache_type(TensorType t);  // f32 f16 bf16 q8_0 q4_0
  static bool is_one_value(TensorType t);   // f32 f16 bf16
  static std::string type_label(TensorType t);  // the -ctk/-ctv name: "q8_0"
  static void check(const Shape& shape);
  // Bytes of keys and values for a cache of this shape (before allocating one).
  static double bytes_for(const Shape& shape);
  static size_t row_bytes(TensorType t, size_t n);  // n values of t (n a multiple of its block)

  const Shape& shape() const { return s_; }
  size_t n_layers() const { return s_.n_layers; }
  size_t n_ctx() const { return s_.n_ctx; }
  size_t kv_dim() const { return s_.kv_dim; }
  double bytes() const { return bytes_for(s_); }

  // Key row of (layer, pos), k_row_bytes() long.
  const uint8_t* k_row(size_t layer, size_t pos) const { return &k_[(layer * s_.n_ctx + pos) * k_row_bytes_]; }
  size_t k_row_bytes() const { return k_row_bytes_; }
  // Value row of (layer, pos) when !v_transposed.
  const uint8_t* v_row(size_t layer, size_t pos) const { return &v_[(layer * s_.n_ctx + pos) * v_row_bytes_]; }
  size_t v_row_bytes() const { return v_row_bytes_; }
  // Transposed values of a layer: row d (dimension d of every position) at vt(layer) + d * vt_row_bytes().
  const uint8_t* vt(size_t layer) const { return &v_[layer * s_.kv_dim * vt_row_bytes_]; }
  size_t vt_row_bytes() const { return vt_row_bytes_; }

  // Converts and stores the new position's keys and values (kv_dim floats each).
  void store(size_t layer, size_t pos, const float* k, const float* v);

  // Values [e0, e0 + n) of positions j0..j0+nj-1 as floats: keys to out[j][.] (row
  // stride ld), values (stored by position: !v_transposed) transposed to out[e][.] (row
  // stride ld). n <= 512.
  void keys_to_f32(size_t layer, size_t j0, size_t nj, size_t e0, size_t n, float* out, size_t ld) const;
  void values_to_f32_transposed(size_t layer, size_t j0, size_t nj, size_t e0, size_t n, float* out, size_t ld) const;

  // Context shift: positions [n_keep + n_discard, n_past) move to n_keep.. in every
  // layer. Values move as they are; each moved key row goes through rerotate (floats,
  // kv_dim of them) on its way, so RoPE can be turned back by n_discard positions.
  template <typename Rerotate>  // rerotate(float* k_row)
  void shift(size_t n_keep, size_t n_discard, size_t n_past, Rerotate&& rerotate) {
    float row[kMaxRow];
    for (size_t l = 0; l < s_.n_layers; ++l) {
      for (size_t pos = n_keep + n_discard; pos < n_past; ++pos) {
        keys_to_f32(l, pos, 1, 0, s_.kv_dim, row, s_.kv_dim);
        rerotate(row);
        store_key(l, pos - n_discard, row);
      }
      move_values(l, n_keep, n_discard, n_past);
    }
  }
  static constexpr size_t kMaxRow = 8192;  // kv_dim limit of shift() and compact()

  // Eviction: position kept[i] moves to i in every layer (kept ascending, so kept[i] >= i
  // and rows only move down), every other position is forgotten. Each moved key row goes
  // through rerotate(row, kept[i] - i) so RoPE can be turned back by the distance that
  // row moved; values move as they are (per dimension row when transposed).
  template <typename Rerotate>  // rerotate(float* k_row, size_t delta)
  void compact(const int32_t* kept, size_t n_kept, Rerotate&& rerotate) {
    float row[kMaxRow];
    for (size_t l = 0; l < s_.n_layers; ++l) {
      for (size_t i = 0; i < n_kept; ++i) {
        const size_t from = size_t(kept[i]);
        if (from == i) continue;
        keys_to_f32(l, from, 1, 0, s_.kv_dim, row, s_.kv_dim);
        rerotate(row, from - i);
        store_key(l, i, row);
      }
      gather_values(l, kept, n_kept);
    }
  }

  // Saved state (session files): the first n positions of a layer, keys by position
  // then values in the cache's own layout minus the unused tail. Whole-row copies
  // whatever n_ctx is on either side. state_type() encodes the types and the layout; the
  // plain f32 transposed cache is 0, the code of the first files.
  uint32_t state_type() const;
  static std::string state_type_name(uint32_t code);  // "f16 keys, q8_0 values by position"
  uint64_t state_layer_bytes(size_t n) const;
  template <typename Sink>  // sink(const void* data, size_t bytes)
  void write_state(size_t layer, size_t n, Sink&& sink) const {
    if (n == 0) return;
    sink(k_row(layer, 0), n * k_row_bytes_);
    if (!s_.v_transposed) return sink(v_row(layer, 0), n * v_row_bytes_);
    const size_t elem = vt_row_bytes_ / s_.n_ctx;
    for (size_t d = 0; d < s_.kv_dim; ++d) sink(vt(layer) + d * vt_row_bytes_, n * elem);
  }
  // The mirror of write_state: source(void* dst, size_t bytes) fills each piece in the
  // same order; n <= n_ctx().
  template <typename Source>
  void read_state(size_t layer, size_t n, Source&& source) {
    if (n == 0) return;
    source(&k_[layer * s_.n_ctx * k_row_bytes_], n * k_row_bytes_);
    if (!s_.v_transposed) return source(&v_[layer * s_.n_ctx * v_row_bytes_], n * v_row_bytes_);
    const size_t elem = vt_row_bytes_ / s_.n_ctx;
    for (size_t d = 0; d < s_.kv_dim; ++d) source(&v_[(layer * s_.kv_dim + d) * vt_row_bytes_], n * elem);
  }

 private:
  void store_key(size_t layer, size_t pos, const float* k);
  void move_values(size_t layer, size_t n_keep, size_t n_discard, size_t n_past);
  void gather_values(size_t layer, const int32_t* kept, size_t n_kept);

  Shape s_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0, vt_row_bytes_ = 0;
  std::vector<uint8_t> k_, v_;
  std::vector<uint8_t> v_converted_;  // one value row in v_type, for the transposed store
};

}  // namespace kiln
