// How close a decode gemm tile streams to the memory: every layer matrix of a TinyLlama-1.1B
// shaped model (one weight type, packed as the loader packs it, random valid blocks) against
// one activation row, two threads each taking half of every matrix, against a read loop over
// the same bytes in the same order, plain (Read) and with the Intel kernels' software
// prefetch (ReadPrefetched; bench/RESULTS.md, "where decode lost its time"). Counter: bytes
// of packed weights per second.
//
//   build/bench/decode_stream_bench --benchmark_filter='Q4_0|Read' --benchmark_repetitions=4
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cli/mem_bandwidth.h"
#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "kernels/quant_iq.h"

namespace {

using kiln::TensorType;
namespace kernels = kiln::kernels;

constexpr int kLayers = 10;  // 10 x 44 M weights: far beyond the caches for every type
constexpr size_t kShapes[][2] = {{2048, 2048}, {256, 2048}, {256, 2048}, {2048, 2048},
                                 {5632, 2048}, {5632, 2048}, {2048, 5632}};  // rows, k

struct Matrix {
  size_t rows, k;
  uint8_t* packed;
  size_t bytes;
};

struct FreeHuge {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Random bytes with a small valid fp16 scale where each block keeps its d (and dmin):
// every bit pattern the unpacking handles, no inf or NaN weights.
void fill_blocks(TensorType type, std::vector<uint8_t>& data, std::mt19937& rng) {
  const auto& info = kiln::type_info(type);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = uint8_t(byte(rng));
  const uint16_t scale = 0x1c00;  // 2^-8
  for (size_t at = 0; at + info.block_bytes <= data.size(); at += info.block_bytes) {
    size_t d_at = 0;
    if (type == TensorType::Q6_K) d_at = offsetof(kernels::block_q6_K, d);
    std::memcpy(&data[at + d_at], &scale, 2);
    if (type == TensorType::Q4_K) std::memcpy(&data[at + 2], &scale, 2);
  }
}

// The packed layer matrices of one type, built once per process.
struct Model {
  std::vector<Matrix> matrices;
  std::vector<std::unique_ptr<uint8_t, FreeHuge>> storage;
  size_t bytes = 0;
};

const Model& model_of(TensorType type) {
  static std::map<TensorType, Model> models;
  auto [it, fresh] = models.try_emplace(type);
  Model& m = it->second;
  if (!fresh) return m;
  const auto& ops = kernels::ops();
  const auto& info = kiln::type_info(type);
  std::mt19937 rng(7);
  for (int layer = 0; layer < kLayers; ++layer)
    for (const auto& [rows, k] : kShapes) {
      const size_t row_bytes = k / info.block_size * info.block_bytes, bytes = ops.packed_bytes(type, rows, k);
      std::vector<uint8_t> file(rows * row_bytes);
      fill_blocks(type, file, rng);
      constexpr size_t kHuge = size_t(2) << 20;
      auto* p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
      madvise(p, bytes, MADV_HUGEPAGE);  // as the loader's arena
      kernels::pack_weights(type, file.data(), row_bytes, rows, k, 0, rows, p);
      m.storage.emplace_back(p);
      m.matrices.push_back({rows, k, p, bytes});
      m.bytes += bytes;
    }
  return m;
}

// Thread t's half of matrix m (whole 16-row groups): rows and packed bytes.
std::pair<size_t, size_t> half_rows(const Matrix& m, int t) {
  const size_t mid = (m.rows / 2 + 15) / 16 * 16;
  return t == 0 ? std::pair{size_t{0}, mid} : std::pair{mid, m.rows};
}

void tile_pass(TensorType type, const Model& model, int t, const float* x, float* y) {
  const auto& ops = kernels::ops();
  for (const Matrix& m : model.matrices) {
    const auto [r0, r1] = half_rows(m, t);
    ops.gemm({type, m.packed, 0, x, m.k, y, m.rows, m.k, 1, r0, r1, true, nullptr});
  }
}

// The same bytes, read as the roofline probe's plain or prefetched pass reads
// (src/cli/mem_bandwidth.h).
uint64_t read_pass(TensorType type, const Model& model, int t, bool prefetched) {
  const auto& ops = kernels::ops();
  uint64_t sum = 0;
  for (const Matrix& m : model.matrices) {
    const auto [r0, r1] = half_rows(m, t);
    const size_t group = ops.packed_bytes(type, 16, m.k);
    const auto* p = reinterpret_cast<const uint64_t*>(m.packed + r0 / 16 * group);
    const size_t words = (r1 - r0 + 15) / 16 * group / 8;
    sum += prefetched ? kiln::cli::sum_words_prefetched(p, words) : kiln::cli::sum_words(p, words);
  }
  return sum;
}

enum class Pass { tile, read, read_prefetched };

void BM_DecodeStream(benchmark::State& state, TensorType type, Pass pass) {
  if (kernels::ops().packed_bytes(type, 16, 2048) == 0) {
    state.SkipWithError("this CPU's kernel table does not pack the type");
    return;
  }
  const Model& model = model_of(type);
  std::vector<float> x(5632, 0.25f), y0(5632), y1(5632);
  uint64_t sink = 0;
  for (auto _ : state) {
    std::thread other([&] {
      if (pass == Pass::tile) tile_pass(type, model, 1, x.data(), y1.data());
      else sink += read_pass(type, model, 1, pass == Pass::read_prefetched);
    });
    if (pass == Pass::tile) tile_pass(type, model, 0, x.data(), y0.data());
    else sink += read_pass(type, model, 0, pass == Pass::read_prefetched);
    other.join();
  }
  benchmark::DoNotOptimize(sink);
  benchmark::DoNotOptimize(y0.data());
  state.counters["bytes_per_second"] =
      benchmark::Counter(double(model.bytes) * double(state.iterations()), benchmark::Counter::kIsRate);
}

void register_all() {
  const std::pair<const char*, TensorType> types[] = {{"Q4_0", TensorType::Q4_0}, {"Q8_0", TensorType::Q8_0},
                                                      {"Q4_K", TensorType::Q4_K}, {"Q6_K", TensorType::Q6_K},
                                                      {"IQ4_XS", TensorType::IQ4_XS}};
  for (const auto& [name, type] : types)
    for (auto [pass, pass_name] : {std::pair{Pass::tile, "/Tile"}, std::pair{Pass::read, "/Read"},
                                   std::pair{Pass::read_prefetched, "/ReadPrefetched"}})
      benchmark::RegisterBenchmark((std::string("BM_DecodeStream/") + name + pass_name).c_str(), BM_DecodeStream,
                                   type, pass)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
}

const bool registered = (register_all(), true);

}  // namespace
