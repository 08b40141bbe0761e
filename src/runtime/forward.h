#pragma once
// The forward pass of one Model over a batch of tokens (runtime/forward.cpp says how it
// reads). It knows nothing of how the KV cache is laid out: it asks the KvStore to hold
// the new positions and store their keys and values, and Attention to attend over them.
// Its buffers are allocated once here; a run allocates nothing.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "kernels/kernels.h"
#include "kiln/matmul_observer.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "runtime/attention.h"
#include "runtime/kv_store.h"
#include "runtime/recurrent_state.h"
#include "runtime/thread_pool.h"

namespace kiln {

// H2O's heavy-hitter scores while Session::track_attention is on: what each cached
// position of the tracked sequence (spans[0].seq) has received, and the score pass's
// scratch (runtime/kv_compaction.h).
struct ScoreTracking {
  std::vector<float> total;     // [n_ctx]
  std::vector<float> head_acc;  // [n_heads][n_ctx]
  std::vector<float> scratch;   // [n_threads][attention_score_scratch_floats]
  bool on() const { return !total.empty(); }
};

class Forward {
 public:
  // n_batch: the most rows a run takes. flash: tiled attention. window: the sliding window
  // of each cache layer (the attention layers').
  // `state`: the recurrent layers' per-sequence state (runtime/recurrent_state.h).
  Forward(const Model& model, const SessionParams& p, const std::vector<uint32_t>& window, KvStore& kv,
          ThreadPool& pool, int32_t n_ctx, int32_t n_batch, bool flash, RecurrentState& state);

  // Which rows' logits a run writes, in row order: the batch's last, every row, or the
  // last row of each span (one per sequence of a mixed batch; every row of a span marked
  // all_logits, such as a draft being verified).
  // `hidden`: no classifier; every row's final hidden state (after the output norm when
  // the model has one), dim floats a row: what embeddings are pooled from.
  enum class LogitRows { last, all, span_ends, hidden };
  // Runs B tokens, row by row where `spans` says (sequence and position; they cover rows
  // [0, B)), and writes the logits of `rows`; logits_out == nullptr only fills the KV
  // cache. The store holds the new positions (KvStore::append) before anything is
  // computed. With `scores`, adds the attention each position receives.
  void run(const int32_t* tokens, std::span<const QuerySpan> spans, size_t B, float* logits_out, LogitRows rows,
           ScoreTracking* scores);

  // The model layer of cache layer i: the cache holds the attention layers only, in order
  // (runtime/kv_store.h), so a hybrid's layer l is cache layer cache_layer(l).
  size_t model_layer(size_t cache_layer) const { return model_layer_[cache_layer]; }
  // The cos/sin table layer l rotates with ([n_ctx][n_rot/2][2]).
  const std::vector<float>& rope_table(size_t l) const;
  const std::vector<float>& rope_cos_sin() const { return rope_cos_sin_; }
  // KvStateDesc::positions: 0 when keys are rotated as the model's own settings say.
  uint64_t positions_id() const { return positions_id_; }
  // Every weight product of later runs is shown to it first (nullptr: none).
  void set_observer(MatmulObserver* observer) { observer_ = observer; }

 private:
  struct MatmulOut {
    const WeightView& w;
    float* y;
  };
  void matmuls(const float* in, size_t B, std::initializer_list<MatmulOut> outs);
  // y[b] = W x[b] for b < B: one of the products gemms() runs as a single pool job.
  struct GemmJob {
    const WeightView* w = nullptr;
    const float* x = nullptr;
    size_t B = 0;
    float* y = nullptr;
    int64_t expert = -1;  // w's index in its 3-D tensor of experts, for the observer
  };
  void gemms(std::span<const GemmJob> jobs);
  void observe(std::span<const GemmJob> jobs);
  void matmul(const WeightView& w, const float* in, float* out, size_t B) { matmuls(in, B, {{w, out}}); }
  void prepare_activations(TensorType type, const float* in, size_t k, size_t B, void* dst);
  // The next gemms() job's weights, in its order: the pool's idle workers fetch their start.
  void prefetch_next(std::span<const WeightView* const> weights);
  void prefetch_next(std::initializer_list<const WeightView*> weights) { prefetch_next({weights.begin(), weights.size()}); }
  void embed(int32_t token, float* out);
  void table_row(const WeightView& table, size_t r, float* out);
  void norm_rows(const float* in, const WeightView& w, const WeightView& bias, float* out, size_t n, size_t B);
  void add_bias(float* y, const WeightView& bias, size_t n, size_t B);
  void add_rows(float* y, const float* d, size_t n, size_t B);
  void rows_in_parallel(size_t B, FunctionRef<void(size_t, size_t)> fn);
  // The mixture-of-experts FFN of layer L on xb's B rows, into xb (forward_moe.cpp).
  void moe_ffn(const LayerWeights& L, size_t B);
  // The Mamba-2 mixer of SSM layer l on xb's B rows, into xb, each span carrying its
  // sequence's recurrent state (forward_ssm.cpp).
  void ssm_mixer(const LayerWeights& L, size_t l, std::span<const QuerySpan> spans, size_t B);

  const Model& model;
  const ModelConfig& c;
  const kernels::Ops& ops;
  MatmulObserver* observer_ = nullptr;
  KvStore& kv;
  ThreadPool& pool;
  Attention attention;

  uint64_t positions_id_ = 0;
  std::vector<size_t> cache_layer_;  // [n_layers]: each attention layer's index in the cache
  std::vector<size_t> model_layer_;  // [cache layers]: the inverse
  std::vector<float> rope_cos_sin_;  // [n_ctx][n_rot/2][2]
  // The model's sliding-window layers' own table when they rotate with another base
  // (ModelConfig::rope_theta_swa), else empty. It ignores the session's RoPE overrides:
  // those stretch the global layers' context, the local ones never see past their window.
  std::vector<float> rope_cos_sin_swa_;  // [n_ctx][n_rot/2][2]
  // Activations for one batch of B <= n_batch tokens, row-major by token.
  std::vector<float> x;    // [B][dim]    residual stream
  std::vector<float> xb;   // [B][dim]    normed input of a sublayer
  std::vector<float> q;    // [B][n_heads * head_dim]
  std::vector<float> k;    // [B][kv_dim]
  std::vector<float> v;    // [B][kv_dim]
  std::vector<float> att;  // [B][n_heads * head_dim]  attention output before Wo
  std::vector<float> hb;   // [B][ffn_dim] gate, then silu(gate) * up (or up, then gelu(up))
  std::vector<float> hb2;  // [B][ffn_dim] up
  std::vector<float> shexp_y;  // [B][dim] the shared expert's output (only with one)
  // Mixture of experts: router scores, each token's chosen experts and weights (in the
  // order they are summed); the (token, choice) pairs grouped by expert: expert e's rows
  // are [expert_start[e], expert_start[e + 1]) of expert_in/expert_y (and of hb/hb2, which
  // hold B * n_experts_used expert FFN rows), and route_row says where each pair landed.
  std::vector<float> router;            // [B][n_experts]
  std::vector<int32_t> route_expert;    // [B][n_experts_used]
  std::vector<float> route_weight;      // [B][n_experts_used]
  std::vector<uint32_t> route_row;      // [B][n_experts_used]: the pair's row in expert_in/expert_y
  std::vector<uint32_t> expert_start;   // [n_experts + 1]
  std::vector<float> expert_in, expert_y;  // [B * n_experts_used][dim]
  std::vector<int32_t> expert_order;    // [n_experts]: ranking scratch
  std::vector<GemmJob> expert_jobs;     // reserved for 2 * n_experts
  // Mamba-2 layers: the in-projection's rows [z | xBC | dt] (xBC turned into the conv's
  // output in place), and the scan's output y.
  RecurrentState& state;
  std::vector<float> ssm_proj;  // [B][2*d_inner + 2*n_groups*d_state + n_heads]
  std::vector<float> ssm_y;     // [B][d_inner]

  // Quantized weights multiply converted (8-bit) activations: each input is converted
  // once per weight type and shared by the matmuls that read it.
  static constexpr size_t kMaxMatmuls = 3;
  std::vector<uint8_t> prepared;     // [kMaxMatmuls][prepared_stride], from prepared_base
  uint8_t* prepared_base = nullptr;  // 64-byte aligned
  size_t prepared_stride = 0;
  std::vector<kernels::GemmArgs> tasks;  // reserved once; a matmuls() call never allocates
};

}  // namespace kiln
