// The i-quant and ternary weights (kernels/quant_iq.h) through every kernel table: gemm
// against float64 dot products over the reference dequantization of the same blocks,
// within the error bound the 8-bit activations allow (kernels/packed.h), and the
// determinism contract (kernels/kernels.h): the same bits for any row split, batch size,
// prepared or not, and for a single activation row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "decode_streams.h"
#include "kernels/kernels.h"
#include "kernels/quant_iq.h"
#include "kiln/gguf.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Small positive normal halves: exponent and 10 mantissa bits of f, truncated.
uint16_t fp16_bits(float f) {
  const uint32_t b = bits_of(f);
  const int e = int((b >> 23) & 255) - 127 + 15;
  return uint16_t((e << 10) | ((b >> 13) & 1023));
}

const TensorType kTypes[] = {TensorType::IQ4_NL, TensorType::IQ4_XS,  TensorType::IQ2_XXS, TensorType::IQ2_XS,
                             TensorType::IQ2_S,  TensorType::IQ3_XXS, TensorType::IQ3_S,   TensorType::IQ1_S,
                             TensorType::IQ1_M,  TensorType::TQ1_0,   TensorType::TQ2_0};

// Writes the block's fp16 super-block scale h where the format keeps it.
void set_scale(TensorType t, uint8_t* blk, uint16_t h) {
  switch (t) {
    case TensorType::IQ1_M:  // a nibble in the top of each of the four scale words
      for (int w = 0; w < 4; ++w) {
        uint8_t* hi = blk + offsetof(block_iq1_m, scales) + 2 * w + 1;
        *hi = uint8_t((*hi & 0x0f) | ((h >> (4 * w)) & 15) << 4);
      }
      break;
    case TensorType::TQ1_0:
      std::memcpy(blk + offsetof(block_tq1_0, d), &h, 2);
      break;
    case TensorType::TQ2_0:
      std::memcpy(blk + offsetof(block_tq2_0, d), &h, 2);
      break;
    default:
      std::memcpy(blk, &h, 2);
      break;  // d leads every other block
  }
}

