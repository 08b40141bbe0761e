// The forward pass. Reads top to bottom like the paper: embed -> for each layer
// (RMSNorm -> Q,K,V -> RoPE -> cache -> causal attention -> Wo -> residual,
// RMSNorm -> SwiGLU FFN -> residual) -> final RMSNorm -> logits.
// A call processes a batch of tokens at once (prefill is matrix x matrix).
// Families differ only by ModelConfig flags read here: LayerNorm instead of RMSNorm,
// optional biases, Q/K/V clamping and Q/K norms (per row or per head), ALiBi instead of
// RoPE, GELU MLP or GeGLU, scaled embeddings, post-norms, a final soft-cap, a second RoPE
// table for sliding-window layers (the attention's scale and soft-cap: runtime/attention.h).
#include "kiln/session.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unistd.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "runtime/attention.h"
#include "util/hash64.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_evict.h"
#include "runtime/memory_limit.h"
#include "runtime/paged_kv.h"
#include "runtime/rope.h"
#include "runtime/sliding_window.h"
#include "runtime/soft_cap.h"
#include "runtime/thread_pool.h"

namespace kiln {
namespace {

// Tiled attention when asked for, or when the cache types leave no other way: values
// stored in blocks cannot be kept transposed, and keys in blocks wider than a head cannot
// be sliced per head by the gemm.
bool use_flash(const ModelConfig& c, const SessionParams& p) {
  const bool k_by_head = KvCache::is_one_value(p.kv_type_k) || c.head_dim % 32 == 0;
  const bool needs_tiled = !KvCache::is_one_value(p.kv_type_v) || !k_by_head;
  if (p.flash_attn == FlashAttention::off && needs_tiled)
    throw Error("KV cache types " + KvCache::type_label(p.kv_type_k) + "/" + KvCache::type_label(p.kv_type_v) +
                " with head dimension " +
                std::to_string(c.head_dim) + " need flash attention (-fa on)");
  return p.flash_attn == FlashAttention::on || needs_tiled;
}

int32_t batch_size(const SessionParams& p, int64_t n_ctx) {
  return int32_t(std::max<int64_t>(1, std::min<int64_t>(p.n_batch > 0 ? p.n_batch : 512, n_ctx)));
}

// The cache's shape (sliding-window layers as rings: runtime/sliding_window.h); its size,
// and that of the other buffers that grow with the context, refused with a clear message
// before any allocation when it could not fit in the memory this process may use.
KvCache::Shape kv_shape(const ModelConfig& c, const SessionParams& p, const std::vector<uint32_t>& windows) {
  const int64_t n_ctx = p.context_for(c);
  if (n_ctx <= 0) throw Error("context size must be positive (the model's context_length is 0: give -c)");
  KvCache::Shape s{c.n_layers, size_t(n_ctx), size_t(c.n_kv_heads) * c.head_dim, c.head_dim,
                   p.kv_type_k, p.kv_type_v, KvCache::is_one_value(p.kv_type_v),
                   layer_capacities(windows, size_t(n_ctx), size_t(batch_size(p, n_ctx)), p.swa_full)};
  use_flash(c, p);  // refuses what only tiled attention could run, with -fa off
  KvCache::check(s);
  const double kv_bytes = KvCache::bytes_for(s);
  const double threads = p.n_threads > 0 ? p.n_threads : physical_core_count();
  // The RoPE table, the attention score rows (without tiled attention) and the list of
  // kept positions also hold a float or an int per position.
  const double per_pos = double(c.n_rot) * 4 + (use_flash(c, p) ? 0 : threads * 64 * 4) + 4;
  const double needed = kv_bytes + per_pos * double(n_ctx);
  const MemoryLimit limit = memory_limit();
  if (limit.bytes > 0 && needed > limit.bytes)
    throw Error("a context of " + std::to_string(n_ctx) + " tokens needs " + human_bytes(needed) + " (KV cache " +
                human_bytes(kv_bytes) + "), more than the " + human_bytes(limit.bytes) + " available (" + limit.what +
                "); lower -c or use a smaller cache type (-ctk/-ctv)");
  return s;
}

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

// The paged layout's block pool, one sequence (0) ready; refused with one line where the
// contiguous cache's features it lacks would be needed.
std::unique_ptr<PagedKv> paged_kv(const KvCache::Shape& s, const SessionParams& p, const std::vector<uint32_t>& windows) {
  if (p.kv_layout != KvLayout::paged) return nullptr;
  if (std::any_of(windows.begin(), windows.end(), [](uint32_t w) { return w > 0; }))
    throw Error("--kv-layout paged does not support sliding-window layers yet (" + describe_windows(windows) +
                "; use --kv-layout contiguous)");
  const size_t block = size_t(std::max(p.kv_block, 0));  // PagedKv refuses 0
  auto kv = std::make_unique<PagedKv>(
      PagedKv::Shape{s.n_layers, s.kv_dim, s.head_dim, s.k_type, s.v_type, s.v_transposed, block, s.n_ctx});
  kv->add_sequence();
  return kv;
}

}  // namespace

struct Session::Impl {
  const Model& model;
  const ModelConfig& c;
  const kernels::Ops& ops;
  std::vector<uint32_t> window;  // [n_layers] sliding window of each layer (0: global)
  KvCache::Shape kv_shape_;  // before the cache: checked and sized first
  int32_t n_ctx, n_batch;
  ThreadPool pool;
  // One of the two layouts: the contiguous per-layer cache, or paged blocks shared by
  // sequences (runtime/paged_kv.h).
  std::unique_ptr<PagedKv> paged;
  std::optional<KvCache> kv_cache;
  bool flash;
  Attention attention;
  int32_t n_past = 0;  // sequence 0's positions

