// Packed quantized weights (kernels/packed.h) on every ISA that packs them: gemm against
// float64 dot products over the reference dequantization of the same file blocks, with
// the error bound the 8-bit activations allow, plus the determinism contract (row
// splits, batch sizes, prepared or not, decode vs batch: identical bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "decode_streams.h"
#include "kernels/quant.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

uint16_t fp16_bits(float f) {
  // Small positive normal halves only: exponent and 10 mantissa bits, truncated.
  uint32_t b = bits_of(f);
  const int e = int((b >> 23) & 255) - 127 + 15;
  return uint16_t((e << 10) | ((b >> 13) & 1023));
}

// Random but valid file blocks of `type`: random quantized bits, small positive fp16
// scales (K-quant min scales too), so every bit pattern the unpacking must handle occurs.
std::vector<uint8_t> random_blocks(TensorType type, size_t rows, size_t k, std::mt19937& rng) {
  const auto& q = *ref::quant_traits(type);
  std::vector<uint8_t> data(rows * k / q.block_size * q.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const auto set = [&](size_t at, float v) {
    const uint16_t h = fp16_bits(v);
    std::memcpy(&data[at], &h, 2);
  };
  for (size_t blk = 0; blk < data.size() / q.block_bytes; ++blk) {
    const size_t at = blk * q.block_bytes;
    switch (type) {
      case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q5_0: set(at, scale(rng)); break;
      case TensorType::Q4_1: case TensorType::Q5_1: set(at, scale(rng)), set(at + 2, -scale(rng) * 8); break;
      case TensorType::Q4_K: case TensorType::Q5_K: set(at, scale(rng) / 16), set(at + 2, scale(rng) / 16); break;
      case TensorType::Q6_K: set(at + offsetof(block_q6_K, d), scale(rng) / 16); break;
      case TensorType::Q3_K: set(at + offsetof(block_q3_K, d), scale(rng) / 16); break;
      case TensorType::Q2_K:
        set(at + offsetof(block_q2_K, d), scale(rng) / 4), set(at + offsetof(block_q2_K, dmin), scale(rng) / 4);
        break;
      default: break;
    }
    if (type == TensorType::Q8_0)  // the quantizer never writes -128
      for (size_t i = 0; i < 32; ++i)
        if (data[at + 2 + i] == 0x80) data[at + 2 + i] = 0x81;
  }
  return data;
}

struct Case {
  TensorType type;
  std::vector<size_t> ks;
};

// Float64 value and error bound of one output (test_util.h).
using Expected = test::DotExpectation;
inline Expected expected(const float* w, const float* x, size_t k, size_t act_block) {
  return test::expected_dot(w, x, k, act_block);
}

TEST(PackedGemm, MatchesFloat64AndIsDeterministic) {
  // k = 2112 and 2304: the 69-row batch is more than one chunk of the AVX-512 tiles
  // (packed::batch_chunk_rows: 48 and 40 rows), so chunks end inside it.
  const Case cases[] = {{TensorType::Q8_0, {32, 96, 352}}, {TensorType::Q4_0, {32, 96, 352, 2112}},
                        {TensorType::Q4_1, {32, 160}},     {TensorType::Q5_0, {32, 160}},
                        {TensorType::Q5_1, {32, 160}},     {TensorType::Q4_K, {256, 768, 2304}},
                        {TensorType::Q6_K, {256, 768}},    {TensorType::Q5_K, {256, 768}},
                        {TensorType::Q3_K, {256, 768}},    {TensorType::Q2_K, {256, 768}}};
  std::mt19937 rng(21);
  std::map<Isa, int> packed_types;  // per table: a sum would let one table hide another
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (const Case& c : cases) {
      for (size_t k : c.ks) {
        for (size_t rows : {size_t{1}, size_t{17}, size_t{40}, size_t{86}}) {
          const size_t packed_size = o.packed_bytes(c.type, rows, k);
          if (!packed_size) continue;
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(c.type) + " k=" + std::to_string(k) +
                       " rows=" + std::to_string(rows));
          packed_types[isa] += rows == 1 && k == c.ks[0];
          const auto& q = *ref::quant_traits(c.type);
          const size_t row_bytes = k / q.block_size * q.block_bytes;
          const std::vector<uint8_t> file = random_blocks(c.type, rows, k, rng);
          std::vector<float> w(rows * k);
          for (size_t r = 0; r < rows; ++r) ref::dequantize_row(c.type, &file[r * row_bytes], &w[r * k], k);
          // Valid blocks: scales landed where the format keeps them (a stray random fp16
          // would show as inf, NaN or a huge weight).
          for (float v : w) ASSERT_TRUE(std::isfinite(v) && std::fabs(v) < 8.0f) << v;
          std::vector<uint8_t> packed(packed_size + 64);
          void* p = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
          // Packed in two slices, as a loader splitting the work across threads would.
          const size_t half = (rows / 2) / 16 * 16;
          pack_weights(c.type, file.data(), row_bytes, rows, k, 0, half, p);
          pack_weights(c.type, file.data(), row_bytes, rows, k, half, rows, p);

          // 69 rows: four runs of 16 (the AMX tiles where the CPU has them, from 64 rows),
          // a 4-row tile, a single row.
          const size_t n_batch = 69;
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          std::vector<float> x(n_batch * k);
          for (auto& v : x) v = dist(rng);
          x[2 * k + 5] = 40.0f;  // an outlier (row 2): its block's other values get coarse steps

          GemmArgs a{c.type, p, 0, x.data(), k, nullptr, rows, k, n_batch, 0, rows, true, nullptr};
          std::vector<float> y(n_batch * rows, NAN);
          a.y = y.data();
          o.gemm(a);
          const size_t act_block = q.block_size == 256 ? 256 : 32;
          for (size_t b = 0; b < n_batch; ++b)
            for (size_t r = 0; r < rows; ++r) {
              const Expected e = expected(&w[r * k], &x[b * k], k, act_block);
              ASSERT_NEAR(y[b * rows + r], e.value, e.bound) << "b=" << b << " r=" << r;
              if (b != 2) {  // a bound that allowed anything would prove nothing
                ASSERT_LT(e.bound, 0.1 * e.magnitude) << "b=" << b << " r=" << r;
              }
            }

          // Prepared activations, odd row splits, single rows (decode), smaller batches:
          // the same bits.
          std::vector<uint8_t> prepared(o.prepared_bytes(c.type, k, n_batch) + 64);
          void* xp = prepared.data() + (64 - reinterpret_cast<uintptr_t>(prepared.data()) % 64) % 64;
          o.prepare(c.type, x.data(), k, k, 0, 6, xp);
          o.prepare(c.type, x.data(), k, k, 6, n_batch, xp);
          std::vector<float> y2(n_batch * rows, NAN);
          GemmArgs b2 = a;
          b2.y = y2.data();
          b2.x_prepared = xp;
          for (size_t r0 = 0; r0 < rows; r0 += 7) {
            b2.r0 = r0;
            b2.r1 = std::min(rows, r0 + 7);
            o.gemm(b2);
          }
          for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(y2[i]), bits_of(y[i])) << i;
          test::for_each_decode_stream([&] {
            for (size_t b = 0; b < n_batch; b += 4) {
              std::vector<float> y1(rows, NAN);
              GemmArgs one = a;
              one.x = &x[b * k];
              one.y = y1.data();
              one.n_batch = 1;
              o.gemm(one);
              for (size_t r = 0; r < rows; ++r) ASSERT_EQ(bits_of(y1[r]), bits_of(y[b * rows + r])) << "b=" << b;
              // A task's rows from inside a group to inside another (the lanes outside stay).
              if (rows > 16) {
                std::vector<float> y3(rows, -7.0f);
                one.y = y3.data();
                one.r0 = 16, one.r1 = rows - 3;
                o.gemm(one);
                for (size_t r = 0; r < rows; ++r)
                  ASSERT_EQ(bits_of(y3[r]), bits_of(r >= 16 && r < rows - 3 ? y[b * rows + r] : -7.0f)) << "b=" << b;
              }
            }
          });
        }
      }
    }
  }
  for (const auto& [type, k] : {std::pair{TensorType::Q4_0, size_t{2112}}, std::pair{TensorType::Q4_K, size_t{2304}}})
    EXPECT_LT(packed::batch_chunk_rows(packed::act_row_bytes(packed::act_format(type), k), 8), size_t{69});
  // This machine's AVX-512 table packs all ten types (a silent "nothing packed" would
  // skip every check above).
  if (ops_for(Isa::avx512)) {
    EXPECT_GE(packed_types[Isa::avx512], 10);
  }
  // So do the AVX2 tables (plain, and AVX-VNNI where the CPU has it).
  for (Isa isa : {Isa::avx2, Isa::avxvnni})
    if (ops_for(isa)) {
      EXPECT_GE(packed_types[isa], 10) << isa_name(isa);
    }
}

