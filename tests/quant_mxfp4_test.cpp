// MXFP4 (kernels/quant.h): the scalar reference against
//  * the OCP Microscaling spec's definition, decoded here bit by bit from the E2M1 and
//    E8M0 fields (independent of the kernels' doubled-value table);
//  * ggml's quantization and dequantization (tests/data/quant/ggml-mxfp4-fixture.gguf,
//    README there), bit for bit and byte for byte, on the ordinary and awkward rows of the
//    main fixture and on rows aimed at MXFP4's corner cases (ties, maxima just under a
//    power of two, values past the grid, subnormal scales, NaN, signed zeros);
//  * a round-trip bound that follows from the format;
//  * the forward pass's embedding lookup of an MXFP4 token_embd.
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

// The spec: E2M1 has sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0
// is subnormal (0 or 0.5). E8M0 is 2^(e - 127).
double e2m1(uint8_t code) {
  const int sign = code >> 3 & 1, exp = code >> 1 & 3, man = code & 1;
  const double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
  return sign ? -mag : mag;
}
double e8m0(uint8_t e) { return std::ldexp(1.0, int(e) - 127); }

TEST(Mxfp4, TraitsAndLayout) {
  const ref::QuantTraits* t = ref::quant_traits(TensorType::MXFP4);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name, "MXFP4");
  EXPECT_EQ(t->block_size, 32u);
  EXPECT_EQ(t->block_bytes, 17u);
  EXPECT_TRUE(t->can_quantize && t->can_dequantize);
  float f[64] = {};
  uint8_t b[64] = {};
  EXPECT_THROW(ref::dequantize_row(TensorType::MXFP4, b, f, 48), Error);
  EXPECT_THROW(ref::quantize_row(TensorType::MXFP4, f, b, 16), Error);
}

// Every code in every nibble position, under scales from the subnormal ones to 2^127.
TEST(Mxfp4, DequantizationFollowsTheSpec) {
  for (int e : {0, 1, 2, 3, 100, 126, 127, 128, 150, 200, 254}) {
    block_mxfp4 blk;
    blk.e = uint8_t(e);
    for (int j = 0; j < 16; ++j) blk.qs[j] = uint8_t(j | (15 - j) << 4);
    float y[32];
    ref::dequantize_row_mxfp4(&blk, y, 32);
    for (int j = 0; j < 16; ++j) {
      // The exact value as a float (past 2^128: infinity, as float arithmetic gives).
      EXPECT_EQ(y[j], float(e2m1(uint8_t(j)) * e8m0(uint8_t(e)))) << "e=" << e << " low nibble " << j;
      EXPECT_EQ(y[j + 16], float(e2m1(uint8_t(15 - j)) * e8m0(uint8_t(e)))) << "e=" << e << " high nibble " << j;
    }
    for (int c = 0; c < 16; ++c) EXPECT_EQ(double(kMxfp4Values[c]), 2 * e2m1(uint8_t(c)));
    EXPECT_EQ(double(mxfp4_half_scale(uint8_t(e))), e8m0(uint8_t(e)) / 2);
  }
}

// ggml's rule: scale 2^(floor(log2 amax) - 2), so amax lands in [4, 8) on the E2M1 grid
// (top 6) and values past 6 scales clamp; each value then rounds to the nearest grid point.
// |x - y| <= half the widest grid step (2 scales, between 4 and 6) for |x| <= 6 scales,
// and x - 6 scales < 2 scales above.
TEST(Mxfp4, RoundTripWithinTheGridBound) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(32 * 5);
    const float scale = std::ldexp(1.0f, int(rng() % 60) - 30);
    for (float& v : x) v = normal(rng) * scale;
    std::vector<uint8_t> q(5 * 17);
    std::vector<float> y(x.size());
    ref::quantize_row(TensorType::MXFP4, x.data(), q.data(), x.size());
    ref::dequantize_row(TensorType::MXFP4, q.data(), y.data(), x.size());
    for (size_t b = 0; b < 5; ++b) {
      float amax = 0;
      for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      const double s = std::ldexp(1.0, int(std::floor(std::log2(double(amax)))) - 2);
      EXPECT_EQ(e8m0(q[17 * b]), s);
      for (size_t j = 0; j < 32; ++j) {
        const double xi = x[32 * b + j], err = std::fabs(xi - y[32 * b + j]);
        const double bound = std::fabs(xi) <= 6 * s ? s : std::fabs(xi) - 6 * s;
        ASSERT_LE(err, bound * (1 + 1e-6)) << "trial " << trial << " i=" << 32 * b + j;
      }
    }
  }
}

// Out of ggml's defined range (ggml converts an out-of-range float to uint8_t): kiln
// clamps the exponent instead, and never writes E8M0's NaN (255).
TEST(Mxfp4, ExponentsClampAtTheEnds) {
  float x[32] = {};
  block_mxfp4 q;
  x[0] = std::ldexp(1.0f, -140);
  ref::quantize_row_mxfp4(x, &q, 32);
  EXPECT_EQ(q.e, 0);
  x[0] = INFINITY;
  ref::quantize_row_mxfp4(x, &q, 32);
  EXPECT_EQ(q.e, 254);
  x[0] = 0.0f;
  ref::quantize_row_mxfp4(x, &q, 32);
  EXPECT_EQ(q.e, 0);
  for (uint8_t b : q.qs) EXPECT_EQ(b, 0);
}

