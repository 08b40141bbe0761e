// Every ISA table against the scalar reference (and the scalar reference against float64
// math). Sizes are chosen to hit every vector-width remainder and tile edge.
#include <gtest/gtest.h>
#include <immintrin.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#ifdef KILN_HAVE_X86
#include "kernels/x86/prefetch.h"
#endif
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

const size_t kSizes[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 100, 127, 129, 1000, 4097};

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

const Ops& scalar() { return *ops_for(Isa::scalar); }

// Tables under test: every SIMD ISA this machine runs (scalar is the reference).
std::vector<const Ops*> simd_tables() {
  std::vector<const Ops*> out;
  for (Isa isa : available_isas())
    if (isa != Isa::scalar) out.push_back(ops_for(isa));
  return out;
}

// ---------------------------------------------------------------- dispatch

TEST(Dispatch, TablesAreConsistent) {
  const auto isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::scalar);
  for (Isa isa : isas) {
    ASSERT_NE(ops_for(isa), nullptr) << isa_name(isa);
    EXPECT_EQ(ops_for(isa)->isa, isa);
  }
  EXPECT_STREQ(isa_name(Isa::avx2), "avx2");
  EXPECT_STREQ(isa_name(Isa::avxvnni), "avxvnni");
  EXPECT_STREQ(isa_name(Isa::avx512), "avx512");
  // ops() is the best available unless KILN_ISA forces one.
  const char* forced = std::getenv("KILN_ISA");
  if (!forced || !*forced) {
    EXPECT_EQ(ops().isa, isas.back());
  } else {
    EXPECT_STREQ(isa_name(ops().isa), forced);
  }
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni")) {
    EXPECT_NE(ops_for(Isa::avx512), nullptr);
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(ops_for(Isa::avx2), nullptr);
  }
#ifdef KILN_HAVE_AVXVNNI
  // AVX-VNNI: CPUID leaf 7, subleaf 1, EAX bit 4 (read here without dispatch.cpp's code).
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (ops_for(Isa::avx2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4))) {
    EXPECT_NE(ops_for(Isa::avxvnni), nullptr);
  }
#endif
#endif
  // AVX-VNNI extends AVX2: its table is never offered without the avx2 one.
  if (ops_for(Isa::avxvnni)) {
    EXPECT_NE(ops_for(Isa::avx2), nullptr);
  }
}

// Tables are filled by member name: one that leaves a member out compiles (with a
// warning) to a null pointer, which this catches before a caller jumps to it.
TEST(Dispatch, EveryTableFillsEveryEntry) {
  for (Isa isa : available_isas()) {
    const Ops& t = *ops_for(isa);
    const void* entries[] = {
        (const void*)t.gemm_supports, (const void*)t.gemm,           (const void*)t.dot,
        (const void*)t.axpy,          (const void*)t.scale,          (const void*)t.add,
        (const void*)t.rmsnorm,       (const void*)t.softmax,        (const void*)t.swiglu,
        (const void*)t.rope,          (const void*)t.fp16_to_f32,    (const void*)t.f32_to_fp16,
        (const void*)t.bf16_to_f32,   (const void*)t.f32_to_bf16,    (const void*)t.layernorm,
        (const void*)t.gelu,          (const void*)t.packed_bytes,   (const void*)t.prepared_bytes,
        (const void*)t.prepare,       (const void*)t.exp_sum,        (const void*)t.pv,
        (const void*)t.ssm_update,    (const void*)t.ssm_update_rows};
    for (size_t i = 0; i < std::size(entries); ++i) EXPECT_NE(entries[i], nullptr) << isa_name(isa) << " entry " << i;
  }
}

// Disabled: runs only in the child processes started by the test below, under KILN_ISA.
TEST(Dispatch, DISABLED_ChildForcedIsa) {
  const char* forced = std::getenv("KILN_ISA");
  ASSERT_NE(forced, nullptr);
  EXPECT_STREQ(isa_name(ops().isa), forced);
  EXPECT_EQ(&ops(), ops_for(ops().isa));
}

TEST(Dispatch, EveryAvailableIsaCanBeForced) {
  // KILN_ISA=avx2 must give plain AVX2 even where AVX-VNNI or AVX-512 exist: that is how
  // the plain kernels get run (and tested end to end) on such machines.
  const std::string self = test::read_file("/proc/self/cmdline").c_str();
  for (Isa isa : available_isas()) {
    const auto r = test::run_command(std::string("KILN_ISA=") + isa_name(isa) + " " + test::shell_quote(self) +
                                     " --gtest_also_run_disabled_tests --gtest_filter=Dispatch.DISABLED_ChildForcedIsa");
    EXPECT_EQ(r.exit_code, 0) << isa_name(isa) << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("1 test"), std::string::npos) << r.out;
  }
}

// Disabled: runs only in the child process started by the test below, with KILN_ISA=bogus.
TEST(Dispatch, DISABLED_ChildBadIsaThrows) {
  ASSERT_STREQ(std::getenv("KILN_ISA"), "bogus");
  EXPECT_THROW(ops(), kiln::Error);
}

TEST(Dispatch, BadIsaEnvThrows) {
  const std::string self = test::read_file("/proc/self/cmdline").c_str();
  const auto r = test::run_command("KILN_ISA=bogus " + test::shell_quote(self) +
                                   " --gtest_also_run_disabled_tests --gtest_filter=Dispatch.DISABLED_ChildBadIsaThrows");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1 test"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("SKIPPED"), std::string::npos) << r.out;
}

