#pragma once
// Paged KV cache (PagedAttention, Kwon et al. 2023): keys and values live in fixed-size
// blocks of `block` positions taken from a pool on demand, and each sequence maps its
// positions to blocks through a block table. Sequences forked from one another share
// the blocks of their common prefix (reference counts); the first write into a shared
// block copies it for the writer (copy-on-write), so N samples of one prompt hold the
// prompt once.
//
// A block id names the same block in every layer: one table per sequence serves all
// layers. Inside a block, per layer, keys are rows by position ([block][kv_dim]) and
// values of one-value types are transposed ([kv_dim][block], each dimension's run of
// positions contiguous, as in KvCache, so P V stays a gemm); block-quantized values are
// rows by position (tiled attention converts them).
//
// Storage grows in chunks of kChunkBlocks blocks and is only given back when the cache is
// destroyed: freed blocks go to a free list and are reused, so the per-token path
// allocates only when the pool grows.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/tensor_type.h"

namespace kiln {

class PagedKv {
 public:
  struct Shape {
    size_t n_layers = 0, kv_dim = 0, head_dim = 0;
    TensorType k_type = TensorType::F32, v_type = TensorType::F32;
    bool v_transposed = true;
    size_t block = 16;  // positions per block
    size_t n_ctx = 0;   // positions one sequence may hold
  };
  static constexpr size_t kChunkBlocks = 8;

  // Throws kiln::Error for types or sizes KvCache would refuse, or a block size outside [1, 1024].
  explicit PagedKv(const Shape& shape);
  static void check(const Shape& shape);

  const Shape& shape() const { return s_; }
  size_t block() const { return s_.block; }
  size_t k_row_bytes() const { return k_row_bytes_; }
  size_t v_row_bytes() const { return v_row_bytes_; }
  // One block of one layer, keys and values.
  size_t layer_block_bytes() const { return s_.block * (k_row_bytes_ + v_row_bytes_); }
  // One block in every layer: what a block id costs.
  double block_bytes() const { return double(layer_block_bytes()) * double(s_.n_layers); }

  // Sequences. Ids are small integers, reused after release.
  int32_t add_sequence();                // empty
  int32_t fork(int32_t from);            // holds the same positions, sharing every block
  void release(int32_t seq);             // its blocks lose a reference; the id is free
  void truncate(int32_t seq, size_t n);  // keeps positions [0, n)
  bool alive(int32_t seq) const { return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].alive; }
  size_t length(int32_t seq) const { return seqs_.at(size_t(seq)).n; }
  // Makes positions [length(seq), length(seq) + n) writable and counts them held: new
  // blocks past the table's end, and a private copy of the last block if it is shared
  // (copy-on-write; the copy takes every layer). Throws kiln::Error past n_ctx.
  void append(int32_t seq, size_t n);
  // Converts and stores the keys and values (kv_dim floats each) of a position made
  // writable by append().
  void store(size_t layer, int32_t seq, size_t pos, const float* k, const float* v);

  // Positions [p0, p1) of a sequence as runs inside one block each, in order:
  // f(first position, its key row, its values, length). Key row i of a run is at
  // k + i * k_row_bytes(); values transposed: dimension d of position i at
  // v + d * v_stride() + i * value size, else value row i at v + i * v_row_bytes().
  template <typename F>
  void for_each_run(size_t layer, int32_t seq, size_t p0, size_t p1, F&& f) const {
    const std::vector<int32_t>& table = seqs_[size_t(seq)].blocks;
    while (p0 < p1) {
      const size_t i = p0 % s_.block, n = std::min(p1 - p0, s_.block - i);
      const uint8_t* base = block_base(layer, table[p0 / s_.block]);
      const uint8_t* v = base + s_.block * k_row_bytes_;
      f(p0, base + i * k_row_bytes_, v + i * (s_.v_transposed ? value_size_ : v_row_bytes_), n);
      p0 += n;
    }
  }
  size_t v_stride() const { return s_.v_transposed ? s_.block * value_size_ : v_row_bytes_; }

  // Editing in place (eviction, context shifts): a sequence's blocks holding positions
  // from `pos` on, copied where shared (copy-on-write, every layer), so that writes into
  // them leave the other sequences' rows as they were.
  void unshare(int32_t seq, size_t pos);
  // Key row of a position (after unshare(), writable).
  uint8_t* key_row(size_t layer, int32_t seq, size_t pos) const {
    const size_t i = pos % s_.block;
    return block_base(layer, seqs_[size_t(seq)].blocks[pos / s_.block]) + i * k_row_bytes_;
  }
  // Copies the values of position `from` to position `to` of the same sequence.
  void copy_values(size_t layer, int32_t seq, size_t from, size_t to);

  // Memory. Blocks referenced by some sequence (each counted once), the blocks the same
  // sequences would hold without sharing (the sum of their tables), and the pool's
  // allocation (free blocks included).
  size_t blocks_used() const { return blocks_used_; }
  size_t blocks_unshared() const { return blocks_unshared_; }
  double allocated_bytes() const { return double(chunks_.size() * kChunkBlocks) * block_bytes(); }
  uint32_t refs(int32_t block) const { return refs_.at(size_t(block)); }
  const std::vector<int32_t>& table(int32_t seq) const { return seqs_.at(size_t(seq)).blocks; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    size_t n = 0;  // positions held
    bool alive = false;
  };
  uint8_t* block_base(size_t layer, int32_t id) const {
    return chunks_[size_t(id) / kChunkBlocks].get() + (layer * kChunkBlocks + size_t(id) % kChunkBlocks) * layer_block_bytes();
  }
  int32_t take_block();
  int32_t copy_block(int32_t id);  // a private copy of block id, which loses a reference
  void drop_block(int32_t id);
  Sequence& live(int32_t seq);

  Shape s_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0, value_size_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;  // [layer][kChunkBlocks][keys, values]
  std::vector<uint32_t> refs_;                      // per block id
  std::vector<int32_t> free_;                       // ids with no reference
  std::vector<Sequence> seqs_;
  size_t blocks_used_ = 0, blocks_unshared_ = 0;
  std::vector<uint8_t> v_converted_;  // one value row in v_type, for the transposed store
};

}  // namespace kiln
