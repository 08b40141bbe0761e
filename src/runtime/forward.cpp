// The forward pass (runtime/forward.h). Reads top to bottom like the paper: embed -> for
// each layer (RMSNorm -> Q,K,V -> RoPE -> cache -> causal attention -> Wo -> residual,
// RMSNorm -> SwiGLU FFN -> residual) -> final RMSNorm -> logits.
// A call processes a batch of tokens at once (prefill is matrix x matrix).
// Families differ only by ModelConfig flags read here: LayerNorm instead of RMSNorm,
// optional biases, Q/K/V clamping and Q/K norms (per row or per head), ALiBi instead of
// RoPE, GELU MLP, GeGLU or clamped SwiGLU, scaled embeddings, post-norms, a final soft-cap,
// a second RoPE table for sliding-window layers, Granite's residual and logit multipliers
// (the attention's scale, soft-cap and sinks: runtime/attention.h), and BERT's encoder:
// token type and learned position rows added to the input, a norm of the input, blocks
// normed after each residual sum instead of before each sublayer, attention that is not
// causal (runtime/attention.h), and the hidden states as the output (LogitRows::hidden).
// A layer whose mixer is a Mamba-2 SSM (ModelConfig::layer_mixer) runs it instead of
// attention (forward_ssm.cpp), and a block without ffn_norm and ffn_down has no FFN. The KV cache holds
// the attention layers only: layer l stores and reads cache layer cache_layer_[l].
#include "runtime/forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/quant.h"
#include "kiln/error.h"
#include "runtime/kv_compaction.h"
#include "runtime/rope.h"
#include "runtime/soft_cap.h"
#include "runtime/swiglu_clamped.h"
#include "util/hash64.h"

