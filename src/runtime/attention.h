#pragma once
// Causal attention of a batch's queries over the KV cache, the same arithmetic whichever
// layout holds the keys and values (runtime/kv_store.h): the store gives the keys and
// values of a range of positions as runs stored contiguously; Q K^T is a gemm per run
// (each score depends only on its key row and query, kernels.h), and P V is one gemm over
// the whole range, the values of several paged blocks first gathered into a row per
// dimension; values stored by position (quantized) go through Ops::pv run by run, which
// adds positions one at a time in order. So a paged cache gives exactly the contiguous
// cache's results.
//
// A batch is a list of query spans: one span for a sequence's prefill or decode, or one
// single-token span per sequence when several sequences decode together. A model whose
// attention is not causal (ModelConfig::causal false: BERT's encoder) lets every query of
// a span see the span's keys after it too; only the direct path does (sessions refuse
// tiled attention and windows for such models).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.h"
#include "kiln/model.h"
#include "runtime/kv_store.h"
#include "runtime/thread_pool.h"

namespace kiln {

// Queries of one sequence at consecutive positions: rows [row, row + n) of Q and of the
// output are positions pos..pos + n - 1 of sequence seq (0 for the contiguous cache).
struct QuerySpan {
  size_t row = 0, n = 0, pos = 0;
  int32_t seq = 0;
  bool all_logits = false;  // LogitRows::span_ends: every row of this span, not only its last
};

// The factor of q . k: ModelConfig::attn_scale, or 1/sqrt(head_dim) when the family sets none.
inline float attention_scale(const ModelConfig& c) {
  return c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(float(c.head_dim));
}

class Attention {
 public:
  // window: per layer (0: global). flash: tiled attention with an online softmax instead
  // of whole score rows.
  Attention(const ModelConfig& c, const std::vector<uint32_t>& window, bool flash, size_t n_ctx, int n_threads,
            const KvStore& kv);

  // out[row] = softmax(softcap(q[row] K^T * scale) (+ ALiBi)) V over the keys each query
  // sees in layer l; q and out are [rows][n_heads * head_dim]. scale: attention_scale(c),
  // softcap: ModelConfig::attn_softcap (0: none). sinks ([n_heads], or nullptr): head h's
  // softmax has one more logit, sinks[h], in its denominator, with no value (gpt-oss).
  void run(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
           const float* sinks = nullptr);

  // Decoding spans (one query each): asks for the lines layer l's new key and value go to,
  // so that they arrive while the caller runs the layer's Q K V projections. Call after
  // the spans' positions are appended.
  void prefetch_step(size_t l, std::span<const QuerySpan> spans) const;

  const std::vector<float>& alibi_slopes() const { return alibi_slope_; }  // [n_heads], empty without ALiBi

 private:
  // Positions [p0, p1) of a sequence as runs (KvStore::for_each_run).
  template <typename F>
  void runs(size_t l, int32_t seq, size_t p0, size_t p1, F&& f) const {
    kv_.for_each_run(l, seq, p0, p1, f);
  }
  size_t v_stride(size_t l) const { return kv_.v_stride(l); }
  bool one_run(size_t l, int32_t seq, size_t p0, size_t p1) const { return p1 <= p0 || kv_.run_room(l, seq, p0) >= p1 - p0; }

  void scores_qk(size_t l, int32_t seq, size_t kvh, const float* x, size_t ldx, size_t nb, float* S, size_t lo,
                 size_t n_keys, bool chain = false) const;
  void scores_v(size_t l, int32_t seq, size_t kvh, const float* S, size_t nb, size_t lo, size_t n_keys, float* out,
                size_t ldo, float* tmp, uint8_t* gathered, bool chain = false) const;
  void gather_values(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, uint8_t* dst) const;
  void prefetch(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n) const;
  void prefetch_keys(const uint8_t* k, size_t kvh, size_t n) const;  // n key rows from k
  void keys_to_f32(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* out) const;
  bool packs_keys(const QuerySpan& sp, uint32_t window) const;
  void pack_keys(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* dst) const;
  void pack_values(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* dst) const;
  bool plain(size_t l) const;

  void direct(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
              const float* sinks);
  void tiled(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
             const float* sinks);
  size_t tile_floats() const;

  const ModelConfig& c_;
  const kernels::Ops& ops_;
  const std::vector<uint32_t>& window_;
  const bool flash_;
  const size_t n_ctx_;
  const KvStore& kv_;
  TensorType k_type_, v_type_;
  bool v_transposed_;
  size_t k_row_bytes_, elem_;  // elem_: bytes of one value when transposed
  std::vector<float> alibi_slope_;

  static constexpr size_t kQueryBlock = 64;  // queries whose scores are held at once
  std::vector<float> scores_;    // [n_threads][kQueryBlock][n_ctx] attention weights (not with flash)
  std::vector<float> ring_out_;  // [n_threads][kQueryBlock][head_dim] a wrapped ring's second P V
  std::vector<uint8_t> gathered_;  // [n_threads][head_dim][n_ctx] values of several blocks (paged, not flash)
  // A prefill span's Q K^T (not flash): each thread packs a KV head's keys once (and in
  // plain chains its values), as packed F32 weights are laid out, and its query heads'
  // blocks read them (plain()).
  static constexpr size_t kPackKeysMinQueries = 64, kPlainMinGroup = 8;
  std::vector<float> packed_kv_;  // per thread: keys, then values, of packed_positions_ positions
  size_t packed_positions_ = 0, packed_keys_floats_ = 0;
  // Tiled attention, per thread: rows are (query head, query) pairs of one KV head.
  static constexpr size_t kTileRows = 256, kTileKeys = 256;
  std::vector<float> tile_scratch_;  // [n_threads][tile_floats()]
  // A decoding query's keys are cut into slices of kSplitKeys positions, one task each.
  static constexpr size_t kSplitKeys = 512;
  std::vector<float> partial_;  // [task][rows][head_dim + 2] split slices' outputs, max and sum
};

}  // namespace kiln