// Random valid blocks: every bit pattern of indices, signs and sub-block scales occurs
// (every codebook is full-sized), under small positive super-block scales.
std::vector<uint8_t> random_blocks(TensorType t, size_t rows, size_t k, std::mt19937& rng) {
  const auto& q = *ref::quant_traits(t);
  std::vector<uint8_t> data(rows * k / q.block_size * q.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> scale(0.0005f, 0.002f);
  for (size_t at = 0; at < data.size(); at += q.block_bytes) set_scale(t, &data[at], fp16_bits(scale(rng)));
  return data;
}

// Float64 value and error bound of one output (test_util.h).
using Expected = test::DotExpectation;
inline Expected expected(const float* w, const float* x, size_t k, size_t act_block) {
  return test::expected_dot(w, x, k, act_block);
}

// A weight matrix as one table's gemm takes it: packed if the table packs the type.
struct Weights {
  std::vector<uint8_t> storage;
  const void* p = nullptr;
  size_t row_bytes = 0;
  bool packed = false;
};
Weights prepare_weights(const Ops& o, TensorType t, const std::vector<uint8_t>& file, size_t rows, size_t k,
                        bool pack = true) {
  const auto& q = *ref::quant_traits(t);
  Weights w;
  w.row_bytes = k / q.block_size * q.block_bytes;
  const size_t packed_size = o.packed_bytes(t, rows, k);
  if (!packed_size || !pack) {
    w.p = file.data();
    return w;
  }
  w.storage.resize(packed_size + 64);
  void* p = w.storage.data() + (64 - reinterpret_cast<uintptr_t>(w.storage.data()) % 64) % 64;
  const size_t half = (rows / 2) / 16 * 16;  // in two slices, as a loader's threads would
  pack_weights(t, file.data(), w.row_bytes, rows, k, 0, half, p);
  pack_weights(t, file.data(), w.row_bytes, rows, k, half, rows, p);
  w.p = p;
  w.packed = true;
  return w;
}

size_t act_block_of(TensorType t) { return t == TensorType::IQ4_NL ? 32 : 256; }

TEST(IquantGemm, MatchesFloat64AndIsDeterministic) {
  std::mt19937 rng(2101);
  const size_t batches[] = {1, 2, 3, 7, 16};
  const size_t n_batch = 69;  // from 64 rows the packed IQ4_NL gemm runs on AMX where the CPU has it
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (TensorType t : kTypes) {
      ASSERT_TRUE(o.gemm_supports(t)) << isa_name(isa) << " " << type_name(t);
      const std::vector<size_t> ks =
          t == TensorType::IQ4_NL ? std::vector<size_t>{32, 96, 2816} : std::vector<size_t>{256, 512, 2816};
      // Types a table packs run packed and, as a MoE's experts do, in the file's layout.
      for (bool pack : {true, false}) {
        if (!pack && !o.packed_bytes(t, 16, ks.back())) continue;
        for (size_t k : ks) {
          for (size_t rows : {size_t{1}, size_t{17}, size_t{40}, size_t{86}}) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(t) + " k=" + std::to_string(k) +
                         " rows=" + std::to_string(rows) + (pack ? " packed" : " file layout"));
            const std::vector<uint8_t> file = random_blocks(t, rows, k, rng);
            const Weights wt = prepare_weights(o, t, file, rows, k, pack);
            std::vector<float> w(rows * k);
            for (size_t r = 0; r < rows; ++r) ref::dequantize_row(t, &file[r * wt.row_bytes], &w[r * k], k);
            for (float v : w) ASSERT_TRUE(std::isfinite(v) && std::fabs(v) < 16.0f) << v;

            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            std::vector<float> x(n_batch * k);
            for (auto& v : x) v = dist(rng);
            x[2 * k + 5] = 40.0f;  // an outlier (row 2): its block's other values get coarse steps

            GemmArgs a{t, wt.p, wt.row_bytes, x.data(), k, nullptr, rows, k, n_batch, 0, rows, wt.packed, nullptr};
            std::vector<float> y(n_batch * rows, NAN);
            a.y = y.data();
            o.gemm(a);
            for (size_t b = 0; b < n_batch; ++b)
              for (size_t r = 0; r < rows; ++r) {
                const Expected e = expected(&w[r * k], &x[b * k], k, act_block_of(t));
                ASSERT_NEAR(y[b * rows + r], e.value, e.bound) << "b=" << b << " r=" << r;
                if (b != 2) {  // a bound that allowed anything would prove nothing
                  ASSERT_LT(e.bound, 0.1 * e.magnitude) << "b=" << b << " r=" << r;
                }
              }

            // Odd row splits (and prepared activations where the table prepares them).
            std::vector<uint8_t> prepared(o.prepared_bytes(t, k, n_batch) + 64);
            void* xp = prepared.data() + (64 - reinterpret_cast<uintptr_t>(prepared.data()) % 64) % 64;
            GemmArgs split = a;
            std::vector<float> y2(n_batch * rows, NAN);
            split.y = y2.data();
            if (wt.packed && o.prepared_bytes(t, k, n_batch)) {
              o.prepare(t, x.data(), k, k, 0, 6, xp);
              o.prepare(t, x.data(), k, k, 6, n_batch, xp);
              split.x_prepared = xp;
            }
            for (size_t r0 = 0; r0 < rows; r0 += 7) {
              split.r0 = r0;
              split.r1 = std::min(rows, r0 + 7);
              o.gemm(split);
            }
            for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(y2[i]), bits_of(y[i])) << i;
            // Smaller batches, a single row (decode) among them: the same bits.
            test::for_each_decode_stream([&] {
              for (size_t nb : batches) {
                GemmArgs small = a;
                std::vector<float> ys(nb * rows, NAN);
                small.x = &x[(n_batch - nb) * k];
                small.y = ys.data();
                small.n_batch = nb;
                o.gemm(small);
                for (size_t i = 0; i < ys.size(); ++i)
                  ASSERT_EQ(bits_of(ys[i]), bits_of(y[(n_batch - nb) * rows + i])) << "n_batch=" << nb << " i=" << i;
              }
            });
          }
        }
      }
    }
  }
}

// ggml's own blocks (tests/data/quant/ggml-iquant-fixture.gguf: llama.cpp's importance-
// weighted quantizations of 9 rows of 256 and of one row of 1024) against float64 dot
// products over ggml's dequantization of them: the decoders read real files as ggml does,
// independently of kernels/scalar.
TEST(IquantGemm, GgmlBlocksMatchGgmlDequantization) {
  const auto fixture = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-iquant-fixture.gguf");
  std::mt19937 rng(2104);
  const size_t n_batch = 5;
  for (const char* prefix : {"w.awkward.", "w.wide."}) {
    for (TensorType t : kTypes) {
      std::string name = type_name(t);  // the fixture's tensor names spell types in lower case
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
      const gguf::TensorInfo* q = fixture->find_tensor(prefix + std::string("q.") + name);
      const gguf::TensorInfo* dq = fixture->find_tensor(prefix + std::string("dq.") + name);
      ASSERT_TRUE(q && dq) << prefix << type_name(t);
      const size_t k = q->row_bytes() / ref::quant_traits(t)->block_bytes * ref::quant_traits(t)->block_size;
      const size_t rows = q->n_elements / k;
      const float* w = reinterpret_cast<const float*>(dq->data);
      const std::vector<uint8_t> file(q->data, q->data + q->n_bytes);
      std::vector<float> x(n_batch * k);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (auto& v : x) v = dist(rng);
      for (Isa isa : available_isas()) {
        const Ops& o = *ops_for(isa);
        for (bool pack : {true, false}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + prefix + type_name(t) + (pack ? "" : " file layout"));
          const Weights wt = prepare_weights(o, t, file, rows, k, pack);
          std::vector<float> y(n_batch * rows, NAN);
          o.gemm({t, wt.p, wt.row_bytes, x.data(), k, y.data(), rows, k, n_batch, 0, rows, wt.packed, nullptr});
          for (size_t b = 0; b < n_batch; ++b)
            for (size_t r = 0; r < rows; ++r) {
              const Expected e = expected(&w[r * k], &x[b * k], k, act_block_of(t));
              ASSERT_NEAR(y[b * rows + r], e.value, e.bound) << "b=" << b << " r=" << r;
              if (e.magnitude > 0) {  // the awkward source has all-zero rows
                ASSERT_LT(e.bound, 0.1 * e.magnitude) << "b=" << b << " r=" << r;
              }
            }
        }
      }
    }
  }
}

