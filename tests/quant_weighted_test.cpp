// ref::quantize_chunk (kernels/quant_iq.h) against ggml_quantize_chunk, byte for byte:
//  * IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 with and without importance weights, and the
//    importance-weighted legacy and K types, on tests/data/quant/ggml-iquant-fixture.gguf
//    (ordinary rows, awkward rows, and one 1024-value row whose weights differ per
//    super-block; README.md there);
//  * without importance, every type of ggml-quant-fixture.gguf (the *_ref bytes), and Q8_0
//    with importance (which ggml ignores);
//  * the dispatcher's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln::kernels {
namespace {

std::unique_ptr<gguf::File> open_data(const std::string& name) {
  return gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/" + name);
}

// ggml_type_name's spelling, which the i-quant fixture's tensor names use: "iq4_nl", "q2_K".
std::string ggml_name(TensorType t) {
  std::string s = type_name(t);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s.size() > 2 && s.substr(s.size() - 2) == "_k") s.back() = 'K';
  return s;
}

size_t row_bytes(TensorType t, size_t n) {
  const TypeInfo& info = type_info(t);
  return n / info.block_size * info.block_bytes;
}

// One fixture case: which source, read as how many rows, with or without the importance.
struct Source {
  std::string prefix;    // of the fixture's tensors, without the "w." of weighted ones
  std::string tensor;    // the F32 source
  size_t rows, per_row;  // how ggml was asked to read it
};
const Source kSources[] = {{"", "src", 4, 256}, {"awkward.", "awkward", 9, 256}, {"wide.", "src", 1, 1024}};

// Quantizes the source as ggml did and compares with `<w.><prefix>q.<type>`. Missing data
// is a failure, never a skip.
void expect_like_ggml(const gguf::File& file, TensorType type, const Source& s, bool weighted) {
  const std::string name = (weighted ? "w." : "") + s.prefix + "q." + ggml_name(type);
  const gguf::TensorInfo* src = file.find_tensor(s.tensor);
  const gguf::TensorInfo* want = file.find_tensor(name);
  const gguf::TensorInfo* importance = file.find_tensor("importance");
  ASSERT_NE(src, nullptr) << s.tensor;
  ASSERT_NE(want, nullptr) << name;
  ASSERT_NE(importance, nullptr);
  ASSERT_EQ(src->type, TensorType::F32);
  ASSERT_EQ(src->n_elements, s.rows * s.per_row);
  ASSERT_EQ(want->type, type) << name;
  ASSERT_EQ(importance->n_elements, 1024u);
  const size_t n_bytes = row_bytes(type, s.rows * s.per_row);
  ASSERT_EQ(want->n_bytes, n_bytes) << name;

  // Poisoned, so a byte the quantizer forgets to write shows.
  std::vector<uint8_t> got(n_bytes, 0xA5);
  const float* weights = weighted ? reinterpret_cast<const float*>(importance->data) : nullptr;
  ref::quantize_chunk(type, reinterpret_cast<const float*>(src->data), got.data(), s.rows, s.per_row, weights);
  const size_t row = row_bytes(type, s.per_row);
  size_t mismatches = 0;
  for (size_t k = 0; k < n_bytes; ++k) {
    if (got[k] == want->data[k]) continue;
    if (mismatches++ < 5)
      ADD_FAILURE() << name << ": row " << k / row << " byte " << k % row << " is " << int(got[k]) << ", ggml wrote "
                    << int(want->data[k]);
  }
  EXPECT_EQ(mismatches, 0u) << name;
}

class IquantFixture : public testing::Test {
 protected:
  static void SetUpTestSuite() { file_ = open_data("ggml-iquant-fixture.gguf").release(); }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static gguf::File* file_;
};
gguf::File* IquantFixture::file_ = nullptr;

TEST_F(IquantFixture, Iq4AndTernaryWithoutImportance) {
  for (TensorType t : {TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::TQ1_0, TensorType::TQ2_0})
    for (const Source& s : kSources) expect_like_ggml(*file_, t, s, false);
}

TEST_F(IquantFixture, Iq4AndTernaryWithImportance) {
  for (TensorType t : {TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::TQ1_0, TensorType::TQ2_0})
    for (const Source& s : kSources) expect_like_ggml(*file_, t, s, true);
}

TEST_F(IquantFixture, LegacyTypesWithImportance) {
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1})
    for (const Source& s : kSources) expect_like_ggml(*file_, t, s, true);
}