namespace kiln {
namespace {

// 0 when a session rotates keys exactly as the model's own settings say, else a hash of
// the settings: saved caches are only reused under the same angles.
uint64_t rope_identity(const RopeConfig& r, const RopeConfig& model_default) {
  const auto same = [](const RopeConfig& a, const RopeConfig& b) {
    return a.scaling == b.scaling && a.n_rot == b.n_rot && a.factor == b.factor && a.freq_base == b.freq_base &&
           a.freq_scale == b.freq_scale && a.ext_factor == b.ext_factor && a.attn_factor == b.attn_factor &&
           a.orig_ctx == b.orig_ctx && a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow &&
           a.freq_factors == b.freq_factors;
  };
  if (same(r, model_default)) return 0;
  Hash64 h(0x726f7065);
  const auto add = [&](double v) { h.update(&v, sizeof v); };
  add(double(r.scaling)), add(r.n_rot), add(r.factor), add(r.freq_base), add(r.freq_scale), add(r.ext_factor);
  add(r.attn_factor), add(r.orig_ctx), add(r.beta_fast), add(r.beta_slow);
  h.update(r.freq_factors.data(), r.freq_factors.size() * sizeof(float));
  return h.digest() | 1;  // never 0
}

}  // namespace

Forward::Forward(const Model& m, const SessionParams& p, const std::vector<uint32_t>& window, KvStore& kv_store,
                 ThreadPool& thread_pool, int32_t n_ctx, int32_t n_batch, bool flash, RecurrentState& recurrent)
    : model(m), c(m.config()), ops(kernels::ops()), kv(kv_store), pool(thread_pool),
      attention(m.config(), window, flash, size_t(n_ctx), thread_pool.size(), kv_store), state(recurrent) {
  // A learned position table has a row per position the model was trained for, no more.
  if (c.positions == Positions::learned && size_t(n_ctx) > m.pos_embd.rows)
    throw Error("a context of " + std::to_string(n_ctx) + " tokens is more than the model's " +
                std::to_string(m.pos_embd.rows) + " learned positions (context_length); lower -c");
  cache_layer_.assign(c.n_layers, SIZE_MAX);
  for (size_t l = 0; l < c.n_layers; ++l)
    if (!c.is_ssm(l)) cache_layer_[l] = model_layer_.size(), model_layer_.push_back(l);
  const size_t B = n_batch, q_dim = size_t(c.n_heads) * c.head_dim, kv_dim = kv.format().kv_dim;
  x.resize(B * c.dim);
  xb.resize(B * c.dim);
  q.resize(B * q_dim);
  k.resize(B * kv_dim);
  v.resize(B * kv_dim);
  att.resize(B * q_dim);
  const size_t ffn_max = std::max({c.ffn_dim, c.expert_ffn_dim * c.n_experts_used, c.shared_expert_ffn_dim});
  hb.resize(B * ffn_max);
  hb2.resize(B * ffn_max);
  if (c.shared_expert_ffn_dim > 0) shexp_y.resize(B * c.dim);
  if (c.n_experts > 0) {
    router.resize(B * c.n_experts);
    route_expert.resize(B * c.n_experts_used);
    route_weight.resize(B * c.n_experts_used);
    expert_in.resize(B * c.n_experts_used * c.dim);
    expert_y.resize(B * c.n_experts_used * c.dim);
    route_row.resize(B * c.n_experts_used);
    expert_start.resize(c.n_experts + 1);
    expert_order.resize(c.n_experts);
    expert_jobs.reserve(2 * c.n_experts);
  }
  if (!state.empty()) {
    ssm_proj.resize(B * (c.ssm_d_inner + c.ssm_conv_dim() + c.ssm_n_heads));
    ssm_y.resize(B * c.ssm_d_inner);
  }
  size_t max_rows = m.output.rows;
  const auto size_for = [&](const WeightView& w) {
    if (w.packed) prepared_stride = std::max(prepared_stride, (ops.prepared_bytes(w.type, w.cols, B) + 63) / 64 * 64);
    max_rows = std::max<size_t>(max_rows, w.rows);
  };
  size_for(m.output);
  for (const LayerWeights& L : m.layers) {
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.ffn_gate_inp, &L.ssm_in,
                                &L.ssm_out, &L.gate_shexp, &L.up_shexp, &L.down_shexp})
      size_for(*w);
    for (const auto* experts : {&L.gate_exps, &L.up_exps, &L.down_exps})
      for (const WeightView& w : *experts) size_for(w);
  }
  prepared.resize(kMaxMatmuls * prepared_stride + 64);
  prepared_base = prepared.data() + (64 - reinterpret_cast<uintptr_t>(prepared.data()) % 64) % 64;
  size_t max_expert_rows = 0;
  if (!m.layers.empty() && !m.layers[0].gate_exps.empty())
    max_expert_rows = std::max(m.layers[0].gate_exps[0].rows, m.layers[0].down_exps[0].rows);
  tasks.reserve(std::max(kMaxMatmuls * (max_rows / 16 + 1), 2 * c.n_experts * (max_expert_rows / 16 + 1)));

  // Computed in double once for every position, RoPE scaling included (runtime/rope.h).
  // Against the model's settings without a context: a LongRoPE session whose context
  // picks the long factors gets an identity of its own.
  const RopeConfig rope_config = resolve_rope(c, p.rope, n_ctx);
  positions_id_ = rope_identity(rope_config, resolve_rope(c, {}));
  rope_cos_sin_ = rope_cos_sin_table(rope_config, n_ctx);
  if (c.rope_theta_swa > 0) {
    RopeConfig local;
    local.n_rot = c.n_rot;
    local.freq_base = c.rope_theta_swa;
    rope_cos_sin_swa_ = rope_cos_sin_table(local, n_ctx);
  }
}

// y_i[b] = W_i x[b] for every pair (all W_i have x's width), as one job for the pool.
void Forward::matmuls(const float* in, size_t B, std::initializer_list<MatmulOut> outs) {
  GemmJob jobs[kMaxMatmuls];
  size_t n = 0;
  for (const MatmulOut& o : outs) jobs[n++] = {&o.w, in, B, o.y};
  gemms({jobs, n});
}