TEST(PackedGemm, LayoutsStayCloseToTheFileSize) {
  // Decode streams every weight byte once per token: a packed layout may widen the
  // K-quants' 6-bit scales to bytes (4 bytes per row and 256 elements) but no more.
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (const ref::QuantTraits* q = ref::quant_traits_begin(); q != ref::quant_traits_end(); ++q) {
      const size_t rows = 32, k = 768;
      const size_t packed = o.packed_bytes(q->type, rows, k);
      if (!packed) continue;
      const size_t file_row = k / q->block_size * q->block_bytes;
      EXPECT_LE(packed, rows * (file_row + 4 * k / 256)) << isa_name(isa) << " " << q->name;
      EXPECT_GE(packed, rows * file_row) << isa_name(isa) << " " << q->name;
    }
  }
}

TEST(PackedGemm, FilesLayoutStillWorksWhenNotPacked) {
  // Tables that pack must still accept the file layout (tests and callers that do not
  // pack): the quantized tests in kernels_test.cpp cover the values; here only that a
  // type the table packs gives the same answer unpacked within the int8 bound.
  std::mt19937 rng(22);
  const size_t rows = 20, k = 256, n_batch = 3;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (TensorType t : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q3_K,
                         TensorType::Q2_K}) {
      if (!o.packed_bytes(t, rows, k)) continue;
      const auto& q = *ref::quant_traits(t);
      const size_t row_bytes = k / q.block_size * q.block_bytes;
      const auto file = random_blocks(t, rows, k, rng);
      std::vector<float> w(rows * k), x(n_batch * k), y(n_batch * rows);
      for (size_t r = 0; r < rows; ++r) ref::dequantize_row(t, &file[r * row_bytes], &w[r * k], k);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (auto& v : x) v = dist(rng);
      o.gemm({t, file.data(), row_bytes, x.data(), k, y.data(), rows, k, n_batch, 0, rows});
      for (size_t b = 0; b < n_batch; ++b)
        for (size_t r = 0; r < rows; ++r) {
          const Expected e = expected(&w[r * k], &x[b * k], k, 32);
          EXPECT_NEAR(y[b * rows + r], e.value, e.bound) << isa_name(isa) << " " << type_name(t);
        }
    }
  }
}

