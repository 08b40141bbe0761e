// gemm at TinyLlama shapes for every ISA and weight type, plus a plain read loop as the
// memory-bandwidth yardstick for decode.
//   decode  (n_batch 1):      weights_GB/s   (compare with MemRead bytes_per_second)
//   prefill (n_batch 64/512): GFLOP/s
// Decode weights rotate through copies totalling > 192 MB so every call streams from
// DRAM, as in a real forward pass (a 22-layer model never fits in cache).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "runtime/thread_pool.h"

namespace {

using kiln::TensorType;
using namespace kiln::kernels;

constexpr size_t kStreamBytes = 192u << 20;

size_t elem_size(TensorType t) { return t == TensorType::F32 ? 4 : 2; }

struct Matrix {
  std::vector<unsigned char> bytes;
  size_t copies, copy_bytes;
  // 64-byte aligned start, as a GGUF mapping gives (rows of 2048 halves stay aligned).
  const unsigned char* data() const {
    return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
  }
};

Matrix make_matrix(TensorType type, size_t rows, size_t k, bool stream) {
  Matrix m;
  m.copy_bytes = rows * k * elem_size(type);
  m.copies = stream ? (kStreamBytes + m.copy_bytes - 1) / m.copy_bytes : 1;
  m.bytes.resize(m.copies * m.copy_bytes + 64);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  const size_t n = m.bytes.size() / elem_size(type);  // padding gets values too
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (type == TensorType::F32) {
      std::memcpy(m.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = type == TensorType::F16 ? kiln::f32_to_fp16(v) : kiln::f32_to_bf16(v);
      std::memcpy(m.bytes.data() + 2 * i, &h, 2);
    }
  }
  return m;
}

void BM_Gemm(benchmark::State& state, Isa isa, TensorType type) {
  const size_t rows = state.range(0), k = state.range(1), n_batch = state.range(2);
  const int n_threads = (int)state.range(3);
  const Ops& o = *ops_for(isa);
  const Matrix w = make_matrix(type, rows, k, n_batch == 1);
  std::vector<float> x(n_batch * k, 0.5f), y(n_batch * rows);
  kiln::ThreadPool pool(n_threads);
  size_t copy = 0;
  for (auto _ : state) {
    const unsigned char* base = w.data() + copy * w.copy_bytes;
    copy = (copy + 1) % w.copies;
    pool.parallel_for(rows, 16, [&](size_t r0, size_t r1) {
      o.gemm(GemmArgs{type, base, k * elem_size(type), x.data(), k, y.data(), rows, k, n_batch, r0, r1});
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iters = (double)state.iterations();
  state.counters["weights_GB/s"] =
      benchmark::Counter(iters * (double)w.copy_bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(iters * 2.0 * rows * k * n_batch / 1e9, benchmark::Counter::kIsRate);
}

// A plain streaming read (the best table's dot of an array with itself: the second
// operand hits the same cache lines) over the same footprint as the decode runs.
void BM_MemRead(benchmark::State& state) {
  const int n_threads = (int)state.range(0);
  std::vector<float> storage(kStreamBytes / 4 + 16, 1.0f);
  // 64-byte aligned like model weights, so no load straddles two cache lines.
  const float* a = storage.data() + (16 - (reinterpret_cast<uintptr_t>(storage.data()) / 4) % 16) % 16;
  const size_t n = kStreamBytes / 4;
  kiln::ThreadPool pool(n_threads);
  float sink = 0;
  for (auto _ : state) {
    pool.parallel_for(n, 1024, [&](size_t b, size_t e) {
      const float s = ops().dot(a + b, a + b, e - b);
      if (b == 0) sink += s;
    });
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)kStreamBytes);
}
BENCHMARK(BM_MemRead)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemRead)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

const int kRegistered = [] {
  const struct { TensorType type; const char* name; } types[] = {
      {TensorType::F16, "F16"}, {TensorType::BF16, "BF16"}, {TensorType::F32, "F32"}};
  for (Isa isa : available_isas()) {
    if (isa == Isa::scalar) continue;  // minutes per prefill call; not a target
    for (const auto& t : types) {
      const std::string name = std::string("BM_Gemm/") + isa_name(isa) + "/" + t.name;
      // One thread: rates per CPU second, so a busy shared machine skews them less.
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, isa, t.type)
          ->ArgNames({"rows", "k", "batch", "threads"})
          ->Args({2048, 2048, 1, 1})
          ->Args({5632, 2048, 1, 1})
          ->Args({2048, 5632, 1, 1})
          ->Args({2048, 2048, 64, 1})
          ->Args({5632, 2048, 64, 1})
          ->Args({2048, 5632, 64, 1})
          ->Args({2048, 2048, 512, 1})
          ->Unit(benchmark::kMillisecond);
      // Two threads: wall-clock rates (CPU time only counts the calling thread).
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, isa, t.type)
          ->ArgNames({"rows", "k", "batch", "threads"})
          ->Args({5632, 2048, 1, 2})
          ->Args({2048, 2048, 512, 2})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}();

}  // namespace