#ifdef KILN_HAVE_X86
// Disabled: run only in child processes started by the test below, under KILN_PREFETCH.
TEST(Dispatch, DISABLED_ChildPrefetchDistances) {
  const std::string env = std::getenv("KILN_PREFETCH");
  ops();
  const auto& s = kiln::kernels::x86::g_stream_prefetch;
  EXPECT_EQ(s.near, 512u);
  EXPECT_EQ(s.far, 8192u);
  EXPECT_EQ(s.groups, env == "512,8192" ? 1 : 3);
  EXPECT_EQ(s.group_ahead, env == "512,8192" ? 0u : 1536u);
}
TEST(Dispatch, DISABLED_ChildBadPrefetchThrows) {
  ASSERT_NE(std::getenv("KILN_PREFETCH"), nullptr);
  EXPECT_THROW(ops(), kiln::Error);
}

TEST(Dispatch, PrefetchDistancesFromEnv) {
  const std::string self = test::read_file("/proc/self/cmdline").c_str();
  const auto child = [&](const std::string& env, const char* test) {
    const auto r = test::run_command(env + " " + test::shell_quote(self) +
                                     " --gtest_also_run_disabled_tests --gtest_filter=Dispatch." + test);
    EXPECT_EQ(r.exit_code, 0) << env << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("1 test"), std::string::npos) << r.out;
  };
  child("KILN_PREFETCH=512,8192", "DISABLED_ChildPrefetchDistances");
  child("KILN_PREFETCH=512,8192,3,1536", "DISABLED_ChildPrefetchDistances");
  for (const char* bad : {"bogus", "512", "512,", ",8192", "512,8192x", "512,8192,3", "512,8192,0,64",
                          "512,8192,5,64", "512,8192,2,64,1"})
    child(std::string("KILN_PREFETCH=") + bad, "DISABLED_ChildBadPrefetchThrows");
}
#endif

// ---------------------------------------------------------------- fp16 / bf16

#if defined(__x86_64__)
__attribute__((target("f16c"))) float hw_half_to_float(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hw_float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
// CPUID rather than __builtin_cpu_supports("f16c"), which clang does not know.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#define SKIP_WITHOUT_F16C()                                             \
  do {                                                                  \
    if (!has_f16c()) {                                                  \
      GTEST_SKIP() << "no F16C to compare against";                     \
    }                                                                   \
  } while (0)
#else
#define SKIP_WITHOUT_F16C() GTEST_SKIP() << "not x86"
float hw_half_to_float(uint16_t) { return 0; }
uint16_t hw_float_to_half(float) { return 0; }
#endif

TEST(Fp16, AllHalvesMatchHardwareAndRoundTrip) {
  SKIP_WITHOUT_F16C();
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32((uint16_t)h);
    ASSERT_EQ(bits_of(f), bits_of(hw_half_to_float((uint16_t)h))) << std::hex << h;
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    // Halves round-trip exactly; NaNs come back quieted (bit 9 set), payload kept.
    ASSERT_EQ(f32_to_fp16(f), nan ? (h | 0x200) : h) << std::hex << h;
  }
}

// The floats most likely to break a rounding routine: around half's subnormal range,
// its overflow threshold, exact ties, NaN payloads, plus uniformly random bit patterns.
std::vector<float> awkward_floats(std::mt19937& rng) {
  std::vector<float> v;
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) v.push_back(float_of(any(rng)));
  std::uniform_int_distribution<uint32_t> near(0x32000000, 0x39000000);  // ~2^-27 .. 2^-13
  for (int i = 0; i < 1000000; ++i) v.push_back(float_of(near(rng) | (any(rng) & 0x80000000)));
  for (uint32_t b = 0x477fd000; b < 0x47801000; ++b) v.push_back(float_of(b));  // 65504 .. 65536
  for (uint32_t h = 0; h < 65536; ++h) {  // exact midpoints between neighbouring halves
    const uint32_t f = bits_of(fp16_to_f32((uint16_t)h));
    if ((h & 0x7c00) != 0x7c00) v.push_back(float_of(f + (1u << 12))), v.push_back(float_of(f + (1u << 12) + 1));
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, -65520.0f, 1e-8f, 5.96046448e-8f, 2.98023224e-8f})
    v.push_back(f);
  return v;
}

TEST(Fp16, F32ToHalfMatchesHardwareRounding) {
  SKIP_WITHOUT_F16C();
  std::mt19937 rng(1);
  for (float f : awkward_floats(rng))
    ASSERT_EQ(f32_to_fp16(f), hw_float_to_half(f)) << std::hex << bits_of(f);
}

