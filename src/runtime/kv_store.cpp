#include "runtime/kv_store.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kiln/error.h"
#include "runtime/kv_store_layouts.h"
#include "runtime/sliding_window.h"

namespace kiln {

void KvStore::keys_to_f32(size_t layer, int32_t seq, size_t p0, size_t np, size_t e0, size_t n, float* out,
                          size_t ld) const {
  for_each_run(layer, seq, p0, p0 + np, [&](size_t p, const uint8_t* k, const uint8_t*, size_t m) {
    for (size_t i = 0; i < m; ++i) KvCache::decode_row(f_.k_type, k + i * f_.k_row_bytes, e0, n, out + (p - p0 + i) * ld);
  });
}

uint32_t KvStore::state_type() const {
  return KvCache::state_type_of(f_.k_type, f_.v_type, f_.v_transposed);
}

void KvStore::write_runs(size_t layer, int32_t seq, size_t n, Sink sink) const {
  for_each_run(layer, seq, 0, n, [&](size_t, const uint8_t* k, const uint8_t*, size_t m) { sink(k, m * f_.k_row_bytes); });
  if (!f_.v_transposed) {
    for_each_run(layer, seq, 0, n, [&](size_t, const uint8_t*, const uint8_t* v, size_t m) { sink(v, m * f_.v_row_bytes); });
    return;
  }
  const size_t stride = v_stride(layer);
  for (size_t d = 0; d < f_.kv_dim; ++d)
    for_each_run(layer, seq, 0, n, [&](size_t, const uint8_t*, const uint8_t* v, size_t m) { sink(v + d * stride, m * f_.elem); });
}

void KvStore::write_state(int32_t seq, size_t n, Sink sink) const {
  for (size_t l = 0; l < f_.n_layers; ++l) write_runs(l, seq, n, sink);
}

void KvStore::read_state(int32_t seq, size_t n, Source source) {
  truncate(seq, 0);
  append(seq, n);
  // The runs point into this store's own rows, made writable by append().
  const auto to = [](const uint8_t* p) { return const_cast<uint8_t*>(p); };
  for (size_t l = 0; l < f_.n_layers; ++l) {
    for_each_run(l, seq, 0, n, [&](size_t, const uint8_t* k, const uint8_t*, size_t m) { source(to(k), m * f_.k_row_bytes); });
    if (!f_.v_transposed) {
      for_each_run(l, seq, 0, n, [&](size_t, const uint8_t*, const uint8_t* v, size_t m) { source(to(v), m * f_.v_row_bytes); });
      continue;
    }
    const size_t stride = v_stride(l);
    for (size_t d = 0; d < f_.kv_dim; ++d)
      for_each_run(l, seq, 0, n, [&](size_t, const uint8_t*, const uint8_t* v, size_t m) { source(to(v + d * stride), m * f_.elem); });
  }
}

namespace {

KvStore::Format format_of(const KvCache::Shape& s) {
  KvStore::Format f;
  f.n_layers = s.n_layers, f.kv_dim = s.kv_dim, f.head_dim = s.head_dim, f.n_ctx = s.n_ctx;
  f.k_type = s.k_type, f.v_type = s.v_type, f.v_transposed = s.v_transposed;
  f.k_row_bytes = KvCache::row_bytes(s.k_type, s.kv_dim);
  f.v_row_bytes = KvCache::row_bytes(s.v_type, s.kv_dim);
  f.elem = s.v_transposed ? KvCache::row_bytes(s.v_type, 1) : 0;
  return f;
}

[[noreturn]] void no_sequence(int32_t seq) { throw Error("KV sequence " + std::to_string(seq) + " does not exist"); }

}  // namespace

// ---- contiguous ----

ContiguousKvStore::ContiguousKvStore(const KvCache::Shape& s, const std::vector<uint32_t>& windows)
    : KvStore(format_of(s)), cache_(s), windows_(windows) {}

size_t ContiguousKvStore::length(int32_t seq) const {
  if (seq != 0) no_sequence(seq);
  return n_;
}

int32_t ContiguousKvStore::fork(int32_t) {
  throw Error("several KV sequences (forks, --parallel) need the paged KV layout (--kv-layout paged)");
}

void ContiguousKvStore::release(int32_t seq) { truncate(seq, 0); }

size_t ContiguousKvStore::truncate(int32_t seq, size_t n) {
  if (seq != 0) no_sequence(seq);
  // A ring that has overwritten keys position n's window needs cannot go back there.
  for (size_t l = 0; l < f_.n_layers; ++l)
    if (cache_.is_ring(l) && window_start(n, windows_[l]) < cache_.held_from(l)) n = 0;
  n_ = n;
  cache_.truncated(n);
  return n;
}

void ContiguousKvStore::append(int32_t seq, size_t n) {
  if (seq != 0) no_sequence(seq);
  if (n_ + n > f_.n_ctx)
    throw Error("KV sequence 0 is full: " + std::to_string(n_) + " + " + std::to_string(n) +
                " positions exceed the context size " + std::to_string(f_.n_ctx));
  n_ += n;
}

void ContiguousKvStore::for_each_run(size_t layer, int32_t, size_t p0, size_t p1, Run f) const {
  cache_.for_each_run(layer, p0, p1, [&](size_t p, size_t slot, size_t n) {
    f(p, cache_.k_row(layer, slot), f_.v_transposed ? cache_.vt(layer) + slot * f_.elem : cache_.v_row(layer, slot), n);
  });
}

size_t ContiguousKvStore::v_stride(size_t layer) const {
  return f_.v_transposed ? cache_.vt_row_bytes(layer) : cache_.v_row_bytes();
}

void ContiguousKvStore::shift(int32_t seq, size_t n_keep, size_t n_discard, Rerotate rerotate) {
  if (seq != 0) no_sequence(seq);
  // A ring layer must still hold every position the next query's window reaches: kept
  // ones as they are, moved ones n_discard later (KvCache::shift rebuilds it from those).
  const size_t n_new = n_ - n_discard;
  for (size_t l = 0; l < f_.n_layers; ++l) {
    if (!cache_.is_ring(l)) continue;
    const size_t from = window_start(n_new, windows_[l]), held = cache_.held_from(l), moved = std::max(from, n_keep);
    if ((from < n_keep && from < held) || (moved < n_new && moved + n_discard < held))
      throw Error("cannot shift the context: the sliding window of layer " + std::to_string(l) + " (" +
                  std::to_string(windows_[l]) + ") would reach kept positions its ring buffer no longer holds; keep fewer "
                  "tokens (--keep) or keep a full-size cache (--swa-full)");
  }
  cache_.shift(n_keep, n_discard, n_, [&](size_t l, float* row) { rerotate(l, row, n_discard); });
  n_ = n_new;
}

void ContiguousKvStore::compact(int32_t seq, const int32_t* kept, size_t n_kept, Rerotate rerotate) {
  if (seq != 0) no_sequence(seq);
  cache_.compact(kept, n_kept, [&](size_t l, float* row, size_t delta) { rerotate(l, row, delta); });
  n_ = n_kept;
}

void ContiguousKvStore::write_state(int32_t seq, size_t n, Sink sink) const {
  if (seq != 0) no_sequence(seq);
  for (size_t l = 0; l < f_.n_layers; ++l) cache_.write_state(l, n, sink);  // rings: zeros for what they dropped
}

void ContiguousKvStore::read_state(int32_t seq, size_t n, Source source) {
  if (seq != 0) no_sequence(seq);
  n_ = 0;
  for (size_t l = 0; l < f_.n_layers; ++l) cache_.read_state(l, n, source);
  n_ = n;
}

KvMemory ContiguousKvStore::memory() const {
  KvMemory m;
  m.bytes_used = m.bytes_unshared = m.bytes_allocated = cache_.bytes();
  return m;
}

// ---- paged ----

PagedKvStore::PagedKvStore(const KvCache::Shape& s, size_t block)
    : KvStore(format_of(s)),
      kv_({s.n_layers, s.kv_dim, s.head_dim, s.k_type, s.v_type, s.v_transposed, block, s.n_ctx}) {
  kv_.add_sequence();
  kept_.reserve(s.n_ctx);
}

size_t PagedKvStore::length(int32_t seq) const {
  if (!kv_.alive(seq)) no_sequence(seq);
  return kv_.length(seq);
}

void PagedKvStore::release(int32_t seq) {
  if (!kv_.alive(seq)) no_sequence(seq);
  if (seq == 0) kv_.truncate(0, 0);
  else kv_.release(seq);
}

size_t PagedKvStore::truncate(int32_t seq, size_t n) {
  kv_.truncate(seq, n);
  return n;
}

void PagedKvStore::for_each_run(size_t layer, int32_t seq, size_t p0, size_t p1, Run f) const {
  kv_.for_each_run(layer, seq, p0, p1, f);
}

// Rows only move down (kept[i] >= i): in place, in order, each destination block made
// private first so that sequences sharing it keep theirs.
void PagedKvStore::compact(int32_t seq, const int32_t* kept, size_t n_kept, Rerotate rerotate) {
  size_t first = 0;
  while (first < n_kept && size_t(kept[first]) == first) ++first;
  if (first < n_kept) kv_.unshare(seq, first);
  float row[KvCache::kMaxRow];
  for (size_t l = 0; l < f_.n_layers; ++l)
    for (size_t i = first; i < n_kept; ++i) {
      const size_t from = size_t(kept[i]);
      KvCache::decode_row(f_.k_type, kv_.key_row(l, seq, from), 0, f_.kv_dim, row);
      rerotate(l, row, from - i);
      KvCache::encode_row(f_.k_type, row, f_.kv_dim, kv_.key_row(l, seq, i));
      kv_.copy_values(l, seq, from, i);
    }
  kv_.truncate(seq, n_kept);
}

void PagedKvStore::shift(int32_t seq, size_t n_keep, size_t n_discard, Rerotate rerotate) {
  const size_t n = length(seq);
  kept_.clear();
  for (size_t p = 0; p < n; ++p)
    if (p < n_keep || p >= n_keep + n_discard) kept_.push_back(int32_t(p));
  compact(seq, kept_.data(), kept_.size(), rerotate);
}

KvMemory PagedKvStore::memory() const {
  KvMemory m;
  const double block = kv_.block_bytes();
  m.blocks_used = int64_t(kv_.blocks_used());
  m.blocks_unshared = int64_t(kv_.blocks_unshared());
  m.bytes_used = double(m.blocks_used) * block;
  m.bytes_unshared = double(m.blocks_unshared) * block;
  m.bytes_allocated = kv_.allocated_bytes();
  return m;
}

std::unique_ptr<KvStore> make_kv_store(KvLayout layout, const KvCache::Shape& s, const std::vector<uint32_t>& windows,
                                       size_t block) {
  if (layout == KvLayout::contiguous) return std::make_unique<ContiguousKvStore>(s, windows);
  // Sliding-window layers hold every position here (attention masks what a window does
  // not reach): blocks are shared by all layers, so a window's old positions could only
  // be freed where every layer slides.
  return std::make_unique<PagedKvStore>(s, block);
}

}  // namespace kiln
