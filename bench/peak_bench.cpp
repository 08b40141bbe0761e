// The machine's arithmetic peaks, the yardsticks prefill is measured against
// (bench/RESULTS.md): f32 FMA (vfmadd231ps) and int8 dot products (vpdpbusd), on 512-bit
// registers (AVX-512F / AVX512-VNNI) and 256-bit ones (AVX2 FMA / AVX-VNNI), one thread
// and all of them. Each thread runs 12 independent accumulator chains, more than an FMA
// unit's latency times its ports, so the loop is bound by throughput alone; counters:
//   flops      f32: 2 (multiply + add) per lane per FMA, per second
//   int8_ops   2 per multiply-accumulate, 4 of them per 32-bit lane per vpdpbusd, per second
// and the AMX-INT8 tile product (TDPBSSD). A peak this CPU cannot run (no AVX-512, no VNNI,
// no AMX) is skipped with a message.
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own _mm512_reduce_add_ps
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdint>
#include <thread>
#include <vector>

#ifdef KILN_HAVE_AMX
#include "kernels/x86/amx/gemm_amx.h"
#endif

namespace {

constexpr int kChains = 12;
constexpr long kIterations = 1 << 22;  // per thread and benchmark iteration

__attribute__((target("avx512f"))) float fma_zmm(long n) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float fma_ymm(long n) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(float(c));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx512f,avx512vnni"))) float dpbusd_zmm(long n) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], u, s);
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  return float(_mm512_reduce_add_epi32(sum));
}

__attribute__((target("avx2,avxvnni"))) float dpbusd_ymm(long n) {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], u, s);
  __m256i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int64_t total = 0;
  for (int32_t v : lanes) total += v;
  return float(total);
}

// AMX-INT8: TDPBSSD on full 16 x 64-byte tiles, 16 x 16 x 64 multiply-accumulates each,
// 4 independent accumulator tiles (kChains instructions per iteration, 3 per tile).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-int8"))) float tdpbssd_amx(long n) {
  AmxTileConfig cfg;
  for (int t = 0; t < 6; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) int8_t a[16 * 64], b[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) a[i] = int8_t(i % 7 - 3), b[i] = int8_t(i % 5 - 2);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  static_assert(kChains == 12, "three instructions per accumulator tile");
  for (long i = 0; i < n; ++i)
    for (int round = 0; round < 3; ++round) {
      _tile_dpbssd(0, 4, 5);
      _tile_dpbssd(1, 4, 5);
      _tile_dpbssd(2, 4, 5);
      _tile_dpbssd(3, 4, 5);
    }
  alignas(64) int32_t c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return float(c[0]);
}

struct Peak {
  float (*loop)(long);
  bool (*supported)();
  double ops_per_instruction;  // flops or int8 ops
  const char* counter;
};

void BM_Peak(benchmark::State& state, Peak peak) {
  if (!peak.supported()) {
    state.SkipWithError("this CPU lacks the instructions");
    return;
  }
  const int threads = int(state.range(0));
  std::vector<float> sink(size_t(threads), 0.0f);
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back([&, t] { sink[size_t(t)] += peak.loop(kIterations); });
    sink[0] += peak.loop(kIterations);
    for (auto& t : pool) t.join();
  }
  benchmark::DoNotOptimize(sink.data());
  const double ops = double(state.iterations()) * threads * kIterations * kChains * peak.ops_per_instruction;
  state.counters[peak.counter] = benchmark::Counter(ops, benchmark::Counter::kIsRate);
}

bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512_vnni() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni"); }
bool has_avx_vnni() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni"); }
// The kernels' own check: AMX-TILE and AMX-INT8, and the kernel's permission for the tile
// state (KILN_AMX=0 skips this peak too).
bool has_amx_int8() {
#ifdef KILN_HAVE_AMX
  return kiln::kernels::amx::usable();
#else
  return false;
#endif
}

void register_peaks() {
  const int all = int(std::max(1u, std::thread::hardware_concurrency()));
  const struct {
    const char* name;
    Peak peak;
  } peaks[] = {
      {"FmaF32/zmm", {fma_zmm, has_avx512, 2 * 16, "flops"}},
      {"FmaF32/ymm", {fma_ymm, has_avx2_fma, 2 * 8, "flops"}},
      {"DpbusdInt8/zmm", {dpbusd_zmm, has_avx512_vnni, 2 * 64, "int8_ops"}},
      {"DpbusdInt8/ymm", {dpbusd_ymm, has_avx_vnni, 2 * 32, "int8_ops"}},
      {"TdpbssdInt8/amx", {tdpbssd_amx, has_amx_int8, 2.0 * 16 * 16 * 64, "int8_ops"}},
  };
  for (const auto& p : peaks) {
    auto* b = benchmark::RegisterBenchmark((std::string("BM_Peak/") + p.name).c_str(), BM_Peak, p.peak);
    b->ArgName("threads")->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
    if (all > 1) b->Arg(all);
  }
}

const bool registered = (register_peaks(), true);

}  // namespace