TEST(Bf16, RoundsToNearestEven) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {
    const float f = float_of(any(rng));
    const uint16_t b = f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(b)));
      continue;
    }
    // Exact in double: the chosen bf16 is no farther than either neighbour, ties even.
    const double d = f, got = bf16_to_f32(b);
    const uint16_t lo = (uint16_t)(bits_of(f) >> 16), hi = (uint16_t)(lo + 1);
    const double dlo = std::fabs(d - (double)bf16_to_f32(lo));
    const double dhi = (hi & 0x7f80) == 0x7f80 && (lo & 0x7f80) != 0x7f80 ? INFINITY : std::fabs(d - (double)bf16_to_f32(hi));
    ASSERT_TRUE(b == lo || b == hi) << std::hex << bits_of(f);
    if (std::isinf(got) && !std::isinf(f)) {  // overflow only past the last midpoint
      ASSERT_GE(std::fabs(d), 3.3961775292304957e38);
      continue;
    }
    ASSERT_LE(std::fabs(d - got), std::min(dlo, dhi)) << std::hex << bits_of(f);
    if (dlo == dhi) {
      ASSERT_EQ(b & 1, 0) << std::hex << bits_of(f);
    }
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    if (std::isnan(bf16_to_f32((uint16_t)b))) continue;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32((uint16_t)b)), b);
  }
}

