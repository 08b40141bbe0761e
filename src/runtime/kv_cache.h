#pragma once
// Per-layer KV cache, preallocated for the whole context: keys and values of every
// position processed so far, so decoding computes only the new token's K and V.
//
// Storage types: f32, f16, bf16 (one value each) and q8_0, q4_0 (blocks of 32 values
// along a position's row, as in GGUF; a block may span heads when head_dim < 32).
// Keys are stored by position: [layer][pos][kv_dim]. Values of one-value types are
// transposed, [layer][kv_dim][n_ctx], so that attention's P V is a gemm over contiguous
// rows (whole rows, or a block of each row in tiled attention); quantized values are
// stored by position like keys (a block cannot be written one position at a time) and
// tiled attention multiplies them as they are stored (kernels::Ops::pv).
//
// Each layer has its own capacity (Shape::layer_ctx). A layer with fewer slots than n_ctx
// is a ring (sliding-window layers, which never look further back than their window):
// position p lives in slot p % capacity. Rows are addressed by slot; for a full layer
// the slot is the position. Keys are stored after RoPE, so a row's place in the ring
// matters only to the attention's masks, which work in positions (for_each_run).
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/zeroed_bytes.h"
#include "kiln/tensor_type.h"

namespace kiln {

class KvCache {
 public:
  struct Shape {
    size_t n_layers = 0, n_ctx = 0, kv_dim = 0, head_dim = 0;
    TensorType k_type = TensorType::F32, v_type = TensorType::F32;
    bool v_transposed = true;
    std::vector<size_t> layer_ctx;  // slots per layer (<= n_ctx); empty: n_ctx for every layer
    size_t capacity(size_t layer) const { return layer_ctx.empty() ? n_ctx : layer_ctx[layer]; }
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
  // A row of n floats in type t, and values [e0, e0 + n) of such a row back as floats:
  // the conversions every cache layout stores and reads with (runtime/paged_kv.h too).
  static void encode_row(TensorType t, const float* in, size_t n, uint8_t* row);
  static void decode_row(TensorType t, const uint8_t* row, size_t e0, size_t n, float* out);

  const Shape& shape() const { return s_; }
  size_t n_layers() const { return s_.n_layers; }
  size_t n_ctx() const { return s_.n_ctx; }
  size_t kv_dim() const { return s_.kv_dim; }
  double bytes() const { return bytes_for(s_); }

  size_t capacity(size_t layer) const { return s_.capacity(layer); }
  bool is_ring(size_t layer) const { return capacity(layer) < s_.n_ctx; }
  size_t slot(size_t layer, size_t pos) const { return pos % capacity(layer); }
  double layer_bytes(size_t layer) const;
  // The oldest position a ring layer still holds, every later one up to the newest stored
  // included (0 for full layers): what a truncation or a context shift can rely on.
  size_t held_from(size_t layer) const { return held_from_[layer]; }
  // Positions [p0, p1) (p1 - p0 <= capacity) as runs contiguous in the slots, in order:
  // f(first position, its slot, length). One run unless the range wraps around a ring.
  template <typename F>
  void for_each_run(size_t layer, size_t p0, size_t p1, F&& f) const {
    const size_t cap = capacity(layer);
    while (p0 < p1) {
      const size_t s = p0 % cap, n = std::min(p1 - p0, cap - s);
      f(p0, s, n);
      p0 += n;
    }
  }

  // Key row of (layer, slot), k_row_bytes() long.
  const uint8_t* k_row(size_t layer, size_t slot) const { return &k_[k_off_[layer] + slot * k_row_bytes_]; }
  size_t k_row_bytes() const { return k_row_bytes_; }
  // Value row of (layer, slot) when !v_transposed.
  const uint8_t* v_row(size_t layer, size_t slot) const { return &v_[v_off_[layer] + slot * v_row_bytes_]; }
  size_t v_row_bytes() const { return v_row_bytes_; }
  // Transposed values of a layer: row d (dimension d of every slot) at vt(layer) + d * vt_row_bytes(layer).
  const uint8_t* vt(size_t layer) const { return &v_[v_off_[layer]]; }
  size_t vt_row_bytes(size_t layer) const { return s_.v_transposed ? capacity(layer) * value_size() : 0; }

  // Converts and stores the keys and values (kv_dim floats each) of position pos in its slot.
  void store(size_t layer, size_t pos, const float* k, const float* v);
  // After a truncation to n positions: a session emptied (n == 0) needs nothing old.
  void truncated(size_t n) {
    if (n == 0) std::fill(held_from_.begin(), held_from_.end(), 0);
  }

  // Keys [e0, e0 + n) of slots j0..j0+nj-1 as floats, to out[j][.] (row stride ld).
  void keys_to_f32(size_t layer, size_t j0, size_t nj, size_t e0, size_t n, float* out, size_t ld) const;

  // Context shift: positions [n_keep + n_discard, n_past) move to n_keep.. in every
  // layer. Values move as they are; each moved key row goes through rerotate (its layer,
  // and kv_dim floats) on its way, so RoPE can be turned back by n_discard positions.
  // A ring layer is rebuilt from the rows it still holds (held_from() says which are
  // left; the caller checks that its window needs no more).
  template <typename Rerotate>  // rerotate(size_t layer, float* k_row)
  void shift(size_t n_keep, size_t n_discard, size_t n_past, Rerotate&& rerotate) {
    float row[kMaxRow];
    for (size_t l = 0; l < s_.n_layers; ++l) {
      if (is_ring(l)) {
        shift_ring(l, n_keep, n_discard, n_past, [&](float* r) { rerotate(l, r); });
        continue;
      }
      for (size_t pos = n_keep + n_discard; pos < n_past; ++pos) {
        keys_to_f32(l, pos, 1, 0, s_.kv_dim, row, s_.kv_dim);
        rerotate(l, row);
        store_key(l, pos - n_discard, row);
      }
      move_values(l, n_keep, n_discard, n_past);
    }
  }
  static constexpr size_t kMaxRow = 8192;  // kv_dim limit of shift() and compact()

