// The i-quant and ternary types (kernels/quant_iq.h): the scalar reference dequantization
//  * against ggml's, bit for bit, on every type and source of
//    tests/data/quant/ggml-iquant-fixture.gguf (README there);
//  * against the formats' definitions where those are short enough to restate
//    independently here (IQ4_NL/IQ4_XS's value table, TQ1_0's base-3 and TQ2_0's 2-bit
//    ternary packing, the sign parity of IQ2_XXS/IQ2_XS/IQ3_XXS);
//  * in a model: every matrix and token_embd of one of these types loads and scores
//    on every kernel table (the x86 ones fall back on the scalar reference) as the same
//    model with those weights dequantized to F32.
#include <gtest/gtest.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

const TensorType kIqTypes[] = {TensorType::IQ2_XXS, TensorType::IQ2_XS, TensorType::IQ2_S, TensorType::IQ3_XXS,
                               TensorType::IQ3_S,   TensorType::IQ1_S,  TensorType::IQ1_M, TensorType::IQ4_NL,
                               TensorType::IQ4_XS,  TensorType::TQ1_0,  TensorType::TQ2_0};

// The types ggml refuses to quantize without an importance matrix: the fixture has them
// only under the "w." prefixes.
bool needs_importance(TensorType t) {
  return t == TensorType::IQ2_XXS || t == TensorType::IQ2_XS || t == TensorType::IQ1_S;
}

std::vector<float> dequantize(TensorType t, const void* blocks, size_t n) {
  std::vector<float> y(n);
  ref::dequantize_row(t, blocks, y.data(), n);
  return y;
}

TEST(IqTraits, EveryTypeDequantizesAndOnlyDequantizes) {
  for (TensorType t : kIqTypes) {
    SCOPED_TRACE(type_name(t));
    const ref::QuantTraits* q = ref::quant_traits(t);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(std::string(q->name), type_name(t));
    EXPECT_EQ(q->block_size, type_info(t).block_size);
    EXPECT_EQ(q->block_bytes, type_info(t).block_bytes);
    EXPECT_TRUE(q->can_dequantize);
    std::vector<uint8_t> blocks(2 * q->block_bytes);
    std::vector<float> y(2 * q->block_size);
    EXPECT_THROW(ref::dequantize_row(t, blocks.data(), y.data(), q->block_size + 16), Error);
    if (!q->can_quantize) {
      EXPECT_THROW(ref::quantize_row(t, y.data(), blocks.data(), q->block_size), Error);
    }
  }
}

// ---------------------------------------------------------------- ggml fixture

struct FixtureCase {
  TensorType type;
  const char* prefix;
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.prefix << type_name(c.type); }

std::string case_name(const FixtureCase& c) {
  std::string p = c.prefix;
  for (char& ch : p) ch = ch == '.' ? '_' : ch;
  return type_name(c.type) + (p.empty() ? "" : "_" + p.substr(0, p.size() - 1));
}

std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> cases;
  for (TensorType t : kIqTypes)
    for (const char* p : {"", "awkward.", "wide.", "w.", "w.awkward.", "w.wide."}) cases.push_back({t, p});
  return cases;
}

const gguf::File& iquant_fixture() {
  static const std::unique_ptr<gguf::File> file =
      gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-iquant-fixture.gguf");
  return *file;
}

class IqFixture : public testing::TestWithParam<FixtureCase> {};

