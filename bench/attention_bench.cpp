// Decoding attention alone, on the 1.1B (TinyLlama) shape: 22 layers, 32 query heads
// sharing 4 KV heads of 64 dimensions, one new token at depth D, 2 threads. The caches of
// all layers together (22 KiB per position in f16) are far larger than L3 at long depths,
// so each layer's keys and values come from memory as they do in a real token. This
// isolates what `kiln bench -d` measures for attention without a 16K-token prefill.
//   attention_bench --benchmark_filter='Decode/16384'
// Arguments: depth, flash (0 direct, 1 tiled), key type and value type (0 f16, 1 q8_0, 2 q4_0).
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "runtime/thread_pool.h"

namespace {

using kiln::TensorType;

constexpr size_t kLayers = 22, kHeads = 32, kKvHeads = 4, kHeadDim = 64, kThreads = 2;

TensorType type_of(int64_t i) {
  return i == 0 ? TensorType::F16 : i == 1 ? TensorType::Q8_0 : TensorType::Q4_0;
}

struct Setup {
  kiln::ModelConfig config;
  std::vector<uint32_t> window;
  std::unique_ptr<kiln::KvStore> cache;
};

// Caches filled once per (depth, type): filling 16K positions of 22 layers takes seconds.
Setup& setup_for(size_t depth, TensorType tk, TensorType tv) {
  static std::map<std::tuple<size_t, int, int>, std::unique_ptr<Setup>> setups;
  auto& s = setups[{depth, int(tk), int(tv)}];
  if (s) return *s;
  s = std::make_unique<Setup>();
  s->config.n_layers = kLayers, s->config.n_heads = kHeads, s->config.n_kv_heads = kKvHeads;
  s->config.head_dim = kHeadDim, s->config.dim = kHeads * kHeadDim;
  s->window.assign(kLayers, 0);
  const bool one_value = kiln::KvCache::is_one_value(tv);
  s->cache = kiln::make_kv_store(
      kiln::KvLayout::contiguous, kiln::KvCache::Shape{kLayers, depth + 1, kKvHeads * kHeadDim, kHeadDim, tk, tv, one_value, {}},
      s->window, 16);
  s->cache->append(0, depth + 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(kKvHeads * kHeadDim), v(k.size());
  for (size_t l = 0; l < kLayers; ++l)
    for (size_t p = 0; p <= depth; ++p) {
      for (size_t i = 0; i < k.size(); ++i) k[i] = normal(rng), v[i] = normal(rng);
      s->cache->store(l, 0, p, k.data(), v.data());
    }
  return *s;
}

void Decode(benchmark::State& state) {
  const size_t depth = size_t(state.range(0));
  const bool flash = state.range(1) != 0;
  const TensorType tk = type_of(state.range(2)), tv = type_of(state.range(3));
  if (!flash && !kiln::KvCache::is_one_value(tv)) return state.SkipWithError("quantized values need tiled attention");
  Setup& s = setup_for(depth, tk, tv);
  kiln::ThreadPool pool{int(kThreads)};
  kiln::Attention attention(s.config, s.window, flash, depth + 1, int(kThreads), *s.cache);
  std::vector<float> q(kHeads * kHeadDim), out(q.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  const kiln::QuerySpan span{0, 1, depth, 0};
  for (auto _ : state) {
    for (size_t l = 0; l < kLayers; ++l) attention.run(pool, l, {&span, 1}, q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  // One iteration is the attention of one token through every layer.
  state.counters["tok/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(double(state.iterations()) * s.cache->bytes() / 1e9,
                                              benchmark::Counter::kIsRate);
}

BENCHMARK(Decode)
    ->ArgNames({"depth", "flash", "k", "v"})
    ->ArgsProduct({{1024, 4096, 16384}, {0, 1}, {0, 1, 2}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace
