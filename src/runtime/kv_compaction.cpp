#include "runtime/kv_compaction.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/error.h"
#include "runtime/attention_sink.h"
#include "runtime/soft_cap.h"

namespace kiln {
namespace {

constexpr size_t kQueries = 64;  // query rows whose scores are held at once
constexpr size_t kKeys = 256;    // keys converted to floats at once

}  // namespace

void kept_positions(int32_t n_past, std::span<const int32_t> evicted, std::vector<int32_t>& kept) {
  for (size_t i = 0; i < evicted.size(); ++i) {
    const int32_t p = evicted[i];
    if (p < 0 || p >= n_past || (i > 0 && p <= evicted[i - 1]))
      throw Error("cannot evict position " + std::to_string(p) + " of " + std::to_string(n_past) +
                  " cached (positions must be ascending, each once, below n_past)");
  }
  kept.clear();
  size_t e = 0;
  for (int32_t p = 0; p < n_past; ++p) {
    if (e < evicted.size() && evicted[e] == p) ++e;
    else kept.push_back(p);
  }
}

void turn_back(const float* cos_sin, size_t n_pairs, float* out) {
  for (size_t i = 0; i < 2 * n_pairs; i += 2) {
    const double norm = std::hypot((double)cos_sin[i], (double)cos_sin[i + 1]);
    out[i] = float(cos_sin[i] / norm), out[i + 1] = float(-cos_sin[i + 1] / norm);
  }
}

size_t attention_score_scratch_floats(size_t n_ctx, size_t head_dim) { return kQueries * n_ctx + kKeys * head_dim; }

void accumulate_attention_scores(const AttentionScorePass& a, const kernels::Ops& ops, ThreadPool& pool) {
  const size_t hd = a.head_dim, q_dim = a.n_heads * hd, group = a.n_heads / a.n_kv_heads;
  const size_t n_ctx = a.kv.format().n_ctx, n_total = a.pos0 + a.B;
  const size_t scratch_floats = attention_score_scratch_floats(n_ctx, hd);
  const auto heads = [&](int tid, int nth) {
    float* S = a.scratch + size_t(tid) * scratch_floats;  // [nb][n_keys]
    float* Kf = S + kQueries * n_ctx;                      // [nk][hd]
    for (size_t h = size_t(tid); h < a.n_heads; h += size_t(nth)) {
      const size_t kvh = h / group;
      float* acc = a.head_acc + h * n_ctx;
      std::fill_n(acc, n_total, 0.0f);
      for (size_t b0 = 0; b0 < a.B; b0 += kQueries) {
        const size_t nb = std::min(kQueries, a.B - b0), n_keys = a.pos0 + b0 + nb;
        for (size_t j0 = 0; j0 < n_keys; j0 += kKeys) {
          const size_t nk = std::min(kKeys, n_keys - j0);
          a.kv.keys_to_f32(a.layer, a.seq, j0, nk, kvh * hd, hd, Kf, hd);
          ops.gemm({TensorType::F32, Kf, hd * sizeof(float), a.q + b0 * q_dim + h * hd, q_dim, S + j0, n_keys, hd, nb,
                    0, nk});
        }
        for (size_t b = 0; b < nb; ++b) {
          float* row = S + b * n_keys;
          const size_t visible = a.pos0 + b0 + b + 1;
          ops.scale(row, a.scale, visible);
          if (a.softcap > 0) soft_cap(row, visible, a.softcap);
          if (a.alibi_slope)  // as the attention adds it: slope * (j - (visible - 1))
            for (size_t j = 0; j < visible; ++j) row[j] += a.alibi_slope[h] * float(int64_t(j) - int64_t(visible - 1));
          if (a.sinks) softmax_with_sink(ops, row, visible, a.sinks[h]);
          else ops.softmax(row, visible);
          ops.add(acc, row, acc, visible);
        }
      }
    }
  };
  const bool one_thread = a.n_heads * a.B * n_total * hd < 32 * 1024 || pool.size() == 1;
  one_thread ? heads(0, 1) : pool.run(heads);
  for (size_t h = 0; h < a.n_heads; ++h) ops.add(a.total, a.head_acc + h * n_ctx, a.total, n_total);
}

}  // namespace kiln
