#pragma once
// The runtime side of KV-cache eviction (Session::evict, Session::track_attention): which
// positions stay, the RoPE turn-back of a moved key, and the attention each cached
// position receives (H2O's heavy-hitter score). The policies themselves live in
// kiln/eviction_policy.h.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/kv_store.h"
#include "runtime/thread_pool.h"

namespace kiln {

// kept = [0, n_past) minus `evicted`, ascending. Throws kiln::Error, kept untouched, unless
// evicted is strictly ascending inside [0, n_past).
void kept_positions(int32_t n_past, std::span<const int32_t> evicted, std::vector<int32_t>& kept);

// The rotation back by a distance whose forward cos/sin pairs are `cos_sin` (a row of the
// session's RoPE table): each pair scaled to unit length (YaRN folds its magnitude into
// the table) and its sine negated. Angles are linear in the position, so this undoes
// exactly that distance.
void turn_back(const float* cos_sin, size_t n_pairs, float* out);

// H2O scores: softmax(softcap(q k^T * scale) (+ ALiBi), sink) of the B new queries of one layer, summed
// over the queries and heads into total[0, pos0 + B). A pass of its own, after attention,
// so the direct and the tiled attention need no change and every cache type works; it
// recomputes Q K^T (the cost of tracking). Deterministic whatever the thread count: a
// head's rows are summed by one thread in query order into head_acc[h], and heads are
// added to total in order.
struct AttentionScorePass {
  const KvStore& kv;
  int32_t seq;
  size_t layer;
  const float* q;  // [B][n_heads * head_dim], RoPE applied
  size_t n_heads, n_kv_heads, head_dim;
  size_t pos0, B;
  const float* alibi_slope;  // [n_heads], or nullptr
  float scale;               // of q . k, as the attention's
  float softcap;             // cap * tanh(s / cap) after the scale, as the attention's; 0: none
  float* scratch;            // [n_threads][scratch_floats(n_ctx, head_dim)]
  float* head_acc;           // [n_heads][n_ctx]
  float* total;              // [n_ctx]
  const float* sinks = nullptr;  // [n_heads]: each head's sink logit (gpt-oss), or nullptr
};
size_t attention_score_scratch_floats(size_t n_ctx, size_t head_dim);
void accumulate_attention_scores(const AttentionScorePass& a, const kernels::Ops& ops, ThreadPool& pool);

}  // namespace kiln
