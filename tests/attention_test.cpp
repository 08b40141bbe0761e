// Attention's batch invariance: a query's output does not depend on how its tokens were
// batched. A span of 300 queries (packed keys and values), spans of 10 (shorter than a
// packing takes) and each query decoded alone give the same bits, in plain chains (8
// query heads a KV head, runtime/attention.h: plain()) and in the file tile's order (1),
// for every float cache type, contiguous and paged, and within float rounding of float64
// on the stored keys and values. Speculative decoding, prompt caches and the server's
// batches rely on it: a cache built one way is the cache built another.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kiln/tensor_type.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_store_layouts.h"
#include "runtime/paged_kv.h"
#include "runtime/thread_pool.h"

namespace kiln {
namespace {

// What the cache holds of x: F16 and BF16 round it.
float stored(TensorType t, float x) {
  if (t == TensorType::F16) return fp16_to_f32(f32_to_fp16(x));
  if (t == TensorType::BF16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

// Head h of the query at position p over keys 0..p, in float64 on the stored values.
std::vector<double> reference(const std::vector<float>& K, const std::vector<float>& V, const std::vector<float>& Q,
                              TensorType t, const ModelConfig& c, size_t p, size_t h) {
  const size_t hd = c.head_dim, kv_dim = c.n_kv_heads * hd, q_dim = c.n_heads * hd;
  const size_t kvh = h / (c.n_heads / c.n_kv_heads);
  std::vector<double> w(p + 1), o(hd, 0.0);
  double max = -INFINITY, sum = 0;
  for (size_t j = 0; j <= p; ++j) {
    double dot = 0;
    for (size_t d = 0; d < hd; ++d) dot += double(Q[p * q_dim + h * hd + d]) * stored(t, K[j * kv_dim + kvh * hd + d]);
    w[j] = dot / std::sqrt(double(hd));
    max = std::max(max, w[j]);
  }
  for (double& x : w) sum += (x = std::exp(x - max));
  for (size_t j = 0; j <= p; ++j)
    for (size_t d = 0; d < hd; ++d) o[d] += w[j] / sum * stored(t, V[j * kv_dim + kvh * hd + d]);
  return o;
}

std::vector<float> run(Attention& a, ThreadPool& pool, const QuerySpan& sp, const std::vector<float>& Q, size_t q_dim) {
  std::vector<float> out(sp.n * q_dim, NAN);
  a.run(pool, 0, std::span(&sp, 1), &Q[sp.pos * q_dim], out.data());
  return out;
}

TEST(Attention, PrefilledAndDecodedQueriesGetTheSameBits) {
  std::mt19937 rng(61);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = 330, n_ctx = 400, head_dim = 64;
  const std::vector<uint32_t> window{0};
  ThreadPool pool(2);
  for (uint32_t n_kv_heads : {1u, 8u}) {
    ModelConfig c;
    c.n_layers = 1, c.n_heads = 8, c.n_kv_heads = n_kv_heads, c.head_dim = head_dim;
    const size_t kv_dim = n_kv_heads * head_dim, q_dim = c.n_heads * head_dim;
    std::vector<float> K(n * kv_dim), V(n * kv_dim), Q(n * q_dim);
    for (float& x : K) x = dist(rng);
    for (float& x : V) x = dist(rng);
    for (float& x : Q) x = dist(rng);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
      for (bool paged : {false, true}) {
        SCOPED_TRACE(std::to_string(c.n_heads / n_kv_heads) + " query heads a KV head, " + type_name(t) +
                     (paged ? ", paged" : ", contiguous"));
        const KvCache::Shape shape{1, n_ctx, kv_dim, head_dim, t, t, KvCache::is_one_value(t), {}};
        ContiguousKvStore contiguous(shape, window);
        PagedKvStore blocks(shape, 16);
        KvStore& cache = paged ? static_cast<KvStore&>(blocks) : contiguous;
        cache.append(0, n);
        for (size_t p = 0; p < n; ++p) cache.store(0, 0, p, &K[p * kv_dim], &V[p * kv_dim]);
        Attention attention(c, window, false, n_ctx, pool.size(), cache);
        // Positions 0..299 as one span, 300..329 in spans of 10 after them; then each alone.
        std::vector<float> batched = run(attention, pool, {0, 300, 0, 0}, Q, q_dim);
        for (size_t p0 = 300; p0 < n; p0 += 10) {
          const std::vector<float> part = run(attention, pool, {0, 10, p0, 0}, Q, q_dim);
          batched.insert(batched.end(), part.begin(), part.end());
        }
        for (size_t p : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{200}, size_t{299}, size_t{300},
                         size_t{317}, size_t{329}}) {
          const std::vector<float> alone = run(attention, pool, {0, 1, p, 0}, Q, q_dim);
          ASSERT_EQ(alone, std::vector<float>(batched.begin() + p * q_dim, batched.begin() + (p + 1) * q_dim))
              << "position " << p;
          for (size_t h : {size_t{0}, size_t{5}}) {  // and right: float64 on the stored keys and values
            const std::vector<double> want = reference(K, V, Q, t, c, p, h);
            for (size_t d = 0; d < head_dim; ++d)
              ASSERT_NEAR(alone[h * head_dim + d], want[d], 1e-4) << "position " << p << " head " << h << " d " << d;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