TEST_P(IqFixture, DequantizationMatchesGgmlBitForBit) {
  const FixtureCase c = GetParam();
  std::string name = type_name(c.type);  // ggml's type names, lower case
  for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const gguf::TensorInfo* q = iquant_fixture().find_tensor(c.prefix + std::string("q.") + name);
  const gguf::TensorInfo* dq = iquant_fixture().find_tensor(c.prefix + std::string("dq.") + name);
  if (needs_importance(c.type) && std::string(c.prefix).rfind("w.", 0) != 0) {
    EXPECT_TRUE(!q && !dq) << "ggml cannot quantize " << name << " without importance weights";
    return;
  }
  ASSERT_TRUE(q && dq) << c.prefix << name;
  ASSERT_EQ(q->type, c.type);
  ASSERT_EQ(dq->type, TensorType::F32);
  ASSERT_EQ(q->n_elements, dq->n_elements);
  ASSERT_EQ(q->n_bytes, q->n_elements / type_info(c.type).block_size * type_info(c.type).block_bytes);

  const std::vector<float> y = dequantize(c.type, q->data, q->n_elements);
  const float* want = reinterpret_cast<const float*>(dq->data);
  size_t mismatches = 0;
  for (size_t i = 0; i < y.size(); ++i)
    if (std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(want[i]) && mismatches++ < 5)
      ADD_FAILURE() << "element " << i << ": " << y[i] << " vs ggml " << want[i];
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(TypesAndSources, IqFixture, testing::ValuesIn(fixture_cases()),
                         [](const testing::TestParamInfo<FixtureCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------- the formats' definitions

uint16_t half(float v) { return f32_to_fp16(v); }

// Every 4-bit index in both nibble positions gives its table value times the scale.
TEST(IqDefinition, Iq4nlIndexesTheNonLinearTable) {
  for (float d : {1.0f, 0.0123f, -3.5f, 6.1e-5f}) {
    block_iq4_nl b;
    b.d = half(d);
    for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (15 - j) << 4);
    const std::vector<float> y = dequantize(TensorType::IQ4_NL, &b, 32);
    const float ds = fp16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], ds * float(kIq4nlValues[j])) << j;
      EXPECT_EQ(y[j + 16], ds * float(kIq4nlValues[15 - j])) << j;
    }
  }
}

// IQ4_XS: the same table under a 6-bit scale per 32, biased by 32, split 4 + 2 bits.
TEST(IqDefinition, Iq4xsSixBitScales) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    block_iq4_xs b;
    b.d = half(0.25f);
    int ls[8];
    b.scales_h = 0;
    for (int g = 0; g < 8; ++g) {
      ls[g] = int(rng() % 64);
      b.scales_h = uint16_t(b.scales_h | (ls[g] >> 4) << (2 * g));
    }
    for (int k = 0; k < 4; ++k) b.scales_l[k] = uint8_t((ls[2 * k] & 15) | (ls[2 * k + 1] & 15) << 4);
    for (uint8_t& q : b.qs) q = uint8_t(rng());
    const std::vector<float> y = dequantize(TensorType::IQ4_XS, &b, 256);
    for (int e = 0; e < 256; ++e) {
      const int g = e / 32, j = e % 32;
      const uint8_t byte = b.qs[16 * g + j % 16];
      const int q = j < 16 ? byte & 15 : byte >> 4;
      // 0.25 * (ls - 32) * value is exact in float: small integers times a power of two.
      ASSERT_EQ(y[e], 0.25f * float(ls[g] - 32) * float(kIq4nlValues[q])) << "trial " << trial << " e " << e;
    }
  }
}

// TQ2_0: element 128h + 32l + m is bits 2l..2l+1 of qs[32h + m], minus 1.
TEST(IqDefinition, Tq2TernaryPairsOfBits) {
  std::mt19937 rng(4);
  int t[256];
  block_tq2_0 b = {};
  for (int e = 0; e < 256; ++e) {
    t[e] = int(rng() % 3);
    b.qs[32 * (e / 128) + e % 32] |= uint8_t(t[e] << (2 * (e % 128 / 32)));
  }
  b.d = half(-0.75f);
  const std::vector<float> y = dequantize(TensorType::TQ2_0, &b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], -0.75f * float(t[e] - 1)) << e;
}