// ---------------------------------------------------------------- ggml fixture

struct FixtureSource {
  const char* name;
  const char* prefix;
  size_t rows;
};

class Mxfp4Fixture : public testing::TestWithParam<FixtureSource> {};

TEST_P(Mxfp4Fixture, MatchesGgmlBitForBit) {
  const FixtureSource s = GetParam();
  auto file = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-mxfp4-fixture.gguf");
  const size_t n = s.rows * 256, row_bytes = 8 * 17;
  const gguf::TensorInfo* src = file->find_tensor(s.name);
  const gguf::TensorInfo* q = file->find_tensor(std::string(s.prefix) + "q.MXFP4");
  const gguf::TensorInfo* dq = file->find_tensor(std::string(s.prefix) + "dq.MXFP4");
  ASSERT_TRUE(src && q && dq) << s.name;
  ASSERT_EQ(src->n_elements, n);
  ASSERT_EQ(q->type, TensorType::MXFP4);
  ASSERT_EQ(q->n_bytes, s.rows * row_bytes);
  ASSERT_EQ(dq->n_elements, n);

  std::vector<float> y(n);
  ref::dequantize_row(TensorType::MXFP4, q->data, y.data(), n);
  const float* want = reinterpret_cast<const float*>(dq->data);
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(want[i]) && mismatches++ < 5)
      ADD_FAILURE() << "dequantize element " << i << ": " << y[i] << " vs ggml " << want[i];
  EXPECT_EQ(mismatches, 0u);

  // Row by row, as kiln quantize does, against ggml's whole chunk (blocks are independent).
  const float* x = reinterpret_cast<const float*>(src->data);
  std::vector<uint8_t> bytes(s.rows * row_bytes);
  for (size_t r = 0; r < s.rows; ++r) ref::quantize_row(TensorType::MXFP4, x + 256 * r, &bytes[r * row_bytes], 256);
  mismatches = 0;
  for (size_t k = 0; k < bytes.size(); ++k)
    if (bytes[k] != q->data[k] && mismatches++ < 5)
      ADD_FAILURE() << "quantize block " << k / 17 << " byte " << k % 17 << ": " << int(bytes[k]) << " vs ggml "
                    << int(q->data[k]);
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Sources, Mxfp4Fixture,
                         testing::Values(FixtureSource{"src", "", 4}, FixtureSource{"awkward", "awkward.", 9},
                                         FixtureSource{"mxfp4", "mxfp4.", 7}),
                         [](const testing::TestParamInfo<FixtureSource>& info) { return std::string(info.param.name); });

// The fixture's sources are the main fixture's, so both files test the same inputs.
TEST(Mxfp4FixtureSources, AreTheMainFixtures) {
  auto mx = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-mxfp4-fixture.gguf");
  auto main = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-quant-fixture.gguf");
  for (const char* name : {"src", "awkward"}) {
    const gguf::TensorInfo* a = mx->find_tensor(name);
    const gguf::TensorInfo* b = main->find_tensor(name);
    ASSERT_TRUE(a && b) << name;
    ASSERT_EQ(a->n_bytes, b->n_bytes);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->n_bytes), 0) << name;
  }
}

// token_embd in MXFP4 is read row by row through the reference dequantization: the same
// model with token_embd stored as those dequantized floats (F32) must score the same bits.
// (Untied output, so token_embd is only looked up, never multiplied.)
TEST(Mxfp4Model, EmbeddingRowsAreTheDequantizedValues) {
  gen::GenerateOptions o = gen::peaky_options("mixtral-tiny", 7, false);
  const std::vector<uint8_t> bytes =
      gen::build_model(o, *gguf::File::open(test::shared_path("vocab/ggml-vocab-llama-spm.gguf"))).to_bytes();
  const std::string base = test::temp_dir() + "/mixtral-tiny.gguf";
  test::write_file(base, std::string(bytes.begin(), bytes.end()));
  auto in = gguf::File::open(base);
  std::string scores[2];
  for (int as_mxfp4 = 0; as_mxfp4 < 2; ++as_mxfp4) {
    gguf::Writer w;
    for (const auto& [key, value] : in->metadata())
      if (key != "general.alignment") w.set(key, value);
    for (const gguf::TensorInfo& t : in->tensors()) {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      TensorType type = t.type;
      if (t.name == "token_embd.weight") {
        ASSERT_EQ(t.type, TensorType::F32);
        std::vector<uint8_t> q(t.n_elements / 32 * 17);
        ref::quantize_row(TensorType::MXFP4, reinterpret_cast<const float*>(t.data), q.data(), t.n_elements);
        if (as_mxfp4) {
          data = q, type = TensorType::MXFP4;
        } else {
          ref::dequantize_row(TensorType::MXFP4, q.data(), reinterpret_cast<float*>(data.data()), t.n_elements);
        }
      }
      w.add_tensor(t.name, type, t.dims, std::move(data));
    }
    const std::string path = test::temp_dir() + "/embd" + std::to_string(as_mxfp4) + ".gguf";
    w.write(path);
    const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " perplexity " + test::shell_quote(path) +
                                     " -f " + test::shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt") +
                                     " -c 64 -t 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    scores[as_mxfp4] = r.out;
  }
  EXPECT_NE(scores[0].find("PPL = "), std::string::npos) << scores[0];
  EXPECT_EQ(scores[1], scores[0]);
}

}  // namespace
}  // namespace kiln::kernels
