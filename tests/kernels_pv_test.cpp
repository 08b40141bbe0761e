// Ops::pv (P V over value rows stored by position, kernels.h): every ISA table against the
// scalar reference and the scalar reference against float64 math, on awkward sizes of
// every value type. (Its own file: kernels_test.cpp is at its size limit.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace kiln::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// n_pos value rows of `width` values of `type`, rows 6 bytes apart (strided, 2-aligned as
// blocks need), and their floats as the reference decodes them.
struct ValueRows {
  size_t stride;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
ValueRows make_value_rows(TensorType type, size_t n_pos, size_t width, std::mt19937& rng) {
  const ref::QuantTraits* q = ref::quant_traits(type);
  const size_t row = q ? width / q->block_size * q->block_bytes : width * (type == TensorType::F32 ? 4 : 2);
  ValueRows v{row + 6, std::vector<uint8_t>((row + 6) * n_pos), std::vector<float>(width * n_pos)};
  const std::vector<float> x = random_floats(width * n_pos, rng, -2.0f, 2.0f);
  for (size_t j = 0; j < n_pos; ++j) {
    uint8_t* dst = &v.bytes[j * v.stride];
    float* back = &v.values[j * width];
    if (q) {
      ref::quantize_row(type, &x[j * width], dst, width);
      ref::dequantize_row(type, dst, back, width);
      continue;
    }
    for (size_t e = 0; e < width; ++e) {
      const float f = x[j * width + e];
      const uint16_t h = type == TensorType::F16 ? f32_to_fp16(f) : f32_to_bf16(f);
      if (type == TensorType::F32) std::memcpy(dst + 4 * e, &f, 4);
      else std::memcpy(dst + 2 * e, &h, 2);
      back[e] = type == TensorType::F32 ? f : type == TensorType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return v;
}

const TensorType kValueTypes[] = {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0,
                                  TensorType::Q4_0};

// Every table against float64 sums over the reference's decoded values, the SIMD ones also
// against the scalar table: within 1e-5 * (|out| + sum_j |p v|) (up to 256 float roundings;
// one term lost or doubled is far above that). Columns past n must stay untouched. n = 544
// takes the kernels past their 512 columns decoded at once.
TEST(Pv, MatchesScalarAndFloat64) {
  std::mt19937 rng(13);
  std::vector<const Ops*> tables;
  for (Isa isa : available_isas()) tables.push_back(ops_for(isa));  // scalar first
  ASSERT_EQ(tables.front()->isa, Isa::scalar);
  for (TensorType type : kValueTypes)
    for (size_t n : {8, 64, 96, 128, 544})
      for (size_t n_pos : {1, 7, 256}) {
        // A head of 8 inside a block (e0 = 8) or at its start; wider heads one block in.
        const size_t e0 = n % 32 ? (n_pos % 2 ? 8 : 0) : 32, width = (e0 + n + 40) / 32 * 32;
        const ValueRows v = make_value_rows(type, n_pos, width, rng);
        for (size_t rows : {1, 3, 8, 13}) {
          const size_t ldp = n_pos + 3, ldo = n + 5;
          const std::vector<float> p = random_floats(rows * ldp, rng, 0.0f, 1.0f);
          const std::vector<float> out0 = random_floats(rows * ldo, rng, -1.0f, 1.0f);
          std::vector<float> by_scalar;
          for (const Ops* o : tables) {
            SCOPED_TRACE(std::string(isa_name(o->isa)) + " " + type_name(type) + " n=" + std::to_string(n) +
                         " n_pos=" + std::to_string(n_pos) + " rows=" + std::to_string(rows));
            std::vector<float> out = out0;
            o->pv({type, v.bytes.data(), v.stride, e0, n, p.data(), ldp, rows, n_pos, out.data(), ldo});
            for (size_t i = 0; i < rows; ++i)
              for (size_t e = 0; e < ldo; ++e) {
                const size_t k = i * ldo + e;
                if (e >= n) {
                  ASSERT_EQ(bits_of(out[k]), bits_of(out0[k])) << "wrote outside i=" << i << " e=" << e;
                  continue;
                }
                double exact = out0[k], mag = std::fabs(out0[k]);
                for (size_t j = 0; j < n_pos; ++j) {
                  const double term = double(p[i * ldp + j]) * v.values[j * width + e0 + e];
                  exact += term, mag += std::fabs(term);
                }
                ASSERT_NEAR(out[k], exact, 1e-5 * mag) << "i=" << i << " e=" << e;
                if (!by_scalar.empty()) ASSERT_NEAR(out[k], by_scalar[k], 1e-5 * mag) << "i=" << i << " e=" << e;
              }
            if (o->isa == Isa::scalar) by_scalar = out;
          }
        }
      }
}

// What attention relies on: positions spread over several calls (paged blocks, a ring's
// wrap) and rows taken one at a time give the bits of one call. 300 positions also cross
// the kernels' decode buffer.
TEST(Pv, PositionAndRowSplitsChangeNoBit) {
  std::mt19937 rng(14);
  const size_t n = 64, n_pos = 300, rows = 13, width = 128, e0 = 64;
  for (Isa isa : available_isas())
    for (TensorType type : kValueTypes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(type));
      const Ops& o = *ops_for(isa);
      const ValueRows v = make_value_rows(type, n_pos, width, rng);
      const std::vector<float> p = random_floats(rows * n_pos, rng, 0.0f, 1.0f);
      const std::vector<float> out0 = random_floats(rows * n, rng, -1.0f, 1.0f);
      std::vector<float> whole = out0, split = out0, by_row = out0;
      o.pv({type, v.bytes.data(), v.stride, e0, n, p.data(), n_pos, rows, n_pos, whole.data(), n});
      for (size_t j = 0, len = 0; j < n_pos; j += len) {
        len = std::min<size_t>(n_pos - j, 1 + rng() % 40);
        o.pv({type, &v.bytes[j * v.stride], v.stride, e0, n, p.data() + j, n_pos, rows, len, split.data(), n});
      }
      for (size_t i = 0; i < rows; ++i)
        o.pv({type, v.bytes.data(), v.stride, e0, n, &p[i * n_pos], n_pos, 1, n_pos, &by_row[i * n], n});
      for (size_t k = 0; k < whole.size(); ++k) {
        ASSERT_EQ(bits_of(split[k]), bits_of(whole[k])) << k;
        ASSERT_EQ(bits_of(by_row[k]), bits_of(whole[k])) << k;
      }
    }
}

// A zero-sized call changes nothing (attention never makes one, but the contract allows it).
TEST(Pv, EmptyIsANoOp) {
  const float p[1] = {1.0f};
  const float value = 3.0f;
  for (Isa isa : available_isas()) {
    float out[1] = {0.5f};
    ops_for(isa)->pv({TensorType::F32, &value, 4, 0, 1, p, 1, 1, 0, out, 1});
    ops_for(isa)->pv({TensorType::F32, &value, 4, 0, 1, p, 1, 0, 1, out, 1});
    EXPECT_EQ(out[0], 0.5f) << isa_name(isa);
  }
}

}  // namespace
}  // namespace kiln::kernels