// Vector conversions must agree bit for bit with the scalar ones, at every length.
TEST(Conversions, SimdMatchesScalarExactly) {
  std::mt19937 rng(3);
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = (uint16_t)i;
  std::vector<float> floats = awkward_floats(rng);
  floats.resize(300000);
  for (const Ops* o : simd_tables()) {
    SCOPED_TRACE(isa_name(o->isa));
    for (size_t n : {size_t{65536}, size_t{1}, size_t{7}, size_t{17}, size_t{31}}) {
      std::vector<float> want(n, 0), got(n + 1, 12345.0f);
      scalar().fp16_to_f32(halves.data() + 65536 - n, want.data(), n);
      o->fp16_to_f32(halves.data() + 65536 - n, got.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << n << " " << i;
      EXPECT_EQ(got[n], 12345.0f) << "wrote past the end";
      scalar().bf16_to_f32(halves.data() + 65536 - n, want.data(), n);
      o->bf16_to_f32(halves.data() + 65536 - n, got.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << n << " " << i;
    }
    for (size_t n : {floats.size(), size_t{1}, size_t{9}, size_t{15}, size_t{33}}) {
      std::vector<uint16_t> want(n), got(n + 1, 0xabcd);
      scalar().f32_to_fp16(floats.data(), want.data(), n);
      o->f32_to_fp16(floats.data(), got.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << std::hex << bits_of(floats[i]);
      EXPECT_EQ(got[n], 0xabcd);
      scalar().f32_to_bf16(floats.data(), want.data(), n);
      o->f32_to_bf16(floats.data(), got.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << std::hex << bits_of(floats[i]);
      EXPECT_EQ(got[n], 0xabcd);
    }
  }
}

// ---------------------------------------------------------------- gemm

struct Weights {
  TensorType type;
  size_t rows, k, row_bytes;
  std::vector<unsigned char> bytes;
  std::vector<float> values;  // what each stored weight decodes to
};

// Rows are padded by 3 elements so row_bytes != k * size and misuse of it shows up.
Weights make_weights(TensorType type, size_t rows, size_t k, std::mt19937& rng) {
  Weights w{type, rows, k, 0, {}, {}};
  const size_t elem = type == TensorType::F32 ? 4 : 2;
  w.row_bytes = (k + 3) * elem;
  w.bytes.assign(rows * w.row_bytes, 0xff);  // padding = NaN halves / floats
  w.values = random_floats(rows * k, rng);
  for (size_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < k; ++i) {
      unsigned char* p = w.bytes.data() + r * w.row_bytes + i * elem;
      float& v = w.values[r * k + i];
      if (type == TensorType::F32) {
        std::memcpy(p, &v, 4);
      } else {
        const uint16_t h = type == TensorType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
        v = type == TensorType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
        std::memcpy(p, &h, 2);
      }
    }
  return w;
}

GemmArgs args_for(const Weights& w, const std::vector<float>& x, size_t ldx, std::vector<float>& y,
                  size_t ldy, size_t n_batch, size_t r0, size_t r1) {
  return GemmArgs{w.type, w.bytes.data(), w.row_bytes, x.data(), ldx, y.data(), ldy, w.k, n_batch, r0, r1};
}

const TensorType kGemmTypes[] = {TensorType::F32, TensorType::F16, TensorType::BF16};

// Tolerance: |y - exact| <= 1e-5 * sum_i |w_i x_i|. A float dot product of length k
// accumulates far less than that (errors grow ~sqrt(k) * 2^-24 relative), while one
// dropped or doubled term is ~1/k of the sum, above the bound for every k tested.
TEST(Gemm, MatchesScalarAndExactMath) {
  std::mt19937 rng(4);
  std::vector<const Ops*> tables = simd_tables();
  tables.insert(tables.begin(), &scalar());
  for (TensorType type : kGemmTypes) {
    for (size_t k : kSizes) {
      const size_t rows = k > 1000 ? 11 : 19, n_batch = k > 1000 ? 9 : 37;
      const Weights w = make_weights(type, rows, k, rng);
      const size_t ldx = k + 5, ldy = rows + 2;
      const std::vector<float> x = random_floats(n_batch * ldx, rng);
      for (const Ops* o : tables) {
        ASSERT_TRUE(o->gemm_supports(type));
        for (size_t nb : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{7}, n_batch}) {
          SCOPED_TRACE(std::string(isa_name(o->isa)) + " " + type_name(type) + " k=" + std::to_string(k) +
                       " nb=" + std::to_string(nb));
          std::vector<float> y(n_batch * ldy, -777.0f);
          const size_t r0 = 1, r1 = rows - 1;  // partial range: rows outside must stay untouched
          o->gemm(args_for(w, x, ldx, y, ldy, nb, r0, r1));
          for (size_t b = 0; b < n_batch; ++b)
            for (size_t r = 0; r < ldy; ++r) {
              const float got = y[b * ldy + r];
              if (b >= nb || r < r0 || r >= r1) {
                ASSERT_EQ(got, -777.0f) << "wrote outside b=" << b << " r=" << r;
                continue;
              }
              double exact = 0, mag = 0;
              for (size_t i = 0; i < k; ++i) {
                exact += (double)w.values[r * k + i] * x[b * ldx + i];
                mag += std::fabs((double)w.values[r * k + i] * x[b * ldx + i]);
              }
              ASSERT_NEAR(got, exact, 1e-5 * mag + 1e-30) << "b=" << b << " r=" << r;
            }
        }
      }
    }
  }
}

// The determinism contract: Y[b][r] bit-identical whatever r0/r1, and whatever n_batch
// among the batched sizes (> 1); a single activation row (decode) has its own summation
// order but is equally independent of the row split.
TEST(Gemm, BitIdenticalAcrossSplitsAndBatchSizes) {
  std::mt19937 rng(5);
  for (const Ops* o : simd_tables()) {
    for (TensorType type : kGemmTypes) {
      for (size_t k : {size_t{17}, size_t{100}, size_t{1000}, size_t{4097}}) {
        SCOPED_TRACE(std::string(isa_name(o->isa)) + " " + type_name(type) + " k=" + std::to_string(k));
        const size_t rows = 29, n_batch = 37;
        const Weights w = make_weights(type, rows, k, rng);
        const std::vector<float> x = random_floats(n_batch * k, rng, -2.0f, 2.0f);
        std::vector<float> full(n_batch * rows);
        o->gemm(args_for(w, x, k, full, rows, n_batch, 0, rows));

        std::vector<float> split(n_batch * rows, NAN);  // random row splits
        for (size_t r = 0; r < rows;) {
          const size_t len = std::min<size_t>(rows - r, 1 + rng() % 9);
          o->gemm(args_for(w, x, k, split, rows, n_batch, r, r + len));
          r += len;
        }
        for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(bits_of(split[i]), bits_of(full[i])) << i;

        for (size_t b0 : {size_t{0}, size_t{17}}) {  // one activation row, whole vs split rows
          const std::vector<float> x_row(x.begin() + b0 * k, x.begin() + (b0 + 1) * k);
          std::vector<float> whole(rows), parts(rows, NAN);
          o->gemm(args_for(w, x_row, k, whole, rows, 1, 0, rows));
          for (size_t r = 0; r < rows;) {
            const size_t len = std::min<size_t>(rows - r, 1 + rng() % 5);
            o->gemm(args_for(w, x_row, k, parts, rows, 1, r, r + len));
            r += len;
          }
          for (size_t r = 0; r < rows; ++r) ASSERT_EQ(bits_of(parts[r]), bits_of(whole[r])) << "decode r=" << r;
        }
        for (size_t nb : {size_t{2}, size_t{3}, size_t{5}, size_t{7}}) {
          for (size_t b0 = 0; b0 + nb <= n_batch; b0 += 5) {  // rows b0.. of the batch alone
            std::vector<float> x_part(x.begin() + b0 * k, x.begin() + (b0 + nb) * k), y(nb * rows);
            const size_t r0 = b0 % 4, r1 = rows - b0 % 3;
            o->gemm(args_for(w, x_part, k, y, rows, nb, r0, r1));
            for (size_t b = 0; b < nb; ++b)
              for (size_t r = r0; r < r1; ++r)
                ASSERT_EQ(bits_of(y[b * rows + r]), bits_of(full[(b0 + b) * rows + r]))
                    << "nb=" << nb << " b=" << b0 + b << " r=" << r;
          }
        }
      }
    }
  }
}

TEST(Gemm, SupportedTypes) {
  for (Isa isa : available_isas()) {
    for (TensorType t : {TensorType::Q8_K, TensorType::Q8_1, TensorType::I8, TensorType::I32})
      EXPECT_FALSE(ops_for(isa)->gemm_supports(t)) << type_name(t);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                         TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K, TensorType::Q3_K,
                         TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::MXFP4,
                         TensorType::IQ2_XXS, TensorType::IQ2_XS, TensorType::IQ2_S, TensorType::IQ3_XXS,
                         TensorType::IQ3_S, TensorType::IQ1_S, TensorType::IQ1_M, TensorType::IQ4_NL,
                         TensorType::IQ4_XS, TensorType::TQ1_0, TensorType::TQ2_0})
      EXPECT_TRUE(ops_for(isa)->gemm_supports(t)) << type_name(t);
  }
}

// Float64 reference of one quantized-weight output: the exact dot product, the sum of
// |terms| (float rounding scales with it) and the most that 8-bit activations can add:
// q = round(x / s) with s = amax(the 32-block) / 127, then x is taken as q * fp16(s), so
// each x_i moves by at most s / 2 + 127 * |s - fp16(s)| <= s * (1/2 + 127/2048).
struct DotReference {
  double value = 0, magnitude = 0, int8_activation_error = 0;
};
DotReference dot_reference(const float* w, const float* x, size_t k) {
  DotReference ref;
  for (size_t i = 0; i < k; ++i) {
    ref.value += double(w[i]) * x[i];
    ref.magnitude += std::fabs(double(w[i]) * x[i]);
    double amax = 0;
    for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(double(x[j])));
    ref.int8_activation_error += std::fabs(double(w[i])) * amax / 127.0 * (0.5 + 127.0 / 2048.0);
  }
  return ref;
}