// Every job's y = W x as one job for the pool: rows of all matrices are cut into chunks
// that threads take in turn. Tiny work stays on one thread: waking the pool costs more
// than the arithmetic.
void Forward::gemms(std::span<const GemmJob> jobs) {
  if (observer_) observe(jobs);
  const void* prepared_for[kMaxMatmuls] = {};
  const float* prepared_in[kMaxMatmuls] = {};
  TensorType prepared_type[kMaxMatmuls];
  size_t n_prepared = 0, work = 0;
  for (const GemmJob& j : jobs) work += j.w->rows * j.w->cols * j.B;
  tasks.clear();
  size_t left = work;
  const size_t threads = size_t(pool.size());
  for (const GemmJob& j : jobs) {
    const WeightView& w = *j.w;
    kernels::GemmArgs a{w.type, w.data, w.row_bytes, j.x, w.cols, j.y, w.rows, w.cols, j.B, 0, w.rows, w.packed};
    if (w.packed && ops.prepared_bytes(w.type, w.cols, j.B) > 0) {
      size_t slot = 0;
      while (slot < n_prepared && (prepared_type[slot] != w.type || prepared_in[slot] != j.x)) ++slot;
      if (slot == n_prepared && n_prepared < kMaxMatmuls) {
        void* dst = prepared_base + slot * prepared_stride;
        prepare_activations(w.type, j.x, w.cols, j.B, dst);
        prepared_type[slot] = w.type, prepared_in[slot] = j.x, prepared_for[slot] = dst, ++n_prepared;
      }
      if (slot < n_prepared) a.x_prepared = prepared_for[slot];
    }
    // Guided split: each chunk is a share of the work still left in the whole job, so
    // the first chunks are long runs the prefetchers stream well and the last ones are
    // short, and the threads reach the barrier together. Rows come in whole 16-row
    // packed groups, at least ~32 KiB of weights; float weights in 48 (three packed
    // groups, the packed float prefill tile; six rows, the file layout's).
    const size_t align = w.packed && !is_float_type(w.type) ? 16 : 48;
    const size_t row_work = w.cols * j.B;
    const size_t min_rows = std::max<size_t>(align, ((32u << 10) / std::max<size_t>(w.row_bytes, 1) + align - 1) / align * align);
    for (size_t r0 = 0; r0 < w.rows;) {
      const size_t want = (left / (2 * threads) / row_work + align - 1) / align * align;
      const size_t n = std::min(w.rows - r0, std::max(want, min_rows));
      a.r0 = r0;
      a.r1 = r0 + n;
      tasks.push_back(a);
      r0 += n;
      left -= n * row_work;
    }
  }
  if (work < 64 * 1024 || pool.size() == 1) {
    for (const kernels::GemmArgs& t : tasks) ops.gemm(t);
    return;
  }
  pool.parallel_for_dynamic(tasks.size(), 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) ops.gemm(tasks[t]);
  });
}

// Each job's input, once per weight tensor: the matrices cut from one fused tensor (wq,
// wk, wv of attn_qkv; gate and up of phi3's ffn_up) read the same rows in the same call.
void Forward::observe(std::span<const GemmJob> jobs) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GemmJob& j = jobs[i];
    bool seen = !j.w->info || j.B == 0;
    for (size_t k = 0; k < i && !seen; ++k)
      seen = jobs[k].w->info == j.w->info && jobs[k].x == j.x && jobs[k].expert == j.expert;
    if (!seen) observer_->on_matmul(*j.w->info, j.expert, j.x, j.B);
  }
}

// Between two matmuls of a decoding step the caller's thread runs a few µs alone (norms,
// RoPE, the KV store, routing) while the other threads wait and memory is idle: they
// fetch the first bytes of the next job meanwhile, its first tasks' share of each matrix.
void Forward::prefetch_next(std::span<const WeightView* const> weights) {
  static const size_t budget = [] {
    const char* kb = std::getenv("KILN_PREFETCH_KB");
    return size_t(kb ? std::max(0, std::atoi(kb)) : 1024) << 10;
  }();
  ThreadPool::ByteRange ranges[ThreadPool::kMaxHints];
  size_t n = 0, left = budget;
  const size_t first_tasks = std::max<size_t>(1, std::min(weights.size(), size_t(pool.size())));
  for (const WeightView* w : weights) {
    if (!w || !*w || n == ThreadPool::kMaxHints || left == 0) continue;
    const size_t bytes = w->packed ? ops.packed_bytes(w->type, w->rows, w->cols) : w->rows * w->row_bytes;
    ranges[n] = {w->data, std::min({bytes, budget / first_tasks, left})};
    left -= ranges[n++].bytes;
  }
  pool.prefetch_while_idle(ranges, n);
}

void Forward::prepare_activations(TensorType type, const float* in, size_t k, size_t B, void* dst) {
  rows_in_parallel(B, [&](size_t b0, size_t b1) { ops.prepare(type, in, k, k, b0, b1, dst); });
}

