#include "runtime/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/packed.h"
#include "runtime/attention_sink.h"
#include "runtime/sliding_window.h"
#include "runtime/soft_cap.h"

namespace kiln {
namespace {

// ALiBi (Press et al. 2022): the score of the query at key position n-1 with key j gets
// slope * (j - (n-1)), a penalty linear in the distance. (llama.cpp adds the same, as
// slope * -|i - j| in its mask; a per-row constant such as slope * j would give the same
// softmax but larger values to round.)
void add_alibi(float* row, size_t n, float slope) {
  for (size_t j = 0; j < n; ++j) row[j] += slope * float(int64_t(j) - int64_t(n - 1));
}
// The same for a block of keys that starts `first` positions after the query (<= 0).
void add_alibi(float* row, size_t n, float slope, int64_t first) {
  for (size_t j = 0; j < n; ++j) row[j] += slope * float(first + int64_t(j));
}

// Head h's slope: the geometric sequence 2^(-8/n), 2^(-16/n), ... for max_bias 8 over the
// largest power of two n <= n_heads; the remaining heads take the odd terms of the
// sequence for 2n (the paper's rule, computed in float as ggml's soft_max does).
std::vector<float> slopes_of(const ModelConfig& c) {
  if (c.positions != Positions::alibi) return {};
  const uint32_t n_pow2 = 1u << uint32_t(std::floor(std::log2(double(c.n_heads))));
  const float m0 = std::pow(2.0f, -c.max_alibi_bias / float(n_pow2));
  const float m1 = std::pow(2.0f, -(c.max_alibi_bias / 2.0f) / float(n_pow2));
  std::vector<float> slopes(c.n_heads);
  for (uint32_t h = 0; h < c.n_heads; ++h)
    slopes[h] = h < n_pow2 ? std::pow(m0, float(h + 1)) : std::pow(m1, float(2 * (h - n_pow2) + 1));
  return slopes;
}

// Asks the cache hierarchy for the lines holding [p, p + bytes).
void prefetch_lines(const uint8_t* p, size_t bytes) {
  const uintptr_t first = uintptr_t(p) & ~uintptr_t{63}, end = uintptr_t(p) + bytes;
  for (uintptr_t a = first; a < end; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
}

}  // namespace

Attention::Attention(const ModelConfig& c, const std::vector<uint32_t>& window, bool flash, size_t n_ctx,
                     int n_threads, const KvStore& kv)
    : c_(c), ops_(kernels::ops()), window_(window), flash_(flash), n_ctx_(n_ctx), kv_(kv), alibi_slope_(slopes_of(c)) {
  k_type_ = kv.format().k_type;
  v_type_ = kv.format().v_type;
  v_transposed_ = kv.format().v_transposed;
  k_row_bytes_ = KvCache::row_bytes(k_type_, size_t(c.n_kv_heads) * c.head_dim);
  elem_ = v_transposed_ ? KvCache::row_bytes(v_type_, 1) : 0;
  const size_t threads = size_t(n_threads);
  if (flash) {
    tile_scratch_.resize(threads * tile_floats());
    // One sequence decoding at the full context with its query heads in one part: the
    // per-token path then never allocates (more sequences grow it once).
    partial_.resize(size_t(c.n_heads) * ((n_ctx + kSplitKeys - 1) / kSplitKeys) * (c.head_dim + 2));
    return;
  }
  scores_.resize(threads * kQueryBlock * n_ctx);
  if (kv.has_rings()) ring_out_.resize(threads * kQueryBlock * c.head_dim);
  if (kv.gathers_runs()) gathered_.resize(threads * c.head_dim * n_ctx * elem_);
}

// S = Q K^T for nb query rows (x, row stride ldx) of KV head kvh against the keys of
// positions [lo, lo + n_keys): S[b][j] is position lo + j. One gemm per run (chain:
// Ops::gemm_chain, the packed gemm's arithmetic; see plain()).
void Attention::scores_qk(size_t l, int32_t seq, size_t kvh, const float* x, size_t ldx, size_t nb, float* S,
                          size_t lo, size_t n_keys, bool chain) const {
  const size_t head = KvCache::row_bytes(k_type_, kvh * c_.head_dim);
  const auto gemm = chain ? ops_.gemm_chain : ops_.gemm;
  runs(l, seq, lo, lo + n_keys, [&](size_t p, const uint8_t* k, const uint8_t*, size_t n) {
    // A long run in tiles, the next one's keys asked for while this one is computed.
    for (size_t r0 = 0; r0 < n; r0 += kTileKeys) {
      const size_t r1 = std::min(n, r0 + kTileKeys);
      if (r1 < n) prefetch_keys(k + r1 * k_row_bytes_, kvh, std::min(n - r1, kTileKeys));
      gemm({k_type_, k + head, k_row_bytes_, x, ldx, S + (p - lo), n_keys, c_.head_dim, nb, r0, r1});
    }
  });
}

// Values of KV head kvh, positions [lo, lo + n), as one row of n values per dimension
// (row d at dst + d * n * elem_): what one P V gemm reads when they span several blocks.
void Attention::gather_values(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, uint8_t* dst) const {
  const size_t hd = c_.head_dim, stride = v_stride(l), row = n * elem_;
  runs(l, seq, lo, lo + n, [&](size_t p, const uint8_t*, const uint8_t* v, size_t m) {
    const uint8_t* src = v + kvh * hd * stride;
    for (size_t d = 0; d < hd; ++d) std::memcpy(dst + d * row + (p - lo) * elem_, src + d * stride, m * elem_);
  });
}

// out = S V over the same positions (transposed values). Contiguous: in place, a wrapped
// ring's second run added from tmp ([nb][head_dim]); paged: gathered first when the range
// spans blocks, so the sum over positions runs in the same order as the contiguous one.
void Attention::scores_v(size_t l, int32_t seq, size_t kvh, const float* S, size_t nb, size_t lo, size_t n_keys,
                         float* out, size_t ldo, float* tmp, uint8_t* gathered, bool chain) const {
  const size_t hd = c_.head_dim, stride = v_stride(l);
  const auto gemm = chain ? ops_.gemm_chain : ops_.gemm;
  if (kv_.gathers_runs() && !one_run(l, seq, lo, lo + n_keys)) {
    gather_values(l, seq, kvh, lo, n_keys, gathered);
    gemm({v_type_, gathered, n_keys * elem_, S, n_keys, out, ldo, n_keys, nb, 0, hd});
    return;
  }
  // A wrapped ring's two runs add two sums: never with chain (plain() excludes windows).
  runs(l, seq, lo, lo + n_keys, [&](size_t p, const uint8_t*, const uint8_t* v, size_t n) {
    v += kvh * hd * stride;
    if (p == lo) return gemm({v_type_, v, stride, S, n_keys, out, ldo, n, nb, 0, hd});
    ops_.gemm({v_type_, v, stride, S + (p - lo), n_keys, tmp, hd, n, nb, 0, hd});
    for (size_t b = 0; b < nb; ++b) ops_.add(out + b * ldo, tmp + b * hd, out + b * ldo, hd);
  });
}

// Asks for the keys (and values) of head kvh at positions [lo, lo + n) ahead of their
// use. A head's rows are short pieces at a fixed stride (128 bytes of every 512 for a
// 4-head f16 cache, 68 of every 272 for q8_0), which the hardware prefetchers follow
// poorly: without this, Q K^T waits on memory for nearly every key.
void Attention::prefetch_keys(const uint8_t* k, size_t kvh, size_t n) const {
  const size_t hd = c_.head_dim, head = KvCache::row_bytes(k_type_, kvh * hd), bytes = KvCache::row_bytes(k_type_, hd);
  for (size_t i = 0; i < n; ++i) prefetch_lines(k + i * k_row_bytes_ + head, bytes);
}

void Attention::prefetch(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n) const {
  const size_t hd = c_.head_dim, stride = v_stride(l);
  const size_t v_head = v_transposed_ ? 0 : KvCache::row_bytes(v_type_, kvh * hd);
  const size_t v_bytes = v_transposed_ ? 0 : KvCache::row_bytes(v_type_, hd);
  runs(l, seq, lo, lo + n, [&](size_t, const uint8_t* k, const uint8_t* v, size_t m) {
    prefetch_keys(k, kvh, m);
    if (v_transposed_) {
      for (size_t d = 0; d < hd; ++d) prefetch_lines(v + (kvh * hd + d) * stride, m * elem_);
    } else {
      for (size_t i = 0; i < m; ++i) prefetch_lines(v + i * stride + v_head, v_bytes);
    }
  });
}

// The cache is cold at a decode step (the weights streamed since the previous token
// evicted it), and a transposed value cache stores a position's values one line per
// dimension: each token's KV store waited on 256 lines a layer (1.1B, 4 KV heads).
void Attention::prefetch_step(size_t l, std::span<const QuerySpan> spans) const {
  for (const QuerySpan& sp : spans) {
    if (sp.n != 1) continue;
    for (size_t kvh = 0; kvh < c_.n_kv_heads; ++kvh) prefetch(l, sp.seq, kvh, sp.pos, 1);
  }
}

void Attention::run(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
                    const float* sinks) {
  if (flash_) tiled(pool, l, spans, q, out, sinks);
  else direct(pool, l, spans, q, out, sinks);
}

// With the values transposed in the cache: one head per task, blocks of queries at a
// time, as two gemms: S = Q K^T (then scaled, softmaxed over the keys each query may
// see, zero elsewhere), and O = S V. On a sliding-window layer S covers only the keys
// some query of the block sees.
void Attention::direct(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
                       const float* sinks) {
  const size_t hd = c_.head_dim, q_dim = size_t(c_.n_heads) * hd;
  const size_t group = c_.n_heads / c_.n_kv_heads;  // query heads sharing one KV head
  const float scale = attention_scale(c_), cap = c_.attn_softcap;
  const uint32_t W = window_[l];
  // The last key the query at position p sees: p itself, or with non-causal attention (an
  // encoder, ModelConfig::causal false) the span's last, so that every query of a text
  // sees all of it. Sessions refuse windows and tiled attention without causality.
  const auto last_key = [&](const QuerySpan& sp, size_t p) { return c_.causal ? p : sp.pos + sp.n - 1; };
  const auto tmp_of = [&](int tid) { return ring_out_.empty() ? nullptr : &ring_out_[size_t(tid) * kQueryBlock * hd]; };
  const auto gathered_of = [&](int tid) {
    return gathered_.empty() ? nullptr : &gathered_[size_t(tid) * hd * n_ctx_ * elem_];
  };
  // Keys (and, in plain chains, values) packed for a span (packs_keys), each thread's own,
  // for the span and KV head last packed: keys in whole groups of 16 positions, then
  // values in whole groups of 16 dimensions.
  const bool chain = plain(l);
  size_t keys_needed = 0;
  for (const QuerySpan& sp : spans)
    if (packs_keys(sp, W)) keys_needed = std::max(keys_needed, last_key(sp, sp.pos + sp.n - 1) + 1);
  const auto whole_groups = [](size_t n) {
    return (n + kernels::packed::kGroupRows - 1) / kernels::packed::kGroupRows * kernels::packed::kGroupRows;
  };
  if (keys_needed > packed_positions_) {
    packed_positions_ = std::max(keys_needed, n_ctx_);
    packed_keys_floats_ = whole_groups(packed_positions_) * hd;
    packed_kv_.assign(size_t(pool.size()) * (packed_keys_floats_ + whole_groups(hd) * packed_positions_), 0.0f);
  }
  const auto heads = [&](int tid, int nth) {
    float* S = &scores_[size_t(tid) * kQueryBlock * n_ctx_];  // [nb][n_keys]
    const size_t kv_floats = packed_kv_.size() / size_t(pool.size());
    float* keys = keys_needed ? &packed_kv_[size_t(tid) * kv_floats] : nullptr;
    float* values = keys_needed ? keys + packed_keys_floats_ : nullptr;
    const QuerySpan* packed_span = nullptr;
    size_t packed_kvh = 0, n_packed = 0;
    for (size_t h = tid; h < c_.n_heads; h += nth) {
      const size_t kvh = h / group;
      for (const QuerySpan& sp : spans) {
        const bool pack = packs_keys(sp, W);
        if (pack && (packed_span != &sp || packed_kvh != kvh)) {
          n_packed = last_key(sp, sp.pos + sp.n - 1) + 1;
          pack_keys(l, sp.seq, kvh, 0, n_packed, keys);
          if (chain) pack_values(l, sp.seq, kvh, 0, n_packed, values);
          packed_span = &sp, packed_kvh = kvh;
        }
        for (size_t b0 = 0; b0 < sp.n; b0 += kQueryBlock) {
          const size_t nb = std::min(kQueryBlock, sp.n - b0);
          const size_t lo = window_start(sp.pos + b0, W);  // what the block's first query sees
          const size_t n_keys = last_key(sp, sp.pos + b0 + nb - 1) + 1 - lo;  // to what its last one sees
          const size_t row0 = sp.row + b0;
          const kernels::GemmArgs qk{TensorType::F32, keys, 0, &q[row0 * q_dim + h * hd], q_dim, S, n_keys, hd, nb, 0,
                                     n_keys, true};
          if (pack && chain) ops_.gemm(qk);
          else if (pack) ops_.gemm_packed_dots(qk);
          else scores_qk(l, sp.seq, kvh, &q[row0 * q_dim + h * hd], q_dim, nb, S, lo, n_keys, chain);
          for (size_t b = 0; b < nb; ++b) {
            const size_t p = last_key(sp, sp.pos + b0 + b), first = window_start(p, W) - lo, visible = p + 1 - lo - first;
            float* row = S + b * n_keys;
            std::fill(row, row + first, 0.0f);
            ops_.scale(row + first, scale, visible);
            if (cap > 0) soft_cap(row + first, visible, cap);
            if (!alibi_slope_.empty()) add_alibi(row + first, visible, alibi_slope_[h]);
            if (sinks) softmax_with_sink(ops_, row + first, visible, sinks[h]);
            else ops_.softmax(row + first, visible);
            std::fill(row + first + visible, row + n_keys, 0.0f);
          }
          if (pack && chain)
            ops_.gemm({TensorType::F32, values, 0, S, n_keys, &out[row0 * q_dim + h * hd], q_dim, n_keys, nb, 0, hd,
                       true, nullptr, n_packed * kernels::packed::record_bytes(TensorType::F32)});
          else
            scores_v(l, sp.seq, kvh, S, nb, lo, n_keys, &out[row0 * q_dim + h * hd], q_dim, tmp_of(tid),
                     gathered_of(tid), chain);
        }
      }
    }
  };
  // Decoding one token per sequence: the query heads that share a KV head form one batch,
  // so each key and value row is read once per token, by one thread, in one gemm
  // (per-head gemms read the cache once per query head, strided, and it is cold: the
  // weights streamed since the previous token evicted it). Tasks are (sequence, KV head,
  // slice of its query heads), enough of them for every thread.
  const size_t parts = std::max<size_t>(1, (size_t(pool.size()) + c_.n_kv_heads - 1) / c_.n_kv_heads);
  const auto kv_groups = [&](int tid, int nth) {
    float* S = &scores_[size_t(tid) * kQueryBlock * n_ctx_];
    for (size_t t = tid; t < spans.size() * c_.n_kv_heads * parts; t += nth) {
      const QuerySpan& sp = spans[t / (c_.n_kv_heads * parts)];
      const size_t kvh = t / parts % c_.n_kv_heads, part = t % parts;
      const size_t lo = window_start(sp.pos, W), n_keys = sp.pos + 1 - lo;
      const size_t g_end = (part + 1) * group / parts;
      for (size_t g0 = part * group / parts; g0 < g_end; g0 += kQueryBlock) {
        const size_t h0 = kvh * group + g0, nh = std::min(kQueryBlock, g_end - g0);
        scores_qk(l, sp.seq, kvh, &q[sp.row * q_dim + h0 * hd], hd, nh, S, lo, n_keys, chain);
        for (size_t i = 0; i < nh; ++i) {
          ops_.scale(S + i * n_keys, scale, n_keys);
          if (cap > 0) soft_cap(S + i * n_keys, n_keys, cap);
          if (!alibi_slope_.empty()) add_alibi(S + i * n_keys, n_keys, alibi_slope_[h0 + i]);
          if (sinks) softmax_with_sink(ops_, S + i * n_keys, n_keys, sinks[h0 + i]);
          else ops_.softmax(S + i * n_keys, n_keys);
        }
        scores_v(l, sp.seq, kvh, S, nh, lo, n_keys, &out[sp.row * q_dim + h0 * hd], hd, tmp_of(tid), gathered_of(tid),
                 chain);
      }
    }
  };
  // As in matmul: tiny work is cheaper on one thread than waking the pool.
  size_t work = 0;
  bool decode = true;
  for (const QuerySpan& sp : spans) work += sp.n * (sp.pos + sp.n), decode = decode && sp.n == 1;
  const bool one_thread = c_.n_heads * work * hd < 32 * 1024 || pool.size() == 1;
  if (decode) one_thread ? kv_groups(0, 1) : pool.run(kv_groups);
  else one_thread ? heads(0, 1) : pool.run(heads);
}

size_t Attention::tile_floats() const {
  const size_t hd = c_.head_dim;
  // Q rows, O rows, a block of O, scores, keys as floats, gathered values, max and sum.
  return 3 * kTileRows * hd + kTileRows * kTileKeys + 2 * kTileKeys * hd + 2 * kTileRows;
}

// Tiled attention (FlashAttention's online softmax): a task takes some query heads of
// one KV head and a block of queries of one span, and walks the keys a block at a time,
// keeping per row the running max m, the running sum l of exp(s - m) and the output
// scaled to that max. Each key and value block is read once per task, whatever its type.
void Attention::tiled(ThreadPool& pool, size_t l, std::span<const QuerySpan> spans, const float* q, float* out,
                      const float* sinks) {
  const size_t hd = c_.head_dim, q_dim = size_t(c_.n_heads) * hd, group = c_.n_heads / c_.n_kv_heads;
  const float scale = attention_scale(c_), cap = c_.attn_softcap;
  const bool k_by_head = KvCache::is_one_value(k_type_) || hd % 32 == 0;
  const uint32_t W = window_[l];
  // Tasks: (span, KV head, part of its query heads, unit), at least one per thread. A
  // prefill span's units are blocks of queries; a decoding span's are slices of its keys
  // (flash-decoding): the slices' partial softmaxes are merged after the pool is done, so
  // a long context is shared by the threads even with fewer KV heads than threads. Slices
  // are fixed by positions alone, so the thread count changes no result.
  const auto key_range = [&](const QuerySpan& sp) {
    const size_t lo = window_start(sp.pos, W);
    return std::pair<size_t, size_t>{lo, sp.pos + 1 - lo};
  };
  const auto units_of = [&](const QuerySpan& sp, size_t nb_max) {
    if (sp.n == 1) return std::max<size_t>(1, (key_range(sp).second + kSplitKeys - 1) / kSplitKeys);
    return (sp.n + nb_max - 1) / nb_max;
  };
  size_t units = 0;
  for (const QuerySpan& sp : spans) units += units_of(sp, kTileRows);  // a lower bound of the final count
  size_t parts = std::max<size_t>((group + kTileRows - 1) / kTileRows,
                                  (size_t(pool.size()) + c_.n_kv_heads * units - 1) / (c_.n_kv_heads * units));
  parts = std::min(parts, group);
  const size_t heads_per_part = (group + parts - 1) / parts;
  const size_t nb_max = std::max<size_t>(1, kTileRows / heads_per_part);
  size_t n_tasks = 0, work = 0;
  bool split = false;
  for (const QuerySpan& sp : spans) {
    const size_t u = units_of(sp, nb_max);
    n_tasks += c_.n_kv_heads * parts * u, work += sp.n * (sp.pos + sp.n), split = split || (sp.n == 1 && u > 1);
  }
  // A split task's rows: its unnormalized output, running max and sum, [heads_per_part][hd + 2].
  const size_t partial_floats = heads_per_part * (hd + 2);
  if (split && partial_.size() < n_tasks * partial_floats) partial_.resize(n_tasks * partial_floats);

  const auto run = [&](int tid, int nth) {
    float* Qs = &tile_scratch_[size_t(tid) * tile_floats()];  // [rows][hd]
    float* O = Qs + kTileRows * hd;                           // [rows][hd]
    float* Ob = O + kTileRows * hd;                           // [rows][hd]
    float* S = Ob + kTileRows * hd;                           // [rows][nk]
    float* Kf = S + kTileRows * kTileKeys;                    // [nk][hd], or packed (pack_keys)
    float* Vt = Kf + kTileKeys * hd;                          // gathered values (paged, transposed)
    float* m = Vt + kTileKeys * hd;                           // [rows]
    float* lsum = m + kTileRows;                              // [rows]
    size_t span_i = 0, span_first = 0;  // the span of task t: tasks [span_first, ...) are span_i's
    for (size_t t = tid; t < n_tasks; t += nth) {
      size_t n_units = units_of(spans[span_i], nb_max);
      while (t >= span_first + c_.n_kv_heads * parts * n_units) {
        span_first += c_.n_kv_heads * parts * n_units;
        n_units = units_of(spans[++span_i], nb_max);
      }
      const QuerySpan& sp = spans[span_i];
      const size_t u = t - span_first;
      const size_t kvh = u / (parts * n_units), part = u / n_units % parts, unit = u % n_units;
      const size_t g0 = part * group / parts, nh = (part + 1) * group / parts - g0;
      const bool decode = sp.n == 1;
      const size_t b0 = decode ? 0 : unit * nb_max, nb = std::min(nb_max, sp.n - b0), rows = nh * nb;
      // Row i is query head kvh * group + g0 + i / nb at batch position b0 + i % nb.
      const auto q_row = [&](size_t i) { return (sp.row + b0 + i % nb) * q_dim + (kvh * group + g0 + i / nb) * hd; };
      // A sink starts the running softmax as a key of logit sinks[h] whose value is 0: the
      // max is the sink, the sum exp(0) = 1, the output 0. Of a split query's slices only
      // the first has it, so that the merge counts it once.
      const bool sink = sinks && (!decode || unit == 0);
      for (size_t i = 0; i < rows; ++i) {
        std::copy_n(&q[q_row(i)], hd, Qs + i * hd);
        std::fill_n(O + i * hd, hd, 0.0f);
        m[i] = sink ? sinks[kvh * group + g0 + i / nb] : -INFINITY, lsum[i] = sink ? 1.0f : 0.0f;
      }
      // Key positions from what the block's first query sees to what its last one sees,
      // in blocks that never cross the end of a ring.
      size_t key_lo = window_start(sp.pos + b0, W), n_keys = sp.pos + b0 + nb;
      if (decode && n_units > 1) key_lo += unit * kSplitKeys, n_keys = std::min(n_keys, key_lo + kSplitKeys);
      for (size_t j0 = key_lo, nk = 0; j0 < n_keys; j0 += nk) {
        nk = std::min({kTileKeys, n_keys - j0, kv_.wrap_room(l, j0)});
        if (j0 == key_lo) prefetch(l, sp.seq, kvh, j0, nk);
        if (j0 + nk < n_keys) prefetch(l, sp.seq, kvh, j0 + nk, std::min(kTileKeys, n_keys - j0 - nk));
        if (!decode && is_float_type(k_type_)) {  // as in direct(): the same bits, faster
          pack_keys(l, sp.seq, kvh, j0, nk, Kf);
          ops_.gemm_packed_dots({TensorType::F32, Kf, 0, Qs, hd, S, nk, hd, rows, 0, nk, true});
        } else if (k_by_head) {
          scores_qk(l, sp.seq, kvh, Qs, hd, rows, S, j0, nk);
        } else {
          keys_to_f32(l, sp.seq, kvh, j0, nk, Kf);
          ops_.gemm({TensorType::F32, Kf, hd * sizeof(float), Qs, hd, S, nk, hd, rows, 0, nk});
        }
        for (size_t i = 0; i < rows; ++i) {
          float* s_row = S + i * nk;
          const size_t p = sp.pos + b0 + i % nb;  // this query sees keys [window_start, p]
          const size_t a_pos = std::max(j0, window_start(p, W)), e_pos = std::min(j0 + nk, p + 1);
          const size_t a = a_pos - j0, visible = e_pos > a_pos ? e_pos - a_pos : 0;
          if (visible > 0) {
            float* vis = s_row + a;
            ops_.scale(vis, scale, visible);
            if (cap > 0) soft_cap(vis, visible, cap);
            if (!alibi_slope_.empty())
              add_alibi(vis, visible, alibi_slope_[kvh * group + g0 + i / nb], int64_t(j0 + a) - int64_t(p));
            float block_max = vis[0];
            for (size_t j = 1; j < visible; ++j) block_max = std::max(block_max, vis[j]);
            const float m_new = std::max(m[i], block_max);
            const float correction = std::exp(m[i] - m_new);  // 0 for the first block
            lsum[i] = lsum[i] * correction + ops_.exp_sum(vis, visible, m_new);
            if (correction != 1.0f) ops_.scale(O + i * hd, correction, hd);
            m[i] = m_new;
          }
          std::fill(s_row, s_row + (visible ? a : 0), 0.0f);
          std::fill(s_row + (visible ? a + visible : 0), s_row + nk, 0.0f);
        }
        if (!v_transposed_) {
          // O += S V from the rows as stored, run by run in position order: pv adds one
          // position at a time to each output, so how the runs fall (paged blocks, a
          // ring's wrap) changes no bit.
          runs(l, sp.seq, j0, j0 + nk, [&](size_t p, const uint8_t*, const uint8_t* v, size_t n) {
            ops_.pv({v_type_, v, v_stride(l), kvh * hd, hd, S + (p - j0), nk, rows, n, O, hd});
          });
          continue;
        }
        if (one_run(l, sp.seq, j0, j0 + nk)) {  // the block of each dimension's row, read in place
          runs(l, sp.seq, j0, j0 + nk, [&](size_t, const uint8_t*, const uint8_t* v, size_t) {
            ops_.gemm({v_type_, v + kvh * hd * v_stride(l), v_stride(l), S, nk, Ob, hd, nk, rows, 0, hd});
          });
        } else {
          uint8_t* gathered = reinterpret_cast<uint8_t*>(Vt);
          gather_values(l, sp.seq, kvh, j0, nk, gathered);
          ops_.gemm({v_type_, gathered, nk * elem_, S, nk, Ob, hd, nk, rows, 0, hd});
        }
        for (size_t i = 0; i < rows; ++i) ops_.add(O + i * hd, Ob + i * hd, O + i * hd, hd);
      }
      if (decode && n_units > 1) {  // merged below
        float* part_out = &partial_[t * partial_floats];
        for (size_t i = 0; i < rows; ++i) {
          std::copy_n(O + i * hd, hd, part_out + i * (hd + 2));
          part_out[i * (hd + 2) + hd] = m[i], part_out[i * (hd + 2) + hd + 1] = lsum[i];
        }
        continue;
      }
      for (size_t i = 0; i < rows; ++i) {
        ops_.scale(O + i * hd, 1.0f / lsum[i], hd);
        std::copy_n(O + i * hd, hd, &out[q_row(i)]);
      }
    }
  };
  const bool one_thread = c_.n_heads * work * hd < 32 * 1024 || pool.size() == 1;
  one_thread ? run(0, 1) : pool.run(run);
  if (!split) return;

  // Merge each split row's slices in key order: with M the largest running max,
  // out = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s.
  size_t first = 0;
  for (const QuerySpan& sp : spans) {
    const size_t n_units = units_of(sp, nb_max), per_span = c_.n_kv_heads * parts * n_units;
    if (sp.n == 1 && n_units > 1) {
      for (size_t kvh = 0; kvh < c_.n_kv_heads; ++kvh)
        for (size_t part = 0; part < parts; ++part) {
          const size_t g0 = part * group / parts, nh = (part + 1) * group / parts - g0;
          const float* slices = &partial_[(first + (kvh * parts + part) * n_units) * partial_floats];
          for (size_t i = 0; i < nh; ++i) {
            const auto row_of = [&](size_t s) { return slices + s * partial_floats + i * (hd + 2); };
            float M = -INFINITY;
            for (size_t s = 0; s < n_units; ++s) M = std::max(M, row_of(s)[hd]);
            float* o = &out[sp.row * q_dim + (kvh * group + g0 + i) * hd];
            std::fill_n(o, hd, 0.0f);
            float L = 0.0f;
            for (size_t s = 0; s < n_units; ++s) {
              const float w = std::exp(row_of(s)[hd] - M);
              L += w * row_of(s)[hd + 1];
              ops_.axpy(w, row_of(s), o, hd);
            }
            ops_.scale(o, 1.0f / L, hd);
          }
        }
    }
    first += per_span;
  }
}

}  // namespace kiln