// Quantized weights: the blocks ggml made in tests/data/quant (4 rows of 256 per type)
// against float64 dot products over ggml's own dequantization of the same blocks.
TEST(Gemm, QuantizedWeightsMatchGgmlDequantization) {
  auto fixture = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-quant-fixture.gguf");
  std::mt19937 rng(11);
  const size_t k = 256, rows = 4, n_batch = 11;
  const std::vector<float> x = random_floats(n_batch * k, rng);
  int checked = 0;
  for (const char* name : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}) {
    const gguf::TensorInfo* q = fixture->find_tensor(std::string("q.") + name);
    const gguf::TensorInfo* dq = fixture->find_tensor(std::string("dq.") + name);
    ASSERT_TRUE(q && dq) << name;
    std::vector<float> w(rows * k);
    std::memcpy(w.data(), dq->data, w.size() * sizeof(float));
    for (Isa isa : available_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + name);
      // The SIMD tables run Q8_0/Q4_0/Q4_K/Q6_K with 8-bit activations (kernels/x86/avx512/gemm.cpp,
      // kernels/x86/avx2/gemm_quant.cpp).
      const bool int8_activations = isa != Isa::scalar && (q->type == TensorType::Q8_0 || q->type == TensorType::Q4_0 ||
                                                           q->type == TensorType::Q4_K || q->type == TensorType::Q6_K);
      const auto check = [&](const std::vector<float>& y, size_t nb, const std::string& what) {
        for (size_t b = 0; b < nb; ++b)
          for (size_t r = 0; r < rows; ++r) {
            const DotReference ref = dot_reference(&w[r * k], &x[b * k], k);
            const double bound = 1e-5 * ref.magnitude + (int8_activations ? ref.int8_activation_error : 0.0) + 1e-30;
            EXPECT_NEAR(y[b * rows + r], ref.value, bound) << what << " b=" << b << " r=" << r;
            // A bound that allowed any answer would prove nothing.
            EXPECT_LT(bound, 0.05 * ref.magnitude) << what << " b=" << b << " r=" << r;
          }
      };
      std::vector<float> y(n_batch * rows, NAN);
      ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, y.data(), rows, k, n_batch, 0, rows});
      check(y, n_batch, "batch");
      std::vector<float> y1(rows, NAN);  // a single activation row: the decode path
      ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, y1.data(), rows, k, 1, 0, rows});
      check(y1, 1, "decode");
      // One row at a time, and the rows split, give the same bits.
      std::vector<float> split(n_batch * rows, NAN);
      for (size_t r = 0; r < rows; ++r)
        ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, split.data(), rows, k, n_batch, r, r + 1});
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(split[i]), bits_of(y[i])) << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

// Lengths that are not whole groups of 8 blocks take the kernels' remainder loops too, and
// 5 rows a group of four plus one; K types run over 1, 3 and 5 super-blocks. Weights come
// from the reference quantizer (bit-exact with ggml, tests/quant_test.cpp).
TEST(Gemm, QuantizedWeightsAwkwardLengths) {
  std::mt19937 rng(12);
  for (TensorType type : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q4_K,
                          TensorType::Q6_K, TensorType::MXFP4}) {
    const auto* traits = kiln::kernels::ref::quant_traits(type);
    const bool k_quant = traits->block_size == 256;
    for (size_t n_blocks : k_quant ? std::vector<size_t>{1, 3, 5} : std::vector<size_t>{1, 3, 5, 8, 11, 17}) {
      const size_t k = traits->block_size * n_blocks, rows = 5, n_batch = 6;
      const size_t row_bytes = n_blocks * traits->block_bytes;
      const std::vector<float> wf = random_floats(rows * k, rng);
      std::vector<uint8_t> wq(rows * row_bytes);
      std::vector<float> w(rows * k);
      for (size_t r = 0; r < rows; ++r) {
        kiln::kernels::ref::quantize_row(type, &wf[r * k], &wq[r * row_bytes], k);
        kiln::kernels::ref::dequantize_row(type, &wq[r * row_bytes], &w[r * k], k);
      }
      const std::vector<float> x = random_floats(n_batch * k, rng);
      for (Isa isa : available_isas()) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(type) + " blocks=" + std::to_string(n_blocks));
        // Every SIMD table runs Q8_0/Q4_0/Q4_K/Q6_K/MXFP4 in the file's layout on 8-bit activations.
        const bool int8_activations = isa != Isa::scalar && type != TensorType::Q4_1 && type != TensorType::Q5_0;
        for (size_t nb : {size_t{1}, n_batch}) {
          std::vector<float> y(nb * rows, NAN);
          ops_for(isa)->gemm({type, wq.data(), row_bytes, x.data(), k, y.data(), rows, k, nb, 0, rows});
          for (size_t b = 0; b < nb; ++b)
            for (size_t r = 0; r < rows; ++r) {
              const DotReference ref = dot_reference(&w[r * k], &x[b * k], k);
              EXPECT_NEAR(y[b * rows + r], ref.value,
                          1e-5 * ref.magnitude + (int8_activations ? ref.int8_activation_error : 0.0) + 1e-30)
                  << "nb=" << nb << " b=" << b << " r=" << r;
            }
          // Batch invariance (a server's request gives the same text alone or in a batch):
          // each activation row alone gives the bits it got among the others.
          for (size_t b = 0; b < nb; ++b) {
            std::vector<float> alone(rows, NAN);
            ops_for(isa)->gemm({type, wq.data(), row_bytes, &x[b * k], k, alone.data(), rows, k, 1, 0, rows});
            for (size_t r = 0; r < rows; ++r)
              ASSERT_EQ(bits_of(alone[r]), bits_of(y[b * rows + r])) << "nb=" << nb << " b=" << b << " r=" << r;
          }
        }
      }
    }
  }
}