  // Eviction: position kept[i] moves to i in every layer (kept ascending, so kept[i] >= i
  // and rows only move down), every other position is forgotten. Each moved key row goes
  // through rerotate(layer, row, kept[i] - i) so RoPE can be turned back by the distance
  // that row moved; values move as they are (per dimension row when transposed).
  template <typename Rerotate>  // rerotate(size_t layer, float* k_row, size_t delta)
  void compact(const int32_t* kept, size_t n_kept, Rerotate&& rerotate) {
    float row[kMaxRow];
    for (size_t l = 0; l < s_.n_layers; ++l) {
      for (size_t i = 0; i < n_kept; ++i) {
        const size_t from = size_t(kept[i]);
        if (from == i) continue;
        keys_to_f32(l, from, 1, 0, s_.kv_dim, row, s_.kv_dim);
        rerotate(l, row, from - i);
        store_key(l, i, row);
      }
      gather_values(l, kept, n_kept);
    }
  }

  // Saved state (session files): the first n positions of a layer, keys by position
  // then values in the cache's own layout minus the unused tail. Whole-row copies
  // whatever n_ctx is on either side. state_type() encodes the types and the layout; the
  // plain f32 transposed cache is 0, the code of the first files.
  // A ring layer writes the same bytes, in position order, with zero rows for the
  // positions it no longer holds (outside every later query's window: never read), so
  // ring and full-size caches of the same windows load each other's states.
  uint32_t state_type() const { return state_type_of(s_.k_type, s_.v_type, s_.v_transposed); }
  static uint32_t state_type_of(TensorType k, TensorType v, bool v_transposed);
  static std::string state_type_name(uint32_t code);  // "f16 keys, q8_0 values by position"
  uint64_t state_layer_bytes(size_t n) const;
  template <typename Sink>  // sink(const void* data, size_t bytes)
  void write_state(size_t layer, size_t n, Sink&& sink) const {
    if (n == 0) return;
    const size_t elem = value_size();
    const size_t gone = is_ring(layer) ? std::min(n, held_from_[layer]) : 0;
    const auto zeros = [&](size_t bytes) {
      static const uint8_t zero[4096] = {};
      for (; bytes > 0; bytes -= std::min(bytes, sizeof zero)) sink(zero, std::min(bytes, sizeof zero));
    };
    zeros(gone * k_row_bytes_);
    for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { sink(k_row(layer, s), m * k_row_bytes_); });
    if (!s_.v_transposed) {
      zeros(gone * v_row_bytes_);
      for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { sink(v_row(layer, s), m * v_row_bytes_); });
      return;
    }
    for (size_t d = 0; d < s_.kv_dim; ++d) {
      const uint8_t* row = vt(layer) + d * vt_row_bytes(layer);
      zeros(gone * elem);
      for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { sink(row + s * elem, m * elem); });
    }
  }
  // The mirror of write_state: source(void* dst, size_t bytes) fills each piece in the
  // same order; n <= n_ctx(). A ring layer keeps the last capacity() positions.
  template <typename Source>
  void read_state(size_t layer, size_t n, Source&& source) {
    const size_t elem = value_size();
    const size_t gone = n > capacity(layer) ? n - capacity(layer) : 0;
    held_from_[layer] = gone;
    if (n == 0) return;
    const auto skip = [&](size_t bytes) {
      uint8_t scratch[4096];
      for (; bytes > 0; bytes -= std::min(bytes, sizeof scratch)) source(scratch, std::min(bytes, sizeof scratch));
    };
    skip(gone * k_row_bytes_);
    for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { source(&k_[k_off_[layer] + s * k_row_bytes_], m * k_row_bytes_); });
    if (!s_.v_transposed) {
      skip(gone * v_row_bytes_);
      for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { source(&v_[v_off_[layer] + s * v_row_bytes_], m * v_row_bytes_); });
      return;
    }
    for (size_t d = 0; d < s_.kv_dim; ++d) {
      uint8_t* row = &v_[v_off_[layer] + d * vt_row_bytes(layer)];
      skip(gone * elem);
      for_each_run(layer, gone, n, [&](size_t, size_t s, size_t m) { source(row + s * elem, m * elem); });
    }
  }

 private:
  size_t value_size() const;  // bytes of one value when v_transposed
  void store_key(size_t layer, size_t pos, const float* k);
  void move_values(size_t layer, size_t n_keep, size_t n_discard, size_t n_past);
  // Rebuilds ring layer `layer` for a context shift from a copy of its rows, in the new
  // positions' slots.
  void shift_ring(size_t layer, size_t n_keep, size_t n_discard, size_t n_past,
                  const std::function<void(float*)>& rerotate);
  void gather_values(size_t layer, const int32_t* kept, size_t n_kept);

  Shape s_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
  std::vector<size_t> k_off_, v_off_;  // byte offset of each layer's keys and values
  std::vector<size_t> held_from_;      // per layer, see held_from()
  ZeroedBytes k_, v_;  // pages are touched as positions fill
  std::vector<uint8_t> v_converted_;  // one value row in v_type, for the transposed store
};

}  // namespace kiln
