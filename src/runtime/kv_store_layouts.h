#pragma once
// The two KvStore layouts (runtime/kv_store.h): what each adds to its cache class, the
// sequence bookkeeping and the edits. Only make_kv_store and tests name them.
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/kv_store.h"
#include "runtime/paged_kv.h"

namespace kiln {

// KvCache, one sequence (0) of n_ past positions; rings where `windows` slide.
class ContiguousKvStore final : public KvStore {
 public:
  ContiguousKvStore(const KvCache::Shape& s, const std::vector<uint32_t>& windows);
  KvLayout layout() const override { return KvLayout::contiguous; }
  bool alive(int32_t seq) const override { return seq == 0; }
  size_t length(int32_t seq) const override;
  int32_t add_sequence() override { return fork(0); }
  int32_t fork(int32_t from) override;
  void release(int32_t seq) override;
  size_t truncate(int32_t seq, size_t n) override;
  void append(int32_t seq, size_t n) override;
  void store(size_t layer, int32_t, size_t pos, const float* k, const float* v) override { cache_.store(layer, pos, k, v); }
  void for_each_run(size_t layer, int32_t seq, size_t p0, size_t p1, Run f) const override;
  size_t v_stride(size_t layer) const override;
  size_t run_room(size_t layer, int32_t, size_t p) const override { return wrap_room(layer, p); }
  size_t wrap_room(size_t layer, size_t p) const override { return cache_.capacity(layer) - cache_.slot(layer, p); }
  bool has_rings() const override { return !cache_.shape().layer_ctx.empty(); }
  void shift(int32_t seq, size_t n_keep, size_t n_discard, Rerotate rerotate) override;
  void compact(int32_t seq, const int32_t* kept, size_t n_kept, Rerotate rerotate) override;
  void write_state(int32_t seq, size_t n, Sink sink) const override;
  void read_state(int32_t seq, size_t n, Source source) override;
  KvMemory memory() const override;
  double bytes() const override { return cache_.bytes(); }
  double layer_bytes(size_t layer) const override { return cache_.layer_bytes(layer); }

 private:
  KvCache cache_;
  std::vector<uint32_t> windows_;
  size_t n_ = 0;
};

// PagedKv with sequence 0 added; forks share blocks.
class PagedKvStore final : public KvStore {
 public:
  PagedKvStore(const KvCache::Shape& s, size_t block);
  KvLayout layout() const override { return KvLayout::paged; }
  bool alive(int32_t seq) const override { return kv_.alive(seq); }
  size_t length(int32_t seq) const override;
  int32_t add_sequence() override { return kv_.add_sequence(); }
  int32_t fork(int32_t from) override { return kv_.fork(from); }
  void release(int32_t seq) override;
  size_t truncate(int32_t seq, size_t n) override;
  void append(int32_t seq, size_t n) override { kv_.append(seq, n); }
  void store(size_t layer, int32_t seq, size_t pos, const float* k, const float* v) override {
    kv_.store(layer, seq, pos, k, v);
  }
  void for_each_run(size_t layer, int32_t seq, size_t p0, size_t p1, Run f) const override;
  size_t v_stride(size_t) const override { return kv_.v_stride(); }
  size_t run_room(size_t, int32_t, size_t p) const override { return kv_.block() - p % kv_.block(); }
  size_t wrap_room(size_t, size_t) const override { return std::numeric_limits<size_t>::max(); }
  bool has_rings() const override { return false; }
  void shift(int32_t seq, size_t n_keep, size_t n_discard, Rerotate rerotate) override;
  void compact(int32_t seq, const int32_t* kept, size_t n_kept, Rerotate rerotate) override;
  KvMemory memory() const override;
  double bytes() const override { return kv_.allocated_bytes(); }
  double layer_bytes(size_t) const override { return kv_.allocated_bytes() / double(f_.n_layers); }
  const PagedKv& paged() const { return kv_; }

 private:
  PagedKv kv_;
  std::vector<int32_t> kept_;  // shift()'s positions, reserved once
};

}  // namespace kiln