  uint64_t positions_id = 0;  // KvStateDesc::positions
  std::vector<float> rope_cos_sin;  // [n_ctx][n_rot/2][2]
  // The model's sliding-window layers' own table when they rotate with another base
  // (ModelConfig::rope_theta_swa), else empty. It ignores the session's RoPE overrides:
  // those stretch the global layers' context, the local ones never see past their window.
  std::vector<float> rope_cos_sin_swa;  // [n_ctx][n_rot/2][2]
  // Activations for one batch of B <= n_batch tokens, row-major by token.
  std::vector<float> x;       // [B][dim]    residual stream
  std::vector<float> xb;      // [B][dim]    normed input of a sublayer
  std::vector<float> q;       // [B][n_heads * head_dim]
  std::vector<float> k;       // [B][kv_dim]
  std::vector<float> v;       // [B][kv_dim]
  std::vector<float> att;     // [B][n_heads * head_dim]  attention output before Wo
  std::vector<float> hb;      // [B][ffn_dim] gate, then silu(gate) * up (or up, then gelu(up))
  std::vector<float> hb2;     // [B][ffn_dim] up
  std::vector<QuerySpan> spans;  // which sequence and position each row of a batch is
  std::vector<float> logits;  // [n_out][n_vocab]
  // Eviction (runtime/kv_evict.h): kept positions and one turned-back rotation, reused;
  // with track_attention, the attention each cached position has received (H2O), a
  // per-head sum for the current layer and the score pass's scratch.
  std::vector<int32_t> kept;
  std::vector<float> back_rot, back_rot_swa;  // for layers of rope_cos_sin and of rope_cos_sin_swa
  std::vector<float> att_score, head_score, score_scratch;

  void contiguous_only(const char* what) const {
    if (paged) throw Error(std::string(what) + " needs --kv-layout contiguous (the paged cache does not support it yet)");
  }
  void paged_only(const char* what) const {
    if (!paged) throw Error(std::string(what) + " needs the paged KV layout (--kv-layout paged)");
  }

  Impl(const Model& m, const SessionParams& p)
      : model(m), c(m.config()), ops(kernels::ops()),
        window(layer_windows(m.config(), p)),
        kv_shape_(kv_shape(m.config(), p, window)),
        n_ctx((int32_t)kv_shape_.n_ctx),
        n_batch(batch_size(p, n_ctx)),
        pool(p.n_threads > 0 ? p.n_threads : physical_core_count()),
        paged(paged_kv(kv_shape_, p, window)),
        kv_cache(paged ? std::nullopt : std::optional<KvCache>(std::in_place, kv_shape_)),
        flash(use_flash(m.config(), p)),
        attention(m.config(), window, flash, kv_shape_.n_ctx, pool.size(), kv_cache ? &*kv_cache : nullptr, paged.get()) {
    const size_t B = n_batch, q_dim = size_t(c.n_heads) * c.head_dim, kv_dim = kv_shape_.kv_dim;
    x.resize(B * c.dim);
    xb.resize(B * c.dim);
    q.resize(B * q_dim);
    k.resize(B * kv_dim);
    v.resize(B * kv_dim);
    att.resize(B * q_dim);
    hb.resize(B * c.ffn_dim);
    hb2.resize(B * c.ffn_dim);
    spans.reserve(B);
    size_t max_rows = m.output.rows;
    const auto size_for = [&](const WeightView& w) {
      if (w.packed) prepared_stride = std::max(prepared_stride, (ops.prepared_bytes(w.type, w.cols, B) + 63) / 64 * 64);
      max_rows = std::max<size_t>(max_rows, w.rows);
    };
    size_for(m.output);
    for (const LayerWeights& L : m.layers)
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) size_for(*w);
    prepared.resize(kMaxMatmuls * prepared_stride + 64);
    prepared_base = prepared.data() + (64 - reinterpret_cast<uintptr_t>(prepared.data()) % 64) % 64;
    tasks.reserve(kMaxMatmuls * (max_rows / 16 + 1));
    logits.resize(c.n_vocab);