// Offsets of a block's fp16 scale fields (random_blocks sets them); the rest of a block
// is quantized values and integer scales.
std::vector<size_t> fp16_fields(TensorType t) {
  switch (t) {
    case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q5_0: return {0};
    case TensorType::Q4_1: case TensorType::Q5_1: case TensorType::Q4_K: case TensorType::Q5_K: return {0, 2};
    case TensorType::Q6_K: return {offsetof(block_q6_K, d)};
    case TensorType::Q3_K: return {offsetof(block_q3_K, d)};
    case TensorType::Q2_K: return {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)};
    default: return {};
  }
}

TEST(PackedGemm, ExtremeValuesDoNotSaturate) {
  // The largest integer sums each type can produce: every quantized byte at one extreme
  // and activations at +-127 (all x equal), so every product has the same sign. A dot
  // built from saturating 16-bit steps (AVX2's vpmaddubsw sums) would clip here and miss
  // by far more than the bound; random data never comes near these sums. 0xff makes
  // every unsigned field its top value (q = 15, 31 or 63 once stored unsigned, 6-bit
  // scales 63); Q8_0 gets both ends, 127 and -128 (ggml never writes -128, a file may).
  const std::pair<TensorType, uint8_t> fills[] = {
      {TensorType::Q8_0, 0x7f}, {TensorType::Q8_0, 0x80}, {TensorType::Q4_0, 0xff}, {TensorType::Q4_1, 0xff},
      {TensorType::Q5_0, 0xff}, {TensorType::Q5_1, 0xff}, {TensorType::Q4_K, 0xff}, {TensorType::Q6_K, 0xff},
      {TensorType::Q5_K, 0xff}, {TensorType::Q3_K, 0xff}, {TensorType::Q2_K, 0xff},
      {TensorType::Q3_K, 0x00}};  // Q3_K's largest magnitude: scale -32 times q - 4 = -4
  std::mt19937 rng(23);
  // 69 rows: runs of 16 (AMX where the CPU has it, from 64 rows), a 4-row tile and a
  // single row.
  const size_t rows = 16, k = 512, n_batch = 69;
  std::vector<float> x(n_batch * k);
  for (size_t b = 0; b < n_batch; ++b)
    for (size_t i = 0; i < k; ++i) x[b * k + i] = b % 2 ? -1.0f : 1.0f;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (const auto& [type, fill] : fills) {
      const size_t packed_size = o.packed_bytes(type, rows, k);
      if (!packed_size) continue;
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(type) + " fill=" + std::to_string(fill));
      const auto& q = *ref::quant_traits(type);
      const size_t row_bytes = k / q.block_size * q.block_bytes;
      std::vector<uint8_t> file = random_blocks(type, rows, k, rng);
      for (size_t at = 0; at < file.size(); at += q.block_bytes) {
        std::vector<uint8_t> keep(file.begin() + at, file.begin() + at + q.block_bytes);
        std::memset(&file[at], fill, q.block_bytes);
        for (size_t f : fp16_fields(type)) std::memcpy(&file[at + f], &keep[f], 2);
      }
      std::vector<float> w(rows * k);
      for (size_t r = 0; r < rows; ++r) ref::dequantize_row(type, &file[r * row_bytes], &w[r * k], k);
      std::vector<uint8_t> packed(packed_size + 64);
      void* p = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
      pack_weights(type, file.data(), row_bytes, rows, k, 0, rows, p);
      std::vector<float> y(n_batch * rows, NAN);
      o.gemm({type, p, 0, x.data(), k, y.data(), rows, k, n_batch, 0, rows, true, nullptr});
      for (size_t b = 0; b < n_batch; ++b)
        for (size_t r = 0; r < rows; ++r) {
          const Expected e = expected(&w[r * k], &x[b * k], k, q.block_size == 256 ? 256 : 32);
          ASSERT_NEAR(y[b * rows + r], e.value, e.bound) << "b=" << b << " r=" << r;
          ASSERT_LT(e.bound, 0.1 * e.magnitude) << "b=" << b << " r=" << r;
        }
    }
  }
}

}  // namespace
}  // namespace kiln::kernels