// TQ1_0: five ternary digits per byte as the fraction value / 3^5, rounded up to 8 bits
// (four in qh, then a zero digit); elements run down the digits of each run of bytes.
TEST(IqDefinition, Tq1BaseThreePacking) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    int t[256];
    for (int& v : t) v = int(rng() % 3);
    block_tq1_0 b;
    const auto pack = [](const int* digits, int count) {
      int v = 0;
      for (int i = 0; i < count; ++i) v = 3 * v + digits[i];
      for (int i = count; i < 5; ++i) v *= 3;
      return uint8_t((v * 256 + 242) / 243);
    };
    int digits[5];
    for (int m = 0; m < 32; ++m) {
      for (int n = 0; n < 5; ++n) digits[n] = t[32 * n + m];
      b.qs[m] = pack(digits, 5);
    }
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 5; ++n) digits[n] = t[160 + 16 * n + m];
      b.qs[32 + m] = pack(digits, 5);
    }
    for (int m = 0; m < 4; ++m) {
      for (int n = 0; n < 4; ++n) digits[n] = t[240 + 4 * n + m];
      b.qh[m] = pack(digits, 4);
    }
    b.d = half(2.0f);
    const std::vector<float> y = dequantize(TensorType::TQ1_0, &b, 256);
    for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], 2.0f * float(t[e] - 1)) << "trial " << trial << " e " << e;
  }
}

// Types with 7 stored sign bits per 8 values: random blocks decode to grid magnitudes
// (never 0) with an even number of negatives in every group of 8.
TEST(IqDefinition, SevenSignBitsGiveEvenNegatives) {
  std::mt19937 rng(6);
  for (TensorType t : {TensorType::IQ2_XXS, TensorType::IQ2_XS, TensorType::IQ3_XXS}) {
    SCOPED_TRACE(type_name(t));
    std::vector<uint8_t> blk(type_info(t).block_bytes * 16);
    for (uint8_t& v : blk) v = uint8_t(rng());
    for (size_t i = 0; i < 16; ++i) std::memcpy(&blk[i * type_info(t).block_bytes], "\x00\x3c", 2);  // d = 1
    const std::vector<float> y = dequantize(t, blk.data(), 16 * 256);
    for (size_t g = 0; g < y.size(); g += 8) {
      int negatives = 0;
      for (size_t j = 0; j < 8; ++j) {
        ASSERT_NE(y[g + j], 0.0f);
        negatives += y[g + j] < 0;
      }
      ASSERT_EQ(negatives % 2, 0) << "group at " << g;
    }
  }
}

// ---------------------------------------------------------------- in a model

// Where a block keeps its fp16 super-block scale: the first field, TQ1_0/TQ2_0's last,
// IQ1_M's spread over the top nibbles of its four scale words (nibble k in word k).
void set_block_scale(TensorType t, uint8_t* blk, uint16_t d) {
  switch (t) {
    case TensorType::TQ1_0: std::memcpy(blk + 52, &d, 2); return;
    case TensorType::TQ2_0: std::memcpy(blk + 64, &d, 2); return;
    case TensorType::IQ1_M:
      for (int k = 0; k < 4; ++k) blk[48 + 2 * k + 1] = uint8_t((blk[48 + 2 * k + 1] & 0x0f) | ((d >> (4 * k)) & 15) << 4);
      return;
    default: std::memcpy(blk, &d, 2); return;
  }
}

// n_blocks random blocks of t (every index, sign and sub-scale drawn at random: any bytes
// are a valid block), one fp16 scale chosen so that the values' RMS is about `rms`.
std::vector<uint8_t> random_blocks(TensorType t, size_t n_blocks, double rms, std::mt19937& rng) {
  const size_t bytes = type_info(t).block_bytes, n = n_blocks * type_info(t).block_size;
  std::vector<uint8_t> q(n_blocks * bytes);
  for (uint8_t& v : q) v = uint8_t(rng());
  for (size_t b = 0; b < n_blocks; ++b) set_block_scale(t, &q[b * bytes], half(1.0f));
  double sum_sq = 0;
  for (float v : dequantize(t, q.data(), n)) sum_sq += double(v) * v;
  const uint16_t d = half(float(rms / std::sqrt(sum_sq / double(n))));
  for (size_t b = 0; b < n_blocks; ++b) set_block_scale(t, &q[b * bytes], d);
  return q;
}

struct Scored {
  double ppl = 0;
  std::string text;
};