    // Computed in double once for every position, RoPE scaling included (runtime/rope.h).
    // Against the model's settings without a context: a LongRoPE session whose context
    // picks the long factors gets an identity of its own.
    const RopeConfig rope_config = resolve_rope(c, p.rope, n_ctx);
    positions_id = rope_identity(rope_config, resolve_rope(c, {}));
    rope_cos_sin = rope_cos_sin_table(rope_config, n_ctx);
    if (c.rope_theta_swa > 0) {
      RopeConfig local;
      local.n_rot = c.n_rot;
      local.freq_base = c.rope_theta_swa;
      rope_cos_sin_swa = rope_cos_sin_table(local, n_ctx);
    }
    back_rot.resize(size_t(c.n_rot / 2) * 2);
    back_rot_swa.resize(back_rot.size());
    kept.reserve(size_t(n_ctx));
  }

  // Quantized weights multiply converted (8-bit) activations: each input is converted
  // once per weight type and shared by the matmuls that read it.
  static constexpr size_t kMaxMatmuls = 3;
  std::vector<uint8_t> prepared;      // [kMaxMatmuls][prepared_stride], from prepared_base
  uint8_t* prepared_base = nullptr;   // 64-byte aligned
  size_t prepared_stride = 0;
  struct RowTask {
    kernels::GemmArgs args;
  };
  std::vector<RowTask> tasks;         // reserved once; a matmuls() call never allocates

  struct MatmulOut {
    const WeightView& w;
    float* y;
  };

