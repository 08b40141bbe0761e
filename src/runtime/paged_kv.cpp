#include "runtime/paged_kv.h"

#include <cstring>

#include "kiln/error.h"
#include "runtime/kv_cache.h"

namespace kiln {

void PagedKv::check(const Shape& s) {
  if (s.block < 1 || s.block > 1024)
    throw Error("KV block size " + std::to_string(s.block) + " is not supported (1 to 1024 positions)");
  // The same types and widths as the contiguous cache: its check names what is wrong.
  KvCache::check({s.n_layers, s.n_ctx, s.kv_dim, s.head_dim, s.k_type, s.v_type, s.v_transposed, {}});
}

PagedKv::PagedKv(const Shape& shape) : s_(shape) {
  check(s_);
  k_row_bytes_ = KvCache::row_bytes(s_.k_type, s_.kv_dim);
  v_row_bytes_ = KvCache::row_bytes(s_.v_type, s_.kv_dim);
  value_size_ = s_.v_transposed ? KvCache::row_bytes(s_.v_type, 1) : 0;
  v_converted_.resize(v_row_bytes_);
}

PagedKv::Sequence& PagedKv::live(int32_t seq) {
  if (!alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
  return seqs_[size_t(seq)];
}

int32_t PagedKv::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].alive) {
      seqs_[i] = {{}, 0, true};
      return int32_t(i);
    }
  seqs_.push_back({{}, 0, true});
  return int32_t(seqs_.size() - 1);
}

int32_t PagedKv::fork(int32_t from) {
  live(from);
  const int32_t id = add_sequence();  // may move seqs_: look `from` up again
  Sequence& src = seqs_[size_t(from)];
  for (int32_t b : src.blocks) ++refs_[size_t(b)];
  seqs_[size_t(id)].blocks = src.blocks;
  seqs_[size_t(id)].n = src.n;
  blocks_unshared_ += src.blocks.size();
  return id;
}

void PagedKv::release(int32_t seq) {
  truncate(seq, 0);
  seqs_[size_t(seq)].alive = false;
}

void PagedKv::truncate(int32_t seq, size_t n) {
  Sequence& s = live(seq);
  if (n > s.n) throw Error("cannot truncate a KV sequence of " + std::to_string(s.n) + " positions to " + std::to_string(n));
  const size_t keep = (n + s_.block - 1) / s_.block;
  for (size_t i = keep; i < s.blocks.size(); ++i) drop_block(s.blocks[i]);
  blocks_unshared_ -= s.blocks.size() - keep;
  s.blocks.resize(keep);
  s.n = n;
}

int32_t PagedKv::take_block() {
  if (free_.empty()) {
    const size_t first = chunks_.size() * kChunkBlocks;
    chunks_.push_back(std::make_unique<uint8_t[]>(kChunkBlocks * s_.n_layers * layer_block_bytes()));
    refs_.resize(first + kChunkBlocks, 0);
    for (size_t i = kChunkBlocks; i-- > 0;) free_.push_back(int32_t(first + i));  // lowest id first
  }
  const int32_t id = free_.back();
  free_.pop_back();
  refs_[size_t(id)] = 1;
  ++blocks_used_;
  return id;
}

void PagedKv::drop_block(int32_t id) {
  if (--refs_[size_t(id)] > 0) return;
  free_.push_back(id);
  --blocks_used_;
}

int32_t PagedKv::copy_block(int32_t old) {
  const int32_t copy = take_block();
  for (size_t l = 0; l < s_.n_layers; ++l) std::memcpy(block_base(l, copy), block_base(l, old), layer_block_bytes());
  drop_block(old);
  return copy;
}

void PagedKv::unshare(int32_t seq, size_t pos) {
  Sequence& s = live(seq);
  for (size_t i = pos / s_.block; i < s.blocks.size(); ++i)
    if (refs_[size_t(s.blocks[i])] > 1) s.blocks[i] = copy_block(s.blocks[i]);
}

void PagedKv::copy_values(size_t layer, int32_t seq, size_t from, size_t to) {
  const std::vector<int32_t>& table = seqs_[size_t(seq)].blocks;
  const uint8_t* src = block_base(layer, table[from / s_.block]) + s_.block * k_row_bytes_;
  uint8_t* dst = block_base(layer, table[to / s_.block]) + s_.block * k_row_bytes_;
  const size_t i = from % s_.block, j = to % s_.block;
  if (!s_.v_transposed) return (void)std::memcpy(dst + j * v_row_bytes_, src + i * v_row_bytes_, v_row_bytes_);
  const size_t stride = v_stride();
  for (size_t d = 0; d < s_.kv_dim; ++d)
    std::memcpy(dst + d * stride + j * value_size_, src + d * stride + i * value_size_, value_size_);
}

void PagedKv::append(int32_t seq, size_t n) {
  Sequence& s = live(seq);
  if (s.n + n > s_.n_ctx)
    throw Error("KV sequence " + std::to_string(seq) + " is full: " + std::to_string(s.n) + " + " + std::to_string(n) +
                " positions exceed the context size " + std::to_string(s_.n_ctx));
  if (n == 0) return;
  // Only the block holding the first new position can be shared: later ones are new.
  const size_t first = s.n / s_.block;
  if (first < s.blocks.size() && refs_[size_t(s.blocks[first])] > 1) s.blocks[first] = copy_block(s.blocks[first]);
  const size_t need = (s.n + n + s_.block - 1) / s_.block;
  while (s.blocks.size() < need) {
    s.blocks.push_back(take_block());
    ++blocks_unshared_;
  }
  s.n += n;
}

void PagedKv::store(size_t layer, int32_t seq, size_t pos, const float* k, const float* v) {
  const Sequence& s = seqs_[size_t(seq)];
  uint8_t* base = block_base(layer, s.blocks[pos / s_.block]);
  const size_t i = pos % s_.block;
  KvCache::encode_row(s_.k_type, k, s_.kv_dim, base + i * k_row_bytes_);
  uint8_t* values = base + s_.block * k_row_bytes_;
  if (!s_.v_transposed) return KvCache::encode_row(s_.v_type, v, s_.kv_dim, values + i * v_row_bytes_);
  KvCache::encode_row(s_.v_type, v, s_.kv_dim, v_converted_.data());
  const size_t stride = v_stride();
  for (size_t d = 0; d < s_.kv_dim; ++d)
    std::memcpy(values + d * stride + i * value_size_, &v_converted_[d * value_size_], value_size_);
}

}  // namespace kiln