// MXFP4 (the experts' format, read in the file's layout): every table against the scalar
// reference over ggml's own blocks (tests/data/quant/ggml-mxfp4-fixture.gguf: ordinary,
// awkward and MXFP4 corner-case rows, including subnormal and 2^127 scales), and the
// batch contract: an output's bits do not depend on the batch size (beyond 1), on which
// rows a call covers, or on the rows around it.
TEST(Gemm, Mxfp4MatchesScalarOnGgmlBlocksAndKeepsTheBatchContract) {
  auto fixture = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-mxfp4-fixture.gguf");
  std::mt19937 rng(13);
  // Each source row is one weight row against ordinary activations. The huge scales of
  // 'mxfp4' row 4 overflow float sums: that row is held to the batch contract only.
  for (const char* source : {"", "awkward.", "mxfp4."}) {
    const gguf::TensorInfo* q = fixture->find_tensor(std::string(source) + "q.MXFP4");
    const gguf::TensorInfo* dq = fixture->find_tensor(std::string(source) + "dq.MXFP4");
    ASSERT_TRUE(q && dq) << source;
    const size_t k = 256, rows = q->dims[1];
    const std::vector<float> x = random_floats(7 * k, rng);
    std::vector<float> w(rows * k);
    std::memcpy(w.data(), dq->data, w.size() * sizeof(float));
    for (Isa isa : available_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + source);
      std::vector<float> y(7 * rows, NAN);
      ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, y.data(), rows, k, 7, 0, rows});
      for (size_t b = 0; b < 7; ++b)
        for (size_t r = 0; r < rows; ++r) {
          const DotReference ref = dot_reference(&w[r * k], &x[b * k], k);
          if (ref.magnitude > 1e37) continue;  // beyond float
          const double bound = 1e-5 * ref.magnitude + (isa == Isa::scalar ? 0.0 : ref.int8_activation_error) + 1e-30;
          EXPECT_NEAR(y[b * rows + r], ref.value, bound) << "b=" << b << " r=" << r;
        }
      // Batch sizes 2..6 and single rows give the bits of the batch of 7.
      for (size_t nb : {2, 3, 4, 5, 6}) {
        std::vector<float> part(nb * rows, NAN);
        ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, part.data(), rows, k, nb, 0, rows});
        for (size_t i = 0; i < part.size(); ++i)
          ASSERT_EQ(bits_of(part[i]), bits_of(y[i])) << "nb=" << nb << " i=" << i;
      }
      for (size_t r = 0; r < rows; ++r) {
        std::vector<float> one(7 * rows, NAN);
        ops_for(isa)->gemm({q->type, q->data, q->row_bytes(), x.data(), k, one.data(), rows, k, 7, r, r + 1});
        for (size_t b = 0; b < 7; ++b)
          ASSERT_EQ(bits_of(one[b * rows + r]), bits_of(y[b * rows + r])) << r;
      }
    }
  }
}

// ---------------------------------------------------------------- vector ops

// Reductions: |got - ref| <= 1e-6 * sum|terms| (float accumulation, any order).
TEST(VectorOps, DotAxpyScaleAddMatchScalar) {
  std::mt19937 rng(6);
  for (const Ops* o : simd_tables()) {
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(o->isa)) + " n=" + std::to_string(n));
      const auto a = random_floats(n + 1, rng), b = random_floats(n + 1, rng);
      double mag = 0;
      for (size_t i = 0; i < n; ++i) mag += std::fabs((double)a[i] * b[i]);
      EXPECT_NEAR(o->dot(a.data(), b.data(), n), scalar().dot(a.data(), b.data(), n), 1e-6 * mag + 1e-30);

      // Elementwise ops: one rounding each (axpy may fuse: 1 ulp of the larger term).
      auto y1 = b, y2 = b;
      scalar().axpy(0.37f, a.data(), y1.data(), n);
      o->axpy(0.37f, a.data(), y2.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(y2[i], y1[i], 2.5e-7f * (std::fabs(b[i]) + std::fabs(a[i])));
      EXPECT_EQ(y2[n], b[n]) << "axpy wrote past n";

      y1 = a, y2 = a;
      scalar().scale(y1.data(), -1.75f, n);
      o->scale(y2.data(), -1.75f, n);
      for (size_t i = 0; i <= n; ++i) ASSERT_EQ(y2[i], y1[i]);

      std::vector<float> out(n + 1, 5.0f);
      o->add(a.data(), b.data(), out.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
      EXPECT_EQ(out[n], 5.0f);
      y2 = a;
      o->add(y2.data(), b.data(), y2.data(), n);  // out aliases a
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(y2[i], a[i] + b[i]);
    }
  }
}

