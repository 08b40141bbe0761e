// The codebook-search quantizers IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M
// (kernels/scalar/quant_iq{1,2,3}_quantize.cpp) against ggml's bytes:
// tests/data/quant/ggml-iquant-fixture.gguf (README there) holds ggml_quantize_chunk's
// output for each type on ordinary rows, awkward rows (zeros, outliers, ties, subnormal
// and vanishing scales) and one wide row, with and without an importance vector.
#include <gtest/gtest.h>

#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "kernels/quant_iq.h"
#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln::kernels {
namespace {

using Quantizer = void (*)(const float*, void*, size_t, size_t, const float*);

struct GridType {
  const char* name;
  const char* ggml_name;  // the fixture's tensors are named with ggml's type names
  TensorType type;
  Quantizer quantize;
  size_t block_bytes;
  bool needs_importance;
};

const GridType kTypes[] = {
    {"IQ2_XXS", "iq2_xxs", TensorType::IQ2_XXS, ref::quantize_iq2_xxs, sizeof(block_iq2_xxs), true},
    {"IQ2_XS", "iq2_xs", TensorType::IQ2_XS, ref::quantize_iq2_xs, sizeof(block_iq2_xs), true},
    {"IQ2_S", "iq2_s", TensorType::IQ2_S, ref::quantize_iq2_s, sizeof(block_iq2_s), false},
    {"IQ3_XXS", "iq3_xxs", TensorType::IQ3_XXS, ref::quantize_iq3_xxs, sizeof(block_iq3_xxs), false},
    {"IQ3_S", "iq3_s", TensorType::IQ3_S, ref::quantize_iq3_s, sizeof(block_iq3_s), false},
    {"IQ1_S", "iq1_s", TensorType::IQ1_S, ref::quantize_iq1_s, sizeof(block_iq1_s), true},
    {"IQ1_M", "iq1_m", TensorType::IQ1_M, ref::quantize_iq1_m, sizeof(block_iq1_m), false},
};

struct Source {
  const char* prefix;
  const char* tensor;
  size_t rows, per_row;
  bool weighted;
};

const Source kSources[] = {
    {"", "src", 4, 256, false},  {"awkward.", "awkward", 9, 256, false},  {"wide.", "src", 1, 1024, false},
    {"w.", "src", 4, 256, true}, {"w.awkward.", "awkward", 9, 256, true}, {"w.wide.", "src", 1, 1024, true},
};

const gguf::File& fixture() {
  static const auto file =
      gguf::File::open(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-iquant-fixture.gguf");
  return *file;
}

const float* floats(const char* name, size_t n) {
  const gguf::TensorInfo* t = fixture().find_tensor(name);
  if (!t || t->type != TensorType::F32 || t->n_elements < n) throw Error(std::string("fixture: no F32 tensor ") + name);
  return reinterpret_cast<const float*>(t->data);
}

std::vector<uint8_t> quantize(const GridType& type, const Source& s) {
  const float* importance = s.weighted ? floats("importance", s.per_row) : nullptr;
  std::vector<uint8_t> bytes(s.rows * s.per_row / QK_K * type.block_bytes, 0xA5);
  type.quantize(floats(s.tensor, s.rows * s.per_row), bytes.data(), s.rows, s.per_row, importance);
  return bytes;
}

// Counts differing bytes, reporting the first few by block and offset in the block.
size_t compare_bytes(const std::vector<uint8_t>& got, const uint8_t* want, size_t block_bytes,
                     const std::string& what) {
  size_t mismatches = 0;
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != want[k] && mismatches++ < 5)
      ADD_FAILURE() << what << ": block " << k / block_bytes << " byte " << k % block_bytes << ": " << int(got[k])
                    << " vs ggml " << int(want[k]);
  return mismatches;
}

// First, so that (run alone, as ctest runs each test) it is what builds the lazy grid
// tables: two threads quantizing the same rows at once, every type each, must agree with
// each other and with ggml.
TEST(IqGridQuantize, TablesBuiltConcurrentlyGiveTheSameBytes) {
  const Source& s = kSources[3];  // w.: every type accepts it
  std::vector<std::vector<uint8_t>> out[2];
  std::latch start(2);
  auto work = [&](int t) {
    start.arrive_and_wait();
    // Opposite orders, so each table is likely first wanted by both threads at once or by
    // one while the other builds another.
    for (size_t i = 0; i < std::size(kTypes); ++i)
      out[t].push_back(quantize(kTypes[t ? std::size(kTypes) - 1 - i : i], s));
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    const GridType& type = kTypes[i];
    const std::vector<uint8_t>& other = out[1][std::size(kTypes) - 1 - i];
    EXPECT_EQ(out[0][i], other) << type.name;
    const gguf::TensorInfo* q = fixture().find_tensor(std::string("w.q.") + type.ggml_name);
    ASSERT_TRUE(q) << type.name;
    ASSERT_EQ(q->n_bytes, out[0][i].size());
    EXPECT_EQ(compare_bytes(out[0][i], q->data, type.block_bytes, type.name), 0u);
  }
}

class IqGridFixture : public testing::TestWithParam<std::tuple<size_t, size_t>> {};

TEST_P(IqGridFixture, MatchesGgmlByteForByte) {
  const GridType& type = kTypes[std::get<0>(GetParam())];
  const Source& s = kSources[std::get<1>(GetParam())];
  const std::string name = std::string(s.prefix) + "q." + type.ggml_name;
  const gguf::TensorInfo* q = fixture().find_tensor(name);
  if (type.needs_importance && !s.weighted) {
    // ggml refuses these without an importance vector, and so the fixture has no tensor.
    EXPECT_FALSE(q) << name;
    std::vector<uint8_t> bytes(s.rows * s.per_row / QK_K * type.block_bytes);
    EXPECT_THROW(type.quantize(floats(s.tensor, s.rows * s.per_row), bytes.data(), s.rows, s.per_row, nullptr), Error);
    return;
  }
  ASSERT_TRUE(q) << name;
  ASSERT_EQ(q->type, type.type);
  const std::vector<uint8_t> bytes = quantize(type, s);
  ASSERT_EQ(q->n_bytes, bytes.size()) << name;
  EXPECT_EQ(compare_bytes(bytes, q->data, type.block_bytes, name), 0u);
}

INSTANTIATE_TEST_SUITE_P(TypesAndSources, IqGridFixture,
                         testing::Combine(testing::Range<size_t>(0, std::size(kTypes)),
                                          testing::Range<size_t>(0, std::size(kSources))),
                         [](const testing::TestParamInfo<std::tuple<size_t, size_t>>& info) {
                           std::string prefix = kSources[std::get<1>(info.param)].prefix;
                           for (char& c : prefix) c = c == '.' ? '_' : c;
                           return std::string(kTypes[std::get<0>(info.param)].name) + "_" +
                                  (prefix.empty() ? std::string("plain") : prefix.substr(0, prefix.size() - 1));
                         });

TEST(IqGridQuantize, RowsMustBeWholeSuperBlocks) {
  std::vector<float> x(512, 0.5f), importance(512, 1.0f);
  std::vector<uint8_t> out(4096);
  for (const GridType& type : kTypes) {
    for (size_t per_row : {size_t(32), size_t(255), size_t(257), size_t(384)}) {
      try {
        type.quantize(x.data(), out.data(), 1, per_row, importance.data());
        ADD_FAILURE() << type.name << " accepted rows of " << per_row;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(per_row)), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace kiln::kernels