  // y_i[b] = W_i x[b] for every pair (all W_i have x's width), as one job for the pool:
  // rows of all matrices are cut into chunks that threads take in turn. Tiny work stays
  // on one thread: waking the pool costs more than the arithmetic.
  void matmuls(const float* in, size_t B, std::initializer_list<MatmulOut> outs) {
    const void* prepared_for[kMaxMatmuls] = {};
    TensorType prepared_type[kMaxMatmuls];
    size_t n_prepared = 0, work = 0;
    for (const MatmulOut& o : outs) work += o.w.rows * o.w.cols * B;
    tasks.clear();
    size_t left = work;
    const size_t threads = size_t(pool.size());
    for (const MatmulOut& o : outs) {
      const WeightView& w = o.w;
      kernels::GemmArgs a{w.type, w.data, w.row_bytes, in, w.cols, o.y, w.rows, w.cols, B, 0, w.rows, w.packed};
      if (w.packed && ops.prepared_bytes(w.type, w.cols, B) > 0) {
        size_t slot = 0;
        while (slot < n_prepared && prepared_type[slot] != w.type) ++slot;
        if (slot == n_prepared) {
          void* dst = prepared_base + slot * prepared_stride;
          prepare_activations(w.type, in, w.cols, B, dst);
          prepared_type[slot] = w.type, prepared_for[slot] = dst, ++n_prepared;
        }
        a.x_prepared = prepared_for[slot];
      }
      // Guided split: each chunk is a share of the work still left in the whole job, so
      // the first chunks are long runs the prefetchers stream well and the last ones are
      // short, and the threads reach the barrier together. Rows come in whole 16-row
      // packed groups (48 for the 6-row float prefill tiles), at least ~32 KiB of weights.
      const size_t align = w.packed ? 16 : 48;
      const size_t row_work = w.cols * B;
      const size_t min_rows = std::max<size_t>(align, ((32u << 10) / std::max<size_t>(w.row_bytes, 1) + align - 1) / align * align);
      for (size_t r0 = 0; r0 < w.rows;) {
        const size_t want = (left / (2 * threads) / row_work + align - 1) / align * align;
        const size_t n = std::min(w.rows - r0, std::max(want, min_rows));
        a.r0 = r0;
        a.r1 = r0 + n;
        tasks.push_back({a});
        r0 += n;
        left -= n * row_work;
      }
    }
    if (work < 64 * 1024 || pool.size() == 1) {
      for (const RowTask& t : tasks) ops.gemm(t.args);
      return;
    }
    pool.parallel_for_dynamic(tasks.size(), 1, [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) ops.gemm(tasks[t].args);
    });
  }
  void matmul(const WeightView& w, const float* in, float* out, size_t B) { matmuls(in, B, {{w, out}}); }

  void prepare_activations(TensorType type, const float* in, size_t k, size_t B, void* dst) {
    if (B < 8 || pool.size() == 1) {
      ops.prepare(type, in, k, k, 0, B, dst);
      return;
    }
    pool.parallel_for(B, 1, [&](size_t b0, size_t b1) { ops.prepare(type, in, k, k, b0, b1, dst); });
  }

  // The cos/sin table layer l rotates with.
  const std::vector<float>& rope_table(size_t l) const {
    const bool local = !rope_cos_sin_swa.empty() && l < c.swa_window.size() && c.swa_window[l] > 0;
    return local ? rope_cos_sin_swa : rope_cos_sin;
  }

  void embed(int32_t token, float* out) {
    const uint8_t* row = static_cast<const uint8_t*>(model.token_embd.data) + size_t(token) * model.token_embd.row_bytes;
    switch (model.token_embd.type) {
      case TensorType::F32: std::copy_n(reinterpret_cast<const float*>(row), c.dim, out); break;
      case TensorType::F16: ops.fp16_to_f32(reinterpret_cast<const uint16_t*>(row), out, c.dim); break;
      case TensorType::BF16: ops.bf16_to_f32(reinterpret_cast<const uint16_t*>(row), out, c.dim); break;
      default: kernels::ref::dequantize_row(model.token_embd.type, row, out, c.dim); break;
    }
    if (c.embed_scale != 1.0f) ops.scale(out, c.embed_scale, c.dim);
  }

  // out[b] = norm(in[b]) * w (+ bias) for B rows of n floats: the family's norm.
  void norm_rows(const float* in, const WeightView& w, const WeightView& bias, float* out, size_t n, size_t B) {
    const float* weight = static_cast<const float*>(w.data);
    const float* b_data = static_cast<const float*>(bias.data);  // nullptr without a bias
    for (size_t b = 0; b < B; ++b) {
      if (c.norm == Norm::layer) {
        ops.layernorm(in + b * n, weight, b_data, out + b * n, n, c.rms_eps);
      } else {
        ops.rmsnorm(in + b * n, weight, out + b * n, n, c.rms_eps);
        if (b_data) ops.add(out + b * n, b_data, out + b * n, n);
      }
    }
  }
  // y[b] += bias for B rows of n floats; nothing when the family has no such bias.
  void add_bias(float* y, const WeightView& bias, size_t n, size_t B) {
    if (!bias) return;
    for (size_t b = 0; b < B; ++b) ops.add(y + b * n, static_cast<const float*>(bias.data), y + b * n, n);
  }

  // Runs B tokens, row by row where `spans` says (sequence and position; they cover rows
  // [0, B)), and writes logits of the last (or all) of them; logits_out == nullptr only
  // fills the KV cache. Paged blocks for the new positions are taken (or copied, when
  // shared) before anything is computed.
  void forward(const int32_t* tokens, size_t B, float* logits_out, bool all_logits) {
    const size_t dim = c.dim, hd = c.head_dim, ffn = c.ffn_dim;
    const size_t q_dim = size_t(c.n_heads) * hd, kv_dim = kv_shape_.kv_dim;
    if (paged)
      for (const QuerySpan& sp : spans) paged->append(sp.seq, sp.n);
    const size_t pos0 = spans[0].pos;  // with H2O tracking: the one span's (contiguous cache)
    const bool track = !att_score.empty();
    if (track) std::fill_n(&att_score[pos0], B, 0.0f);

    for (size_t b = 0; b < B; ++b) embed(tokens[b], &x[b * dim]);

    for (size_t l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = model.layers[l];
      norm_rows(x.data(), L.attn_norm, L.attn_norm_b, xb.data(), dim, B);

      matmuls(xb.data(), B, {{L.wq, q.data()}, {L.wk, k.data()}, {L.wv, v.data()}});
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
      const std::vector<float>& rope = rope_table(l);
      for (const QuerySpan& sp : spans)
        for (size_t b = sp.row, pos = sp.pos; b < sp.row + sp.n; ++b, ++pos) {
          if (c.positions == Positions::rope) {
            const float* cs = &rope[pos * (c.n_rot / 2) * 2];
            ops.rope(&q[b * q_dim], c.n_heads, hd, c.n_rot, cs, c.rope_neox);
            ops.rope(&k[b * kv_dim], c.n_kv_heads, hd, c.n_rot, cs, c.rope_neox);
          }
          if (paged) paged->store(l, sp.seq, pos, &k[b * kv_dim], &v[b * kv_dim]);
          else kv_cache->store(l, pos, &k[b * kv_dim], &v[b * kv_dim]);
        }
      attention.run(pool, l, spans, q.data(), att.data());
      if (track)
        accumulate_attention_scores({*kv_cache, l, q.data(), c.n_heads, c.n_kv_heads, hd, pos0, B,
                                     attention.alibi_slopes().empty() ? nullptr : attention.alibi_slopes().data(),
                                     attention_scale(c), c.attn_softcap, score_scratch.data(),
                                     head_score.data(), att_score.data()},
                                    ops, pool);
      matmul(L.wo, att.data(), xb.data(), B);
      add_bias(xb.data(), L.bo, dim, B);
      if (L.attn_post_norm) norm_rows(xb.data(), L.attn_post_norm, {}, xb.data(), dim, B);
      for (size_t b = 0; b < B; ++b) ops.add(&x[b * dim], &xb[b * dim], &x[b * dim], dim);

      norm_rows(x.data(), L.ffn_norm, L.ffn_norm_b, xb.data(), dim, B);
      if (c.ffn == Ffn::swiglu) {
        matmuls(xb.data(), B, {{L.w_gate, hb.data()}, {L.w_up, hb2.data()}});
        for (size_t b = 0; b < B; ++b) ops.swiglu(&hb[b * ffn], &hb2[b * ffn], &hb[b * ffn], ffn);
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
      if (L.ffn_post_norm) norm_rows(xb.data(), L.ffn_post_norm, {}, xb.data(), dim, B);
      for (size_t b = 0; b < B; ++b) ops.add(&x[b * dim], &xb[b * dim], &x[b * dim], dim);
    }

    n_past = paged ? int32_t(paged->length(0)) : n_past + int32_t(B);
    if (!logits_out) return;
    // Only the rows whose logits are wanted go through the final norm and the classifier.
    const size_t first = all_logits ? 0 : B - 1, n_out = B - first;
    norm_rows(&x[first * dim], model.output_norm, model.output_norm_b, xb.data(), dim, n_out);
    matmul(model.output, xb.data(), logits_out, n_out);
    if (c.final_softcap > 0) soft_cap(logits_out, n_out * c.n_vocab, c.final_softcap);
  }
};