// rmsnorm vs float64: relative 1e-5 per element (sum of squares in float, one sqrt).
TEST(VectorOps, RmsnormMatchesFloat64) {
  std::mt19937 rng(7);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      const auto x = random_floats(n, rng, -3.0f, 3.0f), wt = random_floats(n, rng, 0.5f, 1.5f);
      double ss = 0;
      for (float v : x) ss += (double)v * v;
      const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
      auto out = x;
      o.rmsnorm(out.data(), wt.data(), out.data(), n, 1e-5f);  // in place
      for (size_t i = 0; i < n; ++i) {
        const double want = x[i] * inv * wt[i];
        ASSERT_NEAR(out[i], want, 1e-5 * std::fabs(want) + 1e-7) << i;
      }
    }
  }
}

// softmax vs float64: each probability within 1e-5 relative + 1e-9 absolute (the exp
// approximation is ~1e-7; the float sum of n terms adds ~n^0.5 * 6e-8).
TEST(VectorOps, SoftmaxMatchesFloat64) {
  std::mt19937 rng(8);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      for (float spread : {1.0f, 30.0f}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
        auto x = random_floats(n, rng, -spread, spread);
        if (n > 4) x[3] = -INFINITY;  // masked attention positions
        const auto in = x;
        o.softmax(x.data(), n);
        double mx = -INFINITY, sum = 0;
        for (float v : in) mx = std::max(mx, (double)v);
        for (float v : in) sum += std::exp((double)v - mx);
        double total = 0;
        for (size_t i = 0; i < n; ++i) {
          const double want = std::exp((double)in[i] - mx) / sum;
          ASSERT_NEAR(x[i], want, 1e-5 * want + 1e-9) << i;
          total += x[i];
        }
        EXPECT_NEAR(total, 1.0, 1e-5);
      }
    }
  }
}

// exp_sum (the unnormalized softmax of tiled attention) vs float64, with a max that is
// not the row's own (a running max from earlier blocks) and masked entries.
TEST(VectorOps, ExpSumMatchesFloat64) {
  std::mt19937 rng(18);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      auto x = random_floats(n, rng, -20.0f, 20.0f);
      if (n > 4) x[2] = -INFINITY;
      const auto in = x;
      const float max = 25.0f;
      const float sum = o.exp_sum(x.data(), n, max);
      double want_sum = 0;
      for (size_t i = 0; i < n; ++i) {
        const double want = std::exp((double)in[i] - max);
        ASSERT_NEAR(x[i], want, 2e-6 * want + 1e-30) << i;
        want_sum += want;
      }
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum + 1e-30);
    }
  }
}

// silu(g) * up vs float64 with g across exp's whole useful range; with up = 1 and
// g < 0 the result is ~g * e^g, so this also pins the exp approximation to 2e-6 relative.
TEST(VectorOps, SwigluMatchesFloat64) {
  std::mt19937 rng(9);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      for (bool unit_up : {true, false}) {
        const auto g = random_floats(n, rng, -85.0f, 30.0f);
        const auto up = unit_up ? std::vector<float>(n, 1.0f) : random_floats(n, rng, -2.0f, 2.0f);
        auto out = g;
        o.swiglu(out.data(), up.data(), out.data(), n);  // out aliases gate
        for (size_t i = 0; i < n; ++i) {
          const double want = (double)g[i] / (1.0 + std::exp(-(double)g[i])) * up[i];
          ASSERT_NEAR(out[i], want, 2e-6 * std::fabs(want) + 1e-38) << "g=" << g[i];
        }
      }
    }
    std::vector<float> extreme = {-1000.0f, -104.0f, -90.0f, 89.0f, 100.0f, 1e30f, INFINITY};
    const std::vector<float> ones(extreme.size(), 1.0f);
    auto out = extreme;
    o.swiglu(extreme.data(), ones.data(), out.data(), extreme.size());
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(out[i], 0.0f, 1e-30f) << extreme[i];
    for (size_t i = 3; i < 6; ++i) EXPECT_FLOAT_EQ(out[i], extreme[i]);
    EXPECT_EQ(out[6], INFINITY);
  }
}