// The SIMD tables' own kernels: 8-bit activations give other bits than the scalar
// table's float products (a table falling back to the reference would pass the bounds
// above without testing anything).
TEST(IquantGemm, SimdTablesUseTheirOwnKernels) {
  std::mt19937 rng(2102);
  const size_t rows = 16, k = 512, n_batch = 2;
  std::vector<float> x(n_batch * k);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  const Ops& scalar = *ops_for(Isa::scalar);
  for (Isa isa : available_isas()) {
    if (isa == Isa::scalar) continue;
    const Ops& o = *ops_for(isa);
    for (TensorType t : kTypes) {
      const std::vector<uint8_t> file = random_blocks(t, rows, k, rng);
      // IQ4_XS left in the file's layout (a MoE's experts) has kernels of its own on AVX-512.
      for (bool pack : {true, false}) {
        if (!pack && !(isa == Isa::avx512 && t == TensorType::IQ4_XS)) continue;
        const Weights wt = prepare_weights(o, t, file, rows, k, pack);
        std::vector<float> y(n_batch * rows), ref_y(n_batch * rows);
        o.gemm({t, wt.p, wt.row_bytes, x.data(), k, y.data(), rows, k, n_batch, 0, rows, wt.packed, nullptr});
        scalar.gemm({t, file.data(), wt.row_bytes, x.data(), k, ref_y.data(), rows, k, n_batch, 0, rows});
        size_t differ = 0;
        for (size_t i = 0; i < y.size(); ++i) differ += bits_of(y[i]) != bits_of(ref_y[i]);
        EXPECT_GT(differ, y.size() / 2) << isa_name(isa) << " " << type_name(t) << (pack ? "" : " file layout");
      }
    }
  }
}

// The largest integer sums: every index byte at one extreme (IQ4: code 0 is -127, code
// 15 is 113) and activations at +-127, so every product has the same sign; a dot that
// saturated 16-bit steps (AVX2's vpmaddubsw) would miss by far more than the bound.
TEST(IquantGemm, ExtremeValuesDoNotSaturate) {
  std::mt19937 rng(2103);
  const size_t rows = 16, k = 512, n_batch = 5;
  std::vector<float> x(n_batch * k);
  for (size_t b = 0; b < n_batch; ++b)
    for (size_t i = 0; i < k; ++i) x[b * k + i] = b % 2 ? -1.0f : 1.0f;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (TensorType t : kTypes)
      for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(t) + " fill=" + std::to_string(fill));
        const auto& q = *ref::quant_traits(t);
        std::vector<uint8_t> file = random_blocks(t, rows, k, rng);
        for (size_t at = 0; at < file.size(); at += q.block_bytes) {
          std::memset(&file[at], fill, q.block_bytes);
          set_scale(t, &file[at], fp16_bits(0.001f));
        }
        std::vector<float> w(rows * k);
        for (bool pack : {true, false}) {
          const Weights wt = prepare_weights(o, t, file, rows, k, pack);
          for (size_t r = 0; r < rows; ++r) ref::dequantize_row(t, &file[r * wt.row_bytes], &w[r * k], k);
          std::vector<float> y(n_batch * rows, NAN);
          o.gemm({t, wt.p, wt.row_bytes, x.data(), k, y.data(), rows, k, n_batch, 0, rows, wt.packed, nullptr});
          for (size_t b = 0; b < n_batch; ++b)
            for (size_t r = 0; r < rows; ++r) {
              const Expected e = expected(&w[r * k], &x[b * k], k, act_block_of(t));
              ASSERT_NEAR(y[b * rows + r], e.value, e.bound) << "b=" << b << " r=" << r << (pack ? "" : " file layout");
            }
        }
      }
  }
}

}  // namespace
}  // namespace kiln::kernels