Scored score(const std::string& model, Isa isa) {
  const std::string env = "KILN_ISA=" + std::string(isa_name(isa)) + " ";
  const std::string kiln = env + test::shell_quote(test::kiln_binary());
  const auto p = test::run_command(kiln + " perplexity " + test::shell_quote(model) + " -f " +
                                   test::shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt") +
                                   " -c 64 -t 2");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  Scored s;
  double err = 0;
  EXPECT_EQ(std::sscanf(test::trim(p.out).c_str(), "PPL = %lf +/- %lf", &s.ppl, &err), 2) << p.out;
  const auto r = test::run_command(kiln + " run " + test::shell_quote(model) +
                                   " 'Once upon a time' -n 12 --temp 0 -t 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  s.text = r.out;
  return s;
}

class IqModel : public testing::TestWithParam<TensorType> {};

// A llama whose matrices, token_embd and output included, are random blocks of the type,
// against the same model with those weights dequantized into F32: on the scalar table the
// only difference is the order of the matmuls' sums (per block, then across blocks), so
// perplexities agree to float rounding and greedy text is the same; the SIMD tables add
// the 8-bit activations' error.
TEST_P(IqModel, LoadsAndScoresAsItsDequantizedWeightsOnEveryIsa) {
  const TensorType type = GetParam();
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("iquant-tiny");
  o.type = TensorType::F32;
  o.seed = 21;
  const std::vector<uint8_t> bytes =
      gen::build_model(o, *gguf::File::open(test::shared_path("models/stories260K.gguf"))).to_bytes();
  const std::string base = test::temp_dir() + "/iquant-tiny.gguf";
  test::write_file(base, std::string(bytes.begin(), bytes.end()));
  auto in = gguf::File::open(base);
  std::mt19937 rng{uint32_t(type)};
  gguf::Writer quant, dequant;
  for (const auto& [key, value] : in->metadata())
    if (key != "general.alignment") quant.set(key, value), dequant.set(key, value);
  int matrices = 0;
  for (const gguf::TensorInfo& t : in->tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
    if (t.dims.size() != 2) {
      quant.add_tensor(t.name, t.type, t.dims, data);
      dequant.add_tensor(t.name, t.type, t.dims, std::move(data));
      continue;
    }
    ASSERT_EQ(t.dims[0] % 256, 0u) << t.name;
    ++matrices;
    std::vector<uint8_t> q = random_blocks(type, t.n_elements / type_info(type).block_size, 0.05, rng);
    const std::vector<float> f = dequantize(type, q.data(), t.n_elements);
    std::memcpy(data.data(), f.data(), data.size());
    quant.add_tensor(t.name, type, t.dims, std::move(q));
    dequant.add_tensor(t.name, TensorType::F32, t.dims, std::move(data));
  }
  ASSERT_EQ(matrices, 2 + 2 * 7);  // token_embd, output; q, k, v, o, gate, up, down per layer
  const std::string qpath = test::temp_dir() + "/" + type_name(type) + ".gguf";
  const std::string fpath = test::temp_dir() + "/" + type_name(type) + "-f32.gguf";
  quant.write(qpath);
  dequant.write(fpath);

  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const Scored a = score(qpath, isa), b = score(fpath, isa);
    std::printf("[ %s %s ] PPL %.6f, dequantized to F32 %.6f\n", type_name(type).c_str(), isa_name(isa), a.ppl, b.ppl);
    EXPECT_TRUE(std::isfinite(a.ppl) && a.ppl > 1) << a.ppl;
    EXPECT_FALSE(a.text.empty());
    if (isa == Isa::scalar) {
      EXPECT_NEAR(a.ppl, b.ppl, b.ppl * 2e-5);  // seen: 1.5e-6 at most
      EXPECT_EQ(a.text, b.text);
    } else {
      // The SIMD tables multiply 8-bit activations (kernels/packed.h's error budget), as
      // llama.cpp does, so the text of this noise model may part at a near tie; seen: 0.15%.
      EXPECT_NEAR(a.ppl, b.ppl, b.ppl * 5e-3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, IqModel, testing::ValuesIn(kIqTypes),
                         [](const testing::TestParamInfo<TensorType>& info) { return type_name(info.param); });

}  // namespace
}  // namespace kiln::kernels