// layernorm vs float64 (two-pass mean/variance): 2e-5 relative to the normalized value's
// scale |w| + |b|. The inputs sit on a mean of 4 with spread 2 (a residual stream with
// an offset), where a one-pass E[x^2] - mean^2 in float would lose digits; then every
// SIMD table against the scalar reference, with and without bias, in place.
TEST(VectorOps, LayernormMatchesFloat64AndScalar) {
  std::mt19937 rng(11);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      if (n == 1) continue;  // a single value normalizes to 0 / sqrt(eps): covered by the bias check below
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n) + (with_bias ? " bias" : ""));
        const auto x = random_floats(n, rng, 2.0f, 6.0f), wt = random_floats(n, rng, 0.5f, 1.5f),
                   bias = random_floats(n, rng, -0.5f, 0.5f);
        double mean = 0, var = 0;
        for (float v : x) mean += v;
        mean /= n;
        for (float v : x) var += (v - mean) * (v - mean);
        const double inv = 1.0 / std::sqrt(var / n + 1e-5);
        auto out = x;
        o.layernorm(out.data(), wt.data(), with_bias ? bias.data() : nullptr, out.data(), n, 1e-5f);  // in place
        std::vector<float> ref(n + 1, 7.0f);
        scalar().layernorm(x.data(), wt.data(), with_bias ? bias.data() : nullptr, ref.data(), n, 1e-5f);
        EXPECT_EQ(ref[n], 7.0f) << "wrote past n";
        for (size_t i = 0; i < n; ++i) {
          const double want = (x[i] - mean) * inv * wt[i] + (with_bias ? bias[i] : 0.0);
          const double tol = 2e-5 * (std::fabs(wt[i]) * std::fabs((x[i] - mean) * inv) + 1.0);
          ASSERT_NEAR(out[i], want, tol) << i;
          ASSERT_NEAR(out[i], ref[i], tol) << i;
        }
      }
    }
    float one = 3.0f, w = 2.0f, b = 0.25f, out = 0;
    o.layernorm(&one, &w, &b, &out, 1, 1e-5f);
    EXPECT_EQ(out, 0.25f) << "n=1: (x - mean) is exactly 0, only the bias is left";
  }
}

// GELU (tanh form) vs float64 over the range activations take and past where e^(-2u)
// overflows, and SIMD vs scalar: 2e-6 relative (the exp approximation plus a division)
// plus |2u| * 1.2e-7, as float 2u carries a rounding of ~6e-8 relative that exp turns
// into that much relative error of a result that is then ~x e^(2u) (x < 0).
TEST(VectorOps, GeluMatchesFloat64AndScalar) {
  std::mt19937 rng(12);
  const auto gelu64 = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      // Negative x down to -9: gelu ~ x e^(-2u) reaches ~1e-33, where 1 + tanh would
      // already be 0 in float; the relative check pins the small values too.
      const auto x = random_floats(n, rng, -9.0f, 12.0f);
      auto out = x;
      o.gelu(out.data(), out.data(), n);  // in place
      std::vector<float> ref(n + 1, 7.0f);
      scalar().gelu(x.data(), ref.data(), n);
      EXPECT_EQ(ref[n], 7.0f) << "wrote past n";
      for (size_t i = 0; i < n; ++i) {
        double want = gelu64(x[i]);
        if (x[i] < -5) want = x[i] / (1.0 + std::exp(2.0 * std::sqrt(2.0 / M_PI) * (-x[i] - 0.044715 * x[i] * x[i] * x[i])));
        const double two_u = 2.0 * std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
        const double tol = (2e-6 + 1.2e-7 * std::fabs(two_u)) * std::fabs(want) + 1e-38;
        ASSERT_NEAR(out[i], want, tol) << "x=" << x[i];
        ASSERT_NEAR(out[i], ref[i], 2 * tol) << "x=" << x[i];
      }
    }
    const std::vector<float> extreme = {-1e30f, -1000.0f, -30.0f, 0.0f, 30.0f, 1000.0f, 1e30f};
    std::vector<float> out(extreme.size());
    o.gelu(extreme.data(), out.data(), extreme.size());
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], 0.0f) << extreme[i];
    for (size_t i = 4; i < extreme.size(); ++i) EXPECT_EQ(out[i], extreme[i]);
  }
}

// rope vs the float64 rotation written out here: within 1e-6 * |x| (two roundings).
TEST(VectorOps, RopeMatchesFloat64) {
  std::mt19937 rng(10);
  struct Shape { size_t heads, head_dim, n_rot; };
  const Shape shapes[] = {{4, 64, 64}, {3, 128, 32}, {2, 6, 6}, {5, 40, 34}, {1, 2, 2}, {2, 100, 98}, {3, 16, 8}};
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (const Shape& s : shapes) {
      for (bool neox : {false, true}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " dim=" + std::to_string(s.head_dim) +
                     " rot=" + std::to_string(s.n_rot) + (neox ? " neox" : ""));
        const double pos = 17 + rng() % 1000;
        std::vector<float> cs(s.n_rot);
        std::vector<double> theta(s.n_rot / 2);
        for (size_t i = 0; i < s.n_rot / 2; ++i) {
          theta[i] = pos * std::pow(10000.0, -2.0 * i / s.n_rot);
          cs[2 * i] = (float)std::cos(theta[i]);
          cs[2 * i + 1] = (float)std::sin(theta[i]);
        }
        const auto x = random_floats(s.heads * s.head_dim, rng, -4.0f, 4.0f);
        auto out = x;
        o.rope(out.data(), s.heads, s.head_dim, s.n_rot, cs.data(), neox);
        for (size_t h = 0; h < s.heads; ++h) {
          const float* in = x.data() + h * s.head_dim;
          std::vector<double> want(in, in + s.head_dim);
          const size_t half = s.n_rot / 2;
          for (size_t i = 0; i < half; ++i) {
            const size_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            const double c = cs[i * 2], sn = cs[i * 2 + 1];
            want[i0] = in[i0] * c - in[i1] * sn;
            want[i1] = in[i0] * sn + in[i1] * c;
          }
          for (size_t d = 0; d < s.head_dim; ++d)
            ASSERT_NEAR(out[h * s.head_dim + d], want[d], 1e-6 * (std::fabs(in[d]) + 4.0)) << "h=" << h << " d=" << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::kernels