TEST_F(IquantFixture, KTypesWithImportance) {
  for (TensorType t : {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    for (const Source& s : kSources) expect_like_ggml(*file_, t, s, true);
}

// The weights change the bytes (the fixture would not show a quantizer that ignored them
// if ggml's weighted and unweighted bytes happened to agree).
TEST_F(IquantFixture, ImportanceChangesTheBytes) {
  for (TensorType t : {TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                       TensorType::Q5_1, TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                       TensorType::Q6_K}) {
    const gguf::TensorInfo* src = file_->find_tensor("src");
    const gguf::TensorInfo* imp = file_->find_tensor("importance");
    ASSERT_TRUE(src && imp);
    std::vector<uint8_t> plain(row_bytes(t, 1024)), weighted(plain.size());
    const float* x = reinterpret_cast<const float*>(src->data);
    ref::quantize_chunk(t, x, plain.data(), 4, 256, nullptr);
    ref::quantize_chunk(t, x, weighted.data(), 4, 256, reinterpret_cast<const float*>(imp->data));
    EXPECT_NE(plain, weighted) << type_name(t);
  }
}

// Without importance the chunk is quantize_row's bytes, ggml's *_ref (ggml-quant-fixture:
// upper-case names), the formats being row-local; Q8_0 ignores importance, as in ggml.
TEST(QuantizeChunk, WithoutImportanceIsTheReference) {
  auto file = open_data("ggml-quant-fixture.gguf");
  auto ifile = open_data("ggml-iquant-fixture.gguf");
  const float* importance = reinterpret_cast<const float*>(ifile->find_tensor("importance")->data);
  for (const auto& [source, prefix, rows] : {std::tuple{"src", "", 4}, std::tuple{"awkward", "awkward.", 9}}) {
    const float* x = reinterpret_cast<const float*>(file->find_tensor(source)->data);
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                         TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
      const gguf::TensorInfo* want = file->find_tensor(std::string(prefix) + "q." + type_name(t));
      ASSERT_NE(want, nullptr);
      std::vector<uint8_t> got(want->n_bytes, 0xA5);
      ref::quantize_chunk(t, x, got.data(), size_t(rows), 256, nullptr);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want->data)) << prefix << type_name(t);
      if (t == TensorType::Q8_0) {
        ref::quantize_chunk(t, x, got.data(), size_t(rows), 256, importance);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want->data)) << prefix << "Q8_0 with importance";
      }
    }
  }
  // The MXFP4 fixture's bytes too (no importance path in ggml).
  auto mx = open_data("ggml-mxfp4-fixture.gguf");
  const gguf::TensorInfo* want = mx->find_tensor("mxfp4.q.MXFP4");
  const gguf::TensorInfo* src = mx->find_tensor("mxfp4");
  ASSERT_TRUE(want && src);
  std::vector<uint8_t> got(want->n_bytes);
  ref::quantize_chunk(TensorType::MXFP4, reinterpret_cast<const float*>(src->data), got.data(), 7, 256, importance);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want->data));
}

// quantize_row of the new types is the chunk without importance (ggml's _ref for IQ4_XS
// and the ternary types; llama-quantize's bytes for IQ4_NL, see quant_iq.h).
TEST_F(IquantFixture, QuantizeRowOfTheNewTypes) {
  const float* x = reinterpret_cast<const float*>(file_->find_tensor("awkward")->data);
  for (TensorType t : {TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::TQ1_0, TensorType::TQ2_0}) {
    const ref::QuantTraits* traits = ref::quant_traits(t);
    ASSERT_NE(traits, nullptr);
    EXPECT_TRUE(traits->can_quantize);
    const gguf::TensorInfo* want = file_->find_tensor("awkward.q." + ggml_name(t));
    ASSERT_NE(want, nullptr);
    std::vector<uint8_t> got(want->n_bytes);
    ref::quantize_row(t, x, got.data(), 9 * 256);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want->data)) << type_name(t);
  }
}

TEST(QuantizeChunk, FloatTypesAreConverted) {
  const float x[4] = {1.0f, -2.5f, 65520.0f, 1.0f / 3};
  uint16_t h[4], b[4];
  float f[4];
  ref::quantize_chunk(TensorType::F16, x, h, 2, 2, nullptr);
  ref::quantize_chunk(TensorType::BF16, x, b, 1, 4, nullptr);
  ref::quantize_chunk(TensorType::F32, x, f, 4, 1, nullptr);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h[i], f32_to_fp16(x[i]));
    EXPECT_EQ(b[i], f32_to_bf16(x[i]));
    EXPECT_EQ(f[i], x[i]);
  }
  EXPECT_EQ(h[2], 0x7c00);  // 65520 rounds to infinity in half precision
}

TEST(QuantizeChunk, RefusesWhatGgmlRefuses) {
  EXPECT_TRUE(ref::quantize_requires_importance(TensorType::IQ2_XXS));
  EXPECT_TRUE(ref::quantize_requires_importance(TensorType::IQ2_XS));
  EXPECT_TRUE(ref::quantize_requires_importance(TensorType::IQ1_S));
  for (TensorType t : {TensorType::IQ1_M, TensorType::IQ2_S, TensorType::IQ3_XXS, TensorType::IQ3_S,
                       TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::TQ1_0, TensorType::Q2_K})
    EXPECT_FALSE(ref::quantize_requires_importance(t)) << type_name(t);

  std::vector<float> x(512, 0.5f);
  std::vector<uint8_t> out(4096);
  try {
    ref::quantize_chunk(TensorType::IQ2_XXS, x.data(), out.data(), 2, 256, nullptr);
    ADD_FAILURE() << "IQ2_XXS without importance";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS needs importance"), std::string::npos) << e.what();
  }
  try {
    ref::quantize_chunk(TensorType::IQ4_XS, x.data(), out.data(), 4, 128, nullptr);
    ADD_FAILURE() << "rows of 128 as IQ4_XS";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows of 128 values are not whole IQ4_XS blocks of 256"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ref::quantize_chunk(TensorType::Q8_K, x.data(), out.data(), 2, 256, nullptr), Error);
  EXPECT_THROW(ref::quantize_chunk(TensorType::I32, x.data(), out.data(), 2, 256, nullptr), Error);
  EXPECT_THROW(ref::quantize_chunk(TensorType(77), x.data(), out.data(), 2, 256, nullptr), Error);
  // IQ4_NL's blocks are 32 values: rows of 96 are fine.
  EXPECT_NO_THROW(ref::quantize_chunk(TensorType::IQ4_NL, x.data(), out.data(), 2, 96, nullptr));
}

}  // namespace
}  // namespace kiln::kernels