// Row-wise work of a batch: each row's result is the same whichever thread makes it.
// Prefill's norms, RoPE, residual adds and SwiGLU ran on one thread while the other
// waited (1.1B Q4_0 pp512: 64 of 1120 ms outside matmuls and attention).
void Forward::rows_in_parallel(size_t B, FunctionRef<void(size_t, size_t)> fn) {
  if (B < 8 || pool.size() == 1) fn(0, B);
  else pool.parallel_for(B, 1, fn);
}


// The cos/sin table layer l rotates with.
const std::vector<float>& Forward::rope_table(size_t l) const {
  const bool local = !rope_cos_sin_swa_.empty() && l < c.swa_window.size() && c.swa_window[l] > 0;
  return local ? rope_cos_sin_swa_ : rope_cos_sin_;
}


// Row r of a [rows][dim] table (token, token type or position embeddings) as floats.
void Forward::table_row(const WeightView& table, size_t r, float* out) {
  const uint8_t* row = static_cast<const uint8_t*>(table.data) + r * table.row_bytes;
  switch (table.type) {
    case TensorType::F32: std::copy_n(reinterpret_cast<const float*>(row), c.dim, out); break;
    case TensorType::F16: ops.fp16_to_f32(reinterpret_cast<const uint16_t*>(row), out, c.dim); break;
    case TensorType::BF16: ops.bf16_to_f32(reinterpret_cast<const uint16_t*>(row), out, c.dim); break;
    default: kernels::ref::dequantize_row(table.type, row, out, c.dim); break;
  }
}

void Forward::embed(int32_t token, float* out) {
  table_row(model.token_embd, size_t(token), out);
  if (c.embed_scale != 1.0f) ops.scale(out, c.embed_scale, c.dim);
}

// out[b] = norm(in[b]) * w (+ bias) for B rows of n floats: the family's norm.
void Forward::norm_rows(const float* in, const WeightView& w, const WeightView& bias, float* out, size_t n, size_t B) {
  const float* weight = static_cast<const float*>(w.data);
  const float* b_data = static_cast<const float*>(bias.data);  // nullptr without a bias
  rows_in_parallel(B, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      if (c.norm == Norm::layer) {
        ops.layernorm(in + b * n, weight, b_data, out + b * n, n, c.rms_eps);
      } else {
        ops.rmsnorm(in + b * n, weight, out + b * n, n, c.rms_eps);
        if (b_data) ops.add(out + b * n, b_data, out + b * n, n);
      }
    }
  });
}
// y[b] += d[b] for B rows of n floats (the residual stream).
void Forward::add_rows(float* y, const float* d, size_t n, size_t B) {
  rows_in_parallel(B, [&](size_t b0, size_t b1) { ops.add(y + b0 * n, d + b0 * n, y + b0 * n, (b1 - b0) * n); });
}
// y[b] += bias for B rows of n floats; nothing when the family has no such bias.
void Forward::add_bias(float* y, const WeightView& bias, size_t n, size_t B) {
  if (!bias) return;
  rows_in_parallel(B, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) ops.add(y + b * n, static_cast<const float*>(bias.data), y + b * n, n);
  });
}