Session::Session(const Model& model, const SessionParams& params) : impl_(std::make_unique<Impl>(model, params)) {}
Session::~Session() = default;

std::span<const float> Session::decode(std::span<const int32_t> tokens, bool all_logits) {
  Impl& s = *impl_;
  const size_t n_vocab = s.c.n_vocab;
  if (tokens.empty()) return {};
  if (s.n_past + tokens.size() > size_t(s.n_ctx))
    throw Error("context is full: " + std::to_string(s.n_past) + " + " + std::to_string(tokens.size()) +
                " tokens exceed the context size " + std::to_string(s.n_ctx) + " (use -c to raise it)");
  for (int32_t t : tokens)
    if (t < 0 || size_t(t) >= n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");

  s.logits.resize(all_logits ? tokens.size() * n_vocab : n_vocab);
  for (size_t start = 0; start < tokens.size(); start += s.n_batch) {
    const size_t B = std::min<size_t>(s.n_batch, tokens.size() - start);
    const bool last_batch = start + B == tokens.size();
    // Batches before the last only fill the cache unless every row's logits are wanted.
    float* out = all_logits ? &s.logits[start * n_vocab] : last_batch ? s.logits.data() : nullptr;
    s.spans.assign(1, QuerySpan{0, B, size_t(s.n_past), 0});
    s.forward(&tokens[start], B, out, all_logits);
  }
  return {s.logits.data(), s.logits.size()};
}

int32_t Session::n_past() const { return impl_->n_past; }
int32_t Session::n_ctx() const { return impl_->n_ctx; }
int32_t Session::n_threads() const { return impl_->pool.size(); }
bool Session::flash_attn() const { return impl_->flash; }
double Session::kv_cache_bytes() const {
  return impl_->paged ? impl_->paged->allocated_bytes() : impl_->kv_cache->bytes();
}
double Session::kv_cache_layer_bytes(int32_t layer) const {
  if (impl_->paged) return impl_->paged->allocated_bytes() / double(impl_->c.n_layers);
  return impl_->kv_cache->layer_bytes(size_t(layer));
}
uint32_t Session::layer_window(int32_t layer) const { return impl_->window.at(size_t(layer)); }
const Model& Session::model() const { return impl_->model; }

// Bits 8..31 of a KV type name the sliding windows (runtime/sliding_window.h): a state
// saved with windows only loads where the same windows mask it, ring or full-size.
std::string Session::kv_type_name(uint32_t kv_type) {
  std::string name = KvCache::state_type_name(kv_type & 0xff);
  if (kv_type >> 8) name += ", sliding windows #" + std::to_string(kv_type >> 8);
  return name;
}

KvStateDesc Session::kv_state_desc(int32_t n_pos) const {
  impl_->contiguous_only("saving or loading the KV cache (session files)");
  const KvCache& kv = *impl_->kv_cache;
  KvStateDesc d;
  d.kv_type = kv.state_type() | windows_code(impl_->window) << 8;
  d.n_layers = (uint32_t)kv.n_layers();
  d.kv_dim = (uint32_t)kv.kv_dim();
  d.n_pos = n_pos;
  d.layer_bytes = n_pos > 0 ? kv.state_layer_bytes(size_t(n_pos)) : 0;
  d.positions = impl_->positions_id;
  return d;
}

void Session::write_kv_state(const std::function<void(const void*, size_t)>& sink) const {
  impl_->contiguous_only("saving the KV cache (session files)");
  const KvCache& kv = *impl_->kv_cache;
  for (size_t l = 0; l < kv.n_layers(); ++l) kv.write_state(l, size_t(impl_->n_past), sink);
}

void Session::read_kv_state(const KvStateDesc& desc, const std::function<void(void*, size_t)>& source) {
  Impl& s = *impl_;
  s.contiguous_only("loading a KV cache (session files)");
  if (desc.n_pos < 0 || desc.n_pos > s.n_ctx)
    throw Error("a saved KV cache of " + std::to_string(desc.n_pos) + " positions does not fit a context of " +
                std::to_string(s.n_ctx));
  if (!(desc == kv_state_desc(desc.n_pos)))
    throw Error("the saved KV cache (" + kv_type_name(desc.kv_type) + ", " + std::to_string(desc.n_layers) +
                " layers of width " + std::to_string(desc.kv_dim) + ") does not match this session's (" +
                kv_type_name(kv_state_desc(0).kv_type) + ", " + std::to_string(s.kv_cache->n_layers()) +
                " layers of width " + std::to_string(s.kv_cache->kv_dim()) + "; see -ctk, -ctv, -fa, --swa-*)");
  try {
    for (size_t l = 0; l < s.kv_cache->n_layers(); ++l) s.kv_cache->read_state(l, size_t(desc.n_pos), source);
    std::fill(s.att_score.begin(), s.att_score.end(), 0.0f);  // what the saved tokens received is not saved
  } catch (...) {
    s.n_past = 0;
    throw;
  }
  s.n_past = desc.n_pos;
}

void Session::read_kv_state(const KvStateDesc& desc, std::span<const uint8_t> data) {
  if (data.size() != desc.bytes())
    throw Error("the saved KV cache has " + std::to_string(data.size()) + " bytes, expected " +
                std::to_string(desc.bytes()));
  size_t at = 0;
  read_kv_state(desc, [&](void* dst, size_t bytes) {
    std::memcpy(dst, data.data() + at, bytes);
    at += bytes;
  });
}

void Session::shift_context(int32_t n_keep, int32_t n_discard) {
  Impl& s = *impl_;
  s.contiguous_only("a context shift");
  if (n_keep < 0 || n_discard < 0 || int64_t(n_keep) + n_discard > s.n_past)
    throw Error("cannot shift the context: keep " + std::to_string(n_keep) + ", discard " + std::to_string(n_discard) +
                " of " + std::to_string(s.n_past) + " positions");
  if (n_discard == 0) return;
  // A ring layer must still hold every position the next query's window reaches: kept
  // ones as they are, moved ones n_discard later (KvCache::shift rebuilds it from those).
  const size_t n_new = size_t(s.n_past - n_discard);
  for (size_t l = 0; l < s.c.n_layers; ++l) {
    if (!s.kv_cache->is_ring(l)) continue;
    const size_t from = window_start(n_new, s.window[l]), held = s.kv_cache->held_from(l), moved = std::max(from, size_t(n_keep));
    if ((from < size_t(n_keep) && from < held) || (moved < n_new && moved + size_t(n_discard) < held))
      throw Error("cannot shift the context: the sliding window of layer " + std::to_string(l) + " (" +
                  std::to_string(s.window[l]) + ") would reach kept positions its ring buffer no longer holds; keep fewer "
                  "tokens (--keep) or keep a full-size cache (--swa-full)");
  }
  // Rotation by -n_discard: the pair angles are linear in the position (with every scaling
  // kiln knows), so the table's entry for n_discard, scaled back to unit length (YaRN folds
  // its magnitude in) and mirrored, turns each kept key back that far.
  const size_t half = s.c.n_rot / 2;
  turn_back(&s.rope_cos_sin[size_t(n_discard) * half * 2], half, s.back_rot.data());
  if (!s.rope_cos_sin_swa.empty()) turn_back(&s.rope_cos_sin_swa[size_t(n_discard) * half * 2], half, s.back_rot_swa.data());
  const bool rope = s.c.positions == Positions::rope && s.c.n_rot > 0;  // ALiBi needs nothing turned
  s.kv_cache->shift(size_t(n_keep), size_t(n_discard), size_t(s.n_past), [&](size_t l, float* k_row) {
    const float* back = &s.rope_table(l) == &s.rope_cos_sin ? s.back_rot.data() : s.back_rot_swa.data();
    if (rope) s.ops.rope(k_row, s.c.n_kv_heads, s.c.head_dim, s.c.n_rot, back, s.c.rope_neox);
  });
  if (!s.att_score.empty())
    std::copy(s.att_score.begin() + n_keep + n_discard, s.att_score.begin() + s.n_past, s.att_score.begin() + n_keep);
  s.n_past -= n_discard;
}

namespace {
// Eviction and attention scores assume every cached position is visible to every query.
void refuse_windows(const std::vector<uint32_t>& window, const char* what) {
  for (uint32_t w : window)
    if (w > 0) throw Error(std::string(what) + " does not work with sliding-window layers yet (use --kv-evict shift)");
}
}  // namespace

void Session::evict(std::span<const int32_t> positions) {
  Impl& s = *impl_;
  s.contiguous_only("KV eviction (sink, h2o)");
  refuse_windows(s.window, "KV eviction (sink, h2o)");
  kept_positions(s.n_past, positions, s.kept);
  if (positions.empty()) return;
  const bool rope = s.c.positions == Positions::rope && s.c.n_rot > 0;  // ALiBi needs nothing turned
  const size_t half = s.c.n_rot / 2;
  // The distance back_rot undoes and the table it came from; rows moving the same distance
  // in layers of the same table share it.
  size_t turned_for = 0;
  const std::vector<float>* turned_table = nullptr;
  s.kv_cache->compact(s.kept.data(), s.kept.size(), [&](size_t l, float* k_row, size_t delta) {
    if (!rope) return;
    const std::vector<float>& table = s.rope_table(l);
    if (delta != turned_for || &table != turned_table)
      turn_back(&table[delta * half * 2], half, s.back_rot.data()), turned_for = delta, turned_table = &table;
    s.ops.rope(k_row, s.c.n_kv_heads, s.c.head_dim, s.c.n_rot, s.back_rot.data(), s.c.rope_neox);
  });
  if (!s.att_score.empty())
    for (size_t i = 0; i < s.kept.size(); ++i) s.att_score[i] = s.att_score[size_t(s.kept[i])];
  s.n_past = (int32_t)s.kept.size();
}

void Session::track_attention(bool on) {
  Impl& s = *impl_;
  if (on == !s.att_score.empty()) return;
  if (on) refuse_windows(s.window, "attention scores (h2o)");
  if (on) s.contiguous_only("tracking attention scores (h2o)");
  if (!on) {
    s.att_score = {}, s.head_score = {}, s.score_scratch = {};
    return;
  }
  const size_t n_ctx = size_t(s.n_ctx);
  s.att_score.assign(n_ctx, 0.0f);  // what the cached positions received before is unknown: 0
  s.head_score.resize(size_t(s.c.n_heads) * n_ctx);
  s.score_scratch.resize(size_t(s.pool.size()) * attention_score_scratch_floats(n_ctx, s.c.head_dim));
}

std::span<const float> Session::attention_scores() const {
  if (impl_->att_score.empty()) return {};
  return {impl_->att_score.data(), size_t(impl_->n_past)};
}

void Session::truncate(int32_t n) {
  Impl& s = *impl_;
  if (n < 0 || n > s.n_past) throw Error("cannot truncate a session of " + std::to_string(s.n_past) +
                                         " tokens to " + std::to_string(n));
  if (s.paged) {
    s.paged->truncate(0, size_t(n));
    s.n_past = n;
    return;
  }
  // A ring that has overwritten keys position n's window needs cannot go back there.
  for (size_t l = 0; l < s.c.n_layers; ++l)
    if (s.kv_cache->is_ring(l) && window_start(size_t(n), s.window[l]) < s.kv_cache->held_from(l)) n = 0;
  s.n_past = n;
  s.kv_cache->truncated(size_t(n));
}

KvLayout Session::kv_layout() const { return impl_->paged ? KvLayout::paged : KvLayout::contiguous; }

int32_t Session::fork_sequence(int32_t from) {
  impl_->paged_only("forking a sequence");
  return impl_->paged->fork(from);
}

void Session::free_sequence(int32_t seq) {
  Impl& s = *impl_;
  s.paged_only("freeing a sequence");
  if (seq == 0) return truncate(0);
  if (!s.paged->alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
  s.paged->release(seq);
}

int32_t Session::n_past(int32_t seq) const {
  const Impl& s = *impl_;
  if (seq == 0) return s.n_past;
  s.paged_only("a sequence other than 0");
  if (!s.paged->alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
  return int32_t(s.paged->length(seq));
}

std::span<const float> Session::decode_parallel(std::span<const int32_t> seqs, std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  s.paged_only("decoding several sequences");
  const size_t n_vocab = s.c.n_vocab, n = seqs.size();
  if (tokens.size() != n)
    throw Error("decode_parallel: " + std::to_string(n) + " sequences but " + std::to_string(tokens.size()) + " tokens");
  for (size_t i = 0; i < n; ++i) {
    const int32_t seq = seqs[i], t = tokens[i];
    if (!s.paged->alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
    if (std::find(seqs.begin(), seqs.begin() + ptrdiff_t(i), seq) != seqs.begin() + ptrdiff_t(i))
      throw Error("decode_parallel: sequence " + std::to_string(seq) + " is listed twice");
    if (s.paged->length(seq) >= size_t(s.n_ctx))
      throw Error("context is full: sequence " + std::to_string(seq) + " holds " + std::to_string(s.n_ctx) +
                  " tokens, the context size (use -c to raise it)");
    if (t < 0 || size_t(t) >= n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
  }
  s.logits.resize(n * n_vocab);
  for (size_t start = 0; start < n; start += size_t(s.n_batch)) {
    const size_t B = std::min<size_t>(size_t(s.n_batch), n - start);
    s.spans.clear();
    for (size_t i = 0; i < B; ++i) {
      const int32_t seq = seqs[start + i];
      s.spans.push_back({i, 1, s.paged->length(seq), seq});
    }
    s.forward(&tokens[start], B, &s.logits[start * n_vocab], true);
  }
  return {s.logits.data(), s.logits.size()};
}

KvMemory Session::kv_memory() const {
  const Impl& s = *impl_;
  KvMemory m;
  if (!s.paged) {
    m.bytes_used = m.bytes_unshared = m.bytes_allocated = s.kv_cache->bytes();
    return m;
  }
  const double block = s.paged->block_bytes();
  m.blocks_used = int64_t(s.paged->blocks_used());
  m.blocks_unshared = int64_t(s.paged->blocks_unshared());
  m.bytes_used = double(m.blocks_used) * block;
  m.bytes_unshared = double(m.blocks_unshared) * block;
  m.bytes_allocated = s.paged->allocated_bytes();
  return m;
}

}  // namespace kiln