void Forward::run(const int32_t* tokens, std::span<const QuerySpan> spans, size_t B, float* logits_out, LogitRows rows,
                  ScoreTracking* scores) {
  const size_t dim = c.dim, hd = c.head_dim, ffn = c.ffn_dim;
  const size_t q_dim = size_t(c.n_heads) * hd, kv_dim = kv.format().kv_dim;
  for (const QuerySpan& sp : spans) kv.append(sp.seq, sp.n);
  const size_t pos0 = spans[0].pos;  // with H2O tracking: the one span's
  if (scores) std::fill_n(&scores->total[pos0], B, 0.0f);

  for (size_t b = 0; b < B; ++b) embed(tokens[b], &x[b * dim]);
  // BERT's input: + token type 0's row, + the learned position's row, then a LayerNorm
  // (xb is free scratch until the first layer).
  if (model.token_types) {
    table_row(model.token_types, 0, xb.data());
    for (size_t b = 0; b < B; ++b) ops.add(&x[b * dim], xb.data(), &x[b * dim], dim);
  }
  if (c.positions == Positions::learned)
    for (const QuerySpan& sp : spans)
      for (size_t b = sp.row, pos = sp.pos; b < sp.row + sp.n; ++b, ++pos) {
        table_row(model.pos_embd, pos, &xb[b * dim]);
        ops.add(&x[b * dim], &xb[b * dim], &x[b * dim], dim);
      }
  if (model.token_embd_norm) norm_rows(x.data(), model.token_embd_norm, model.token_embd_norm_b, x.data(), dim, B);

  // Layer l's first matmul: its mixer's input projections.
  const auto prefetch_mixer = [&](size_t l) {
    const LayerWeights& L = model.layers[l];
    if (c.is_ssm(l)) prefetch_next({&L.ssm_in});
    else prefetch_next({&L.wq, &L.wk, &L.wv});
  };
  for (size_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = model.layers[l];
    prefetch_mixer(l);
    // Pre-norm blocks norm the sublayer's input; post-norm ones (BERT) take x as it is.
    const float* in = x.data();
    if (L.attn_norm) norm_rows(x.data(), L.attn_norm, L.attn_norm_b, xb.data(), dim, B), in = xb.data();

    const size_t cl = cache_layer_[l];
    if (c.is_ssm(l)) {
      ssm_mixer(L, l, spans, B);
    } else {
    attention.prefetch_step(cl, spans);
    matmuls(in, B, {{L.wq, q.data()}, {L.wk, k.data()}, {L.wv, v.data()}});
    prefetch_next({&L.wo});
    add_bias(q.data(), L.bq, q_dim, B);
    add_bias(k.data(), L.bk, kv_dim, B);
    add_bias(v.data(), L.bv, kv_dim, B);
    if (c.clamp_kqv > 0) {  // MPT's clip_qkv, which bounded the attention logits in training
      const auto clamp = [&](std::vector<float>& t, size_t n) {
        for (size_t i = 0; i < B * n; ++i) t[i] = std::clamp(t[i], -c.clamp_kqv, c.clamp_kqv);
      };
      clamp(q, q_dim), clamp(k, kv_dim), clamp(v, kv_dim);
    }
    if (L.q_norm) {  // over each token's whole Q and K rows (qk_ln), or over each head
      const size_t qn = L.q_norm.cols, kn = L.k_norm.cols;
      norm_rows(q.data(), L.q_norm, L.q_norm_b, q.data(), qn, B * q_dim / qn);
      norm_rows(k.data(), L.k_norm, L.k_norm_b, k.data(), kn, B * kv_dim / kn);
    }
    if (c.positions == Positions::rope) {
      const std::vector<float>& rope = rope_table(l);
      for (const QuerySpan& sp : spans)
        rows_in_parallel(sp.n, [&](size_t i0, size_t i1) {
          for (size_t i = i0; i < i1; ++i) {
            const float* cs = &rope[(sp.pos + i) * (c.n_rot / 2) * 2];
            ops.rope(&q[(sp.row + i) * q_dim], c.n_heads, hd, c.n_rot, cs, c.rope_neox);
            ops.rope(&k[(sp.row + i) * kv_dim], c.n_kv_heads, hd, c.n_rot, cs, c.rope_neox);
          }
        });
    }
    for (const QuerySpan& sp : spans)
      for (size_t b = sp.row, pos = sp.pos; b < sp.row + sp.n; ++b, ++pos)
        kv.store(cl, sp.seq, pos, &k[b * kv_dim], &v[b * kv_dim]);
    attention.run(pool, cl, spans, q.data(), att.data(), static_cast<const float*>(L.attn_sinks.data));
    prefetch_next({&L.wo});
    if (scores)
      accumulate_attention_scores({kv, spans[0].seq, cl, q.data(), c.n_heads, c.n_kv_heads, hd, pos0, B,
                                   attention.alibi_slopes().empty() ? nullptr : attention.alibi_slopes().data(),
                                   attention_scale(c), c.attn_softcap, scores->scratch.data(),
                                   scores->head_acc.data(), scores->total.data(),
                                   static_cast<const float*>(L.attn_sinks.data)},
                                  ops, pool);
    matmul(L.wo, att.data(), xb.data(), B);
    if (L.ffn_gate_inp) prefetch_next({&L.gate_shexp, &L.up_shexp, &L.ffn_gate_inp});
    else prefetch_next({&L.w_gate, &L.w_up});
    add_bias(xb.data(), L.bo, dim, B);
    if (L.attn_post_norm) norm_rows(xb.data(), L.attn_post_norm, {}, xb.data(), dim, B);
    }
    if (c.residual_scale != 1.0f) ops.scale(xb.data(), c.residual_scale, B * dim);
    add_rows(x.data(), xb.data(), dim, B);
    if (L.attn_out_norm) norm_rows(x.data(), L.attn_out_norm, L.attn_out_norm_b, x.data(), dim, B);
    if (!L.ffn_norm && !L.w_down) continue;  // a block that is its mixer alone (Mamba-2)

    if (L.ffn_norm) norm_rows(x.data(), L.ffn_norm, L.ffn_norm_b, xb.data(), dim, B);
    else std::copy_n(x.data(), B * dim, xb.data());  // post-norm: the FFN reads x itself
    if (L.ffn_gate_inp) {
      moe_ffn(L, B);
    } else {
      if (c.ffn == Ffn::swiglu) {
        matmuls(xb.data(), B, {{L.w_gate, hb.data()}, {L.w_up, hb2.data()}});
        rows_in_parallel(B, [&](size_t b0, size_t b1) {
          for (size_t b = b0; b < b1; ++b) ops.swiglu(&hb[b * ffn], &hb2[b * ffn], &hb[b * ffn], ffn);
        });
      } else if (c.ffn == Ffn::swiglu_clamped) {
        matmuls(xb.data(), B, {{L.w_gate, hb.data()}, {L.w_up, hb2.data()}});
        swiglu_clamped(hb.data(), hb2.data(), hb.data(), B * ffn, c.swiglu_alpha, c.swiglu_limit);
      } else if (c.ffn == Ffn::geglu) {  // gelu(gate) * up
        matmuls(xb.data(), B, {{L.w_gate, hb.data()}, {L.w_up, hb2.data()}});
        ops.gelu(hb.data(), hb.data(), B * ffn);
        for (size_t i = 0; i < B * ffn; ++i) hb[i] *= hb2[i];
      } else {
        matmul(L.w_up, xb.data(), hb.data(), B);
        add_bias(hb.data(), L.b_up, ffn, B);
        for (size_t b = 0; b < B; ++b) ops.gelu(&hb[b * ffn], &hb[b * ffn], ffn);
      }
      matmul(L.w_down, hb.data(), xb.data(), B);
      add_bias(xb.data(), L.b_down, dim, B);
    }
    if (L.ffn_post_norm) norm_rows(xb.data(), L.ffn_post_norm, {}, xb.data(), dim, B);
    if (c.residual_scale != 1.0f) ops.scale(xb.data(), c.residual_scale, B * dim);
    add_rows(x.data(), xb.data(), dim, B);
    if (L.layer_out_norm) norm_rows(x.data(), L.layer_out_norm, L.layer_out_norm_b, x.data(), dim, B);
  }

  if (!logits_out) return;
  if (rows == LogitRows::hidden) {  // embeddings: every row's last hidden state, finally normed where the model says
    if (model.output_norm) norm_rows(x.data(), model.output_norm, model.output_norm_b, logits_out, dim, B);
    else std::copy_n(x.data(), B * dim, logits_out);
    return;
  }
  prefetch_next({&model.output});
  // Only the rows whose logits are wanted go through the final norm and the classifier.
  size_t n_out = 0;
  if (rows == LogitRows::span_ends) {
    for (const QuerySpan& sp : spans) {
      const size_t first = sp.all_logits ? sp.row : sp.row + sp.n - 1, n = sp.row + sp.n - first;
      norm_rows(&x[first * dim], model.output_norm, model.output_norm_b, &xb[n_out * dim], dim, n);
      n_out += n;
    }
  } else {
    const size_t first = rows == LogitRows::all ? 0 : B - 1;
    n_out = B - first;
    norm_rows(&x[first * dim], model.output_norm, model.output_norm_b, xb.data(), dim, n_out);
  }
  matmul(model.output, xb.data(), logits_out, n_out);
  if (!model.layers.empty()) prefetch_mixer(0);  // the next step's first matmul, while the caller samples
  if (c.logit_scale != 1.0f) ops.scale(logits_out, 1.0f / c.logit_scale, n_out * c.n_vocab);
  if (c.final_softcap > 0) soft_cap(logits_out, n_out * c.n_vocab, c.final_softcap);
}

}  // namespace kiln
