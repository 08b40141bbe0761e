// kiln quantize's presets (src/quantize/):
//  * the per-tensor type rules on hand-made tensor lists, for the cases the llama.cpp
//    tables below cannot reach (70B models, refusals, tensor order);
//  * the real binary on a generated 16-layer model of each family and on stories260K for
//    every preset, against tables of what llama-quantize wrote for the same inputs: each tensor's type
//    and the SHA-256 of its bytes (tests/data/quant/README.md);
//  * command-line behaviour: names, progress output, errors, threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "model/generate_model.h"
#include "quantize/mix.h"
#include "sha256.h"
#include "test_util.h"

namespace kiln::quantize {
namespace {

using namespace kiln::test;

// ---------------------------------------------------------------- presets

TEST(QuantizePresets, NamesFileTypesAndBaseTypes) {
  struct Want {
    const char* name;
    uint32_t file_type;  // LLAMA_FTYPE_MOSTLY_* in llama.cpp's include/llama.h
    TensorType base;
    bool mix;
  };
  const Want want[] = {
      {"Q8_0", 7, TensorType::Q8_0, false},    {"Q4_0", 2, TensorType::Q4_0, false},
      {"Q4_1", 3, TensorType::Q4_1, false},    {"Q5_0", 8, TensorType::Q5_0, false},
      {"Q5_1", 9, TensorType::Q5_1, false},    {"Q2_K", 10, TensorType::Q2_K, true},
      {"Q3_K_S", 11, TensorType::Q3_K, true},  {"Q3_K_M", 12, TensorType::Q3_K, true},
      {"Q3_K_L", 13, TensorType::Q3_K, true},  {"Q4_K_S", 14, TensorType::Q4_K, true},
      {"Q4_K_M", 15, TensorType::Q4_K, true},  {"Q5_K_S", 16, TensorType::Q5_K, true},
      {"Q5_K_M", 17, TensorType::Q5_K, true},  {"Q6_K", 18, TensorType::Q6_K, true},
  };
  for (const Want& w : want) {
    const Preset* p = find_preset(w.name);
    ASSERT_NE(p, nullptr) << w.name;
    EXPECT_EQ(p->name, w.name);
    EXPECT_EQ(uint32_t(p->file_type), w.file_type) << w.name;
    EXPECT_EQ(p->base_type, w.base) << w.name;
    EXPECT_EQ(p->llama_mix, w.mix) << w.name;
    EXPECT_NE(preset_names().find(w.name), std::string::npos) << w.name;
  }
  EXPECT_EQ(find_preset("q4_k_m"), find_preset("Q4_K_M"));
  EXPECT_EQ(find_preset("q6_k"), find_preset("Q6_K"));
  // llama-quantize's aliases for the medium mixes.
  EXPECT_EQ(find_preset("Q3_K"), find_preset("Q3_K_M"));
  EXPECT_EQ(find_preset("q4_k"), find_preset("Q4_K_M"));
  EXPECT_EQ(find_preset("Q5_K"), find_preset("Q5_K_M"));
  for (const char* bad : {"Q7_7", "Q8_K", "F16", "Q2_K_S", "IQ2_XS", "", "Q4_K_MM"})
    EXPECT_EQ(find_preset(bad), nullptr) << bad;
}

// ---------------------------------------------------------------- rules

// A llama model's tensors as kiln-gen writes them (token_embd, output_norm, output, then
// each layer in file order), with the given widths.
std::vector<TensorDesc> llama_tensors(uint32_t n_layers, uint64_t dim, uint64_t kv_dim, uint64_t ffn, bool tied,
                                      uint64_t n_vocab = 512) {
  std::vector<TensorDesc> t;
  t.push_back({"token_embd.weight", {dim, n_vocab}, TensorType::F16});
  t.push_back({"output_norm.weight", {dim}, TensorType::F32});
  if (!tied) t.push_back({"output.weight", {dim, n_vocab}, TensorType::F16});
  for (uint32_t l = 0; l < n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", {dim}, TensorType::F32});
    t.push_back({b + "attn_q.weight", {dim, dim}, TensorType::F16});
    t.push_back({b + "attn_k.weight", {dim, kv_dim}, TensorType::F16});
    t.push_back({b + "attn_v.weight", {dim, kv_dim}, TensorType::F16});
    t.push_back({b + "attn_output.weight", {dim, dim}, TensorType::F16});
    t.push_back({b + "ffn_norm.weight", {dim}, TensorType::F32});
    t.push_back({b + "ffn_gate.weight", {dim, ffn}, TensorType::F16});
    t.push_back({b + "ffn_down.weight", {ffn, dim}, TensorType::F16});
    t.push_back({b + "ffn_up.weight", {dim, ffn}, TensorType::F16});
  }
  return t;
}

ModelFacts llama_facts(uint32_t n_layers, uint32_t heads, uint32_t kv_heads) {
  return {"llama", n_layers, heads, kv_heads, 0};
}

std::map<std::string, TensorType> by_name(const std::vector<TensorDesc>& t, const std::vector<TypeChoice>& c) {
  std::map<std::string, TensorType> m;
  for (size_t i = 0; i < t.size(); ++i) m[t[i].name] = c[i].type;
  return m;
}

// Layers whose `suffix` tensor got `type`.
std::vector<int> layers_with(const std::map<std::string, TensorType>& m, const std::string& suffix, TensorType type) {
  std::vector<int> layers;
  for (const auto& [name, t] : m) {
    int layer = -1;
    if (t == type && name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        std::sscanf(name.c_str(), "blk.%d.", &layer) == 1)
      layers.push_back(layer);
  }
  std::sort(layers.begin(), layers.end());
  return layers;
}

// llama-quantize numbers attn_v/ffn_down by its own visiting order (layer number, then
// name), not by file order or string order ("blk.10" < "blk.2"): the same choices for any
// order of the tensor table.
TEST(QuantizeMix, LayerPositionsComeFromLayerNumbersNotFileOrder) {
  const auto tensors = llama_tensors(16, 256, 64, 256, false);
  const auto facts = llama_facts(16, 4, 1);
  const Preset& q4km = *find_preset("Q4_K_M");
  const auto want = by_name(tensors, choose_types(q4km, facts, tensors));
  // use_more_bits for 16 layers: i < 2, i >= 14, (i - 2) % 3 == 2.
  const std::vector<int> more_bits = {0, 1, 4, 7, 10, 13, 14, 15};
  EXPECT_EQ(layers_with(want, ".attn_v.weight", TensorType::Q6_K), more_bits);
  EXPECT_EQ(layers_with(want, ".ffn_down.weight", TensorType::Q6_K), more_bits);

  std::mt19937 rng(3);
  for (int round = 0; round < 5; ++round) {
    auto shuffled = tensors;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    EXPECT_EQ(by_name(shuffled, choose_types(q4km, facts, shuffled)), want) << "round " << round;
  }
}

TEST(QuantizeMix, MediumAndSmallMixesPromoteByPosition) {
  const auto tensors = llama_tensors(16, 256, 64, 256, false);
  const auto facts = llama_facts(16, 4, 1);
  auto types = [&](const char* preset) { return by_name(tensors, choose_types(*find_preset(preset), facts, tensors)); };
  const auto q3m = types("Q3_K_M");
  EXPECT_EQ(layers_with(q3m, ".attn_v.weight", TensorType::Q5_K), (std::vector<int>{0, 1}));
  EXPECT_EQ(layers_with(q3m, ".ffn_down.weight", TensorType::Q5_K), (std::vector<int>{0}));  // i < 16/16
  EXPECT_EQ(layers_with(q3m, ".ffn_down.weight", TensorType::Q4_K).size(), 15u);
  EXPECT_EQ(layers_with(q3m, ".attn_output.weight", TensorType::Q4_K).size(), 16u);
  const auto q4s = types("Q4_K_S");
  EXPECT_EQ(layers_with(q4s, ".attn_v.weight", TensorType::Q5_K), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(layers_with(q4s, ".ffn_down.weight", TensorType::Q5_K), (std::vector<int>{0, 1}));  // i < 16/8
  for (const char* p : {"Q4_K_M", "Q3_K_S", "Q5_K_S", "Q6_K"}) {
    EXPECT_EQ(types(p).at("output.weight"), TensorType::Q6_K) << p;
    EXPECT_EQ(types(p).at("token_embd.weight"), find_preset(p)->base_type) << p << ": untied embeddings";
  }
}

TEST(QuantizeMix, GroupedQueryAttentionDecidesQ2KValueMatrices) {
  const Preset& q2k = *find_preset("Q2_K");
  for (uint32_t kv_heads : {1u, 2u, 4u, 8u}) {
    const auto tensors = llama_tensors(4, 256, 256 / 8 * kv_heads, 256, false);
    const auto m = by_name(tensors, choose_types(q2k, llama_facts(4, 8, kv_heads), tensors));
    const TensorType want = 8 / kv_heads >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    EXPECT_EQ(layers_with(m, ".attn_v.weight", want).size(), 4u) << "kv heads " << kv_heads;
    EXPECT_EQ(layers_with(m, ".ffn_down.weight", TensorType::Q3_K).size(), 4u);
    EXPECT_EQ(layers_with(m, ".attn_output.weight", TensorType::Q3_K).size(), 4u);
    EXPECT_EQ(layers_with(m, ".attn_q.weight", TensorType::Q2_K).size(), 4u);
  }
}

// llama.cpp calls an 80-layer llama with grouped-query attention a 70B and gives its
// (8x smaller) value matrices Q5_K instead of Q3_K/Q4_K; an 80-layer llama without GQA
// (LLaMA-1 65B) keeps them.
TEST(QuantizeMix, SeventyBModelsGetQ5KValueMatrices) {
  const auto tensors = llama_tensors(80, 256, 256, 256, false);
  for (const char* preset : {"Q3_K_S", "Q3_K_M", "Q4_K_S", "Q2_K"}) {
    const Preset& p = *find_preset(preset);
    const auto gqa = by_name(tensors, choose_types(p, llama_facts(80, 8, 1), tensors));
    EXPECT_EQ(layers_with(gqa, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    const auto mha = by_name(tensors, choose_types(p, llama_facts(80, 8, 8), tensors));
    EXPECT_LT(layers_with(mha, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    // Qwen2 calls every 80-layer model 72B; other families have no such size.
    const auto qwen2 = by_name(tensors, choose_types(p, {"qwen2", 80, 8, 8, 0}, tensors));
    EXPECT_EQ(layers_with(qwen2, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
    const auto qwen3 = by_name(tensors, choose_types(p, {"qwen3", 80, 8, 1, 0}, tensors));
    EXPECT_LT(layers_with(qwen3, ".attn_v.weight", TensorType::Q5_K).size(), 80u) << preset;
  }
}

TEST(QuantizeMix, RowLengthFallbacks) {
  // Rows of 64: each K type has its smaller-block stand-in; rows of 100 fit none: F16.
  struct Case {
    const char* preset;
    uint64_t row;
    TensorType want;
  };
  const Case cases[] = {{"Q2_K", 64, TensorType::Q4_0},   {"Q3_K_S", 64, TensorType::Q4_0},
                        {"Q4_K_S", 64, TensorType::Q5_0}, {"Q5_K_S", 64, TensorType::Q5_1},
                        {"Q6_K", 64, TensorType::Q8_0},   {"Q4_K_M", 100, TensorType::F16},
                        {"Q4_K_M", 512, TensorType::Q4_K}};
  for (const Case& c : cases) {
    const std::vector<TensorDesc> t = {{"output.weight", {256, 512}, TensorType::F32},
                                       {"blk.0.attn_q.weight", {c.row, 256}, TensorType::F32}};
    const auto choices = choose_types(*find_preset(c.preset), llama_facts(1, 4, 4), t);
    EXPECT_EQ(choices[1].type, c.want) << c.preset << " row " << c.row;
    EXPECT_EQ(choices[1].fell_back, c.row != 512) << c.preset;
    if (c.row != 512) {
      EXPECT_NE(choices[1].note.find("rows of " + std::to_string(c.row)), std::string::npos);
    }
  }
  // The output projection picks Q8_0 itself when its rows are not whole 256-blocks.
  const std::vector<TensorDesc> t = {{"output.weight", {64, 512}, TensorType::F32}};
  EXPECT_EQ(choose_types(*find_preset("Q4_K_M"), llama_facts(1, 4, 4), t)[0].type, TensorType::Q8_0);
}

TEST(QuantizeMix, OnlyWeightMatricesAreQuantized) {
  const std::vector<TensorDesc> t = {
      {"output_norm.weight", {256}, TensorType::F32},
      {"blk.0.attn_q.weight", {256, 1}, TensorType::F32},       // 1-D once trailing 1s go
      {"blk.0.extra_norm.weight", {256, 256}, TensorType::F32},  // a norm, even if 2-D
      {"position_embd.weight", {256, 256}, TensorType::F32},
      {"blk.0.ffn_gate_inp.weight", {256, 8}, TensorType::F32},
      {"blk.0.attn_q.bias", {256, 256}, TensorType::F32},        // not a weight
      {"blk.0.attn_q.weight", {256, 256}, TensorType::BF16},
  };
  const auto c = choose_types(*find_preset("Q4_K_M"), llama_facts(1, 4, 4), t);
  for (size_t i = 0; i + 1 < t.size(); ++i) EXPECT_EQ(c[i].type, t[i].type) << t[i].name;
  EXPECT_EQ(c.back().type, TensorType::Q4_K);
}

TEST(QuantizeMix, RefusesWhatLlamaQuantizeRefuses) {
  const Preset& q4km = *find_preset("Q4_K_M");
  // Output rows of 72: Q8_0 by the output rule, and Q8_0 has no fallback in llama.cpp.
  const std::vector<TensorDesc> odd = {{"output.weight", {72, 512}, TensorType::F32}};
  try {
    choose_types(q4km, llama_facts(1, 4, 4), odd);
    ADD_FAILURE() << "rows of 72 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
  const auto tensors = llama_tensors(2, 256, 256, 256, false);
  EXPECT_THROW(choose_types(q4km, {"falcon", 2, 4, 4, 0}, tensors), Error);  // not a family kiln runs
  EXPECT_THROW(choose_types(q4km, {"llama", 2, 4, 4, 8}, tensors), Error);  // experts
  // The legacy presets keep kiln's own rule and never refuse.
  EXPECT_NO_THROW(choose_types(*find_preset("Q8_0"), {"gemma", 2, 4, 4, 8}, odd));
}

TEST(QuantizeMix, LegacyPresetsQuantizeEveryMatrixThatFits) {
  const auto tensors = llama_tensors(2, 64, 32, 172, false);
  const auto c = choose_types(*find_preset("Q4_0"), {}, tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    if (t.dims.size() == 1) {
      EXPECT_EQ(c[i].type, t.type) << t.name;
    } else if (t.dims[0] == 172) {  // ffn_down: rows of 172 are not whole 32-blocks
      EXPECT_EQ(c[i].type, t.type) << t.name;
      EXPECT_TRUE(c[i].fell_back) << t.name;
    } else {
      // The output projection (rows of 64: not whole Q6_K super-blocks) gets Q8_0, as
      // llama-quantize gives it.
      EXPECT_EQ(c[i].type, t.name == "output.weight" ? TensorType::Q8_0 : TensorType::Q4_0) << t.name;
    }
  }
}

// ---------------------------------------------------------------- against llama-quantize

// tests/data/quant/llama-quantize-*.tsv: per preset, each tensor's type and SHA-256 prefix.
struct Table {
  std::string input_sha256;
  std::vector<std::string> presets;
  std::map<std::string, uint32_t> file_type;  // by preset
  std::map<std::string, std::map<std::string, std::pair<std::string, std::string>>> cells;  // [preset][tensor]
};

Table read_table(const std::string& file) {
  std::istringstream in(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/" + file));
  Table t;
  std::string line;
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::string field;
    std::istringstream ss(s);
    while (std::getline(ss, field, '\t')) out.push_back(field);
    return out;
  };
  while (std::getline(in, line)) {
    if (line.rfind("# input sha256 ", 0) == 0) t.input_sha256 = line.substr(15);
    if (line.empty() || line[0] == '#') continue;
    const auto f = split(line);
    if (f[0] == "tensor") {
      t.presets.assign(f.begin() + 1, f.end());
      continue;
    }
    if (f.size() != t.presets.size() + 1) throw std::runtime_error(file + ": bad line " + line);
    for (size_t i = 0; i < t.presets.size(); ++i) {
      if (f[0] == "general.file_type") {
        t.file_type[t.presets[i]] = uint32_t(std::stoul(f[i + 1]));
      } else {
        const size_t colon = f[i + 1].find(':');
        t.cells[t.presets[i]][f[0]] = {f[i + 1].substr(0, colon), f[i + 1].substr(colon + 1)};
      }
    }
  }
  return t;
}

struct Input {
  std::string path;
  std::string sha256;
};

// The model llama-quantize was run on for llama-quantize-mix16.tsv (the table's
// description and README.md name these options): every K rule fires at 16 layers, rows of
// 256 take no fallback, GQA 4:1, tied embeddings so token_embd is the output projection.
const Input& mix16_model() {
  static const Input input = [] {
    gen::GenerateOptions o;
    o.shape = {"quant-mix-16", 256, 16, 4, 1, 256, 256, 10000.0f, 1e-5f};
    o.type = TensorType::F16;
    o.seed = 3;
    o.tie_output = true;
    auto vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
    const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
    Input in{temp_dir() + "/quant-mix-16.gguf", sha256_hex(bytes.data(), bytes.size())};
    write_file(in.path, std::string(bytes.begin(), bytes.end()));
    return in;
  }();
  return input;
}

const Input& stories260k_model() {
  static const Input input = [] {
    const std::string path = shared_path("models/stories260K.gguf");
    return Input{path, sha256_hex(read_file(path))};
  }();
  return input;
}

// Runs kiln quantize and checks the file against llama-quantize's column of the table.
void expect_like_llama_quantize(const Input& model, const Table& table, const std::string& preset) {
  ASSERT_TRUE(table.cells.count(preset)) << preset;
  const bool same_input = model.sha256 == table.input_sha256;
  EXPECT_TRUE(same_input) << "the input is not the model llama-quantize quantized for this table (sha256 "
                          << model.sha256 << " vs " << table.input_sha256
                          << "): if the generator changed, regenerate the table (tests/data/quant/README.md)";

  const std::string out = temp_dir() + "/" + preset + ".gguf";
  std::string name = preset;  // presets are case-insensitive: pass some in lower case
  if (preset.find('K') != std::string::npos && preset.size() > 4) std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  auto r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(model.path) + " " + shell_quote(out) + " " +
                       name + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "") << "--quiet prints nothing";
  EXPECT_EQ(r.out, "");

  auto file = gguf::File::open(out);
  EXPECT_EQ(file->get_uint("general.file_type"), table.file_type.at(preset));
  EXPECT_EQ(file->get_uint("general.quantization_version"), 2u);
  const auto& want = table.cells.at(preset);
  EXPECT_EQ(file->tensors().size(), want.size());
  size_t compared = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    auto it = want.find(t.name);
    if (it == want.end()) {
      ADD_FAILURE() << preset << ": unexpected tensor " << t.name;
      continue;
    }
    const auto& [type, sha] = it->second;
    EXPECT_EQ(type_name(t.type), type) << preset << " " << t.name;
    if (same_input && type_name(t.type) == type) {
      EXPECT_EQ(sha256_hex(t.data, t.n_bytes).substr(0, 16), sha) << preset << " " << t.name << " bytes";
      ++compared;
    }
  }
  if (same_input) {
    EXPECT_EQ(compared, want.size()) << preset;
  }
}

std::string preset_test_name(const testing::TestParamInfo<std::string>& info) { return info.param; }

class Mix16 : public testing::TestWithParam<std::string> {};
TEST_P(Mix16, SameTypesAndBytesAsLlamaQuantize) {
  static const Table table = read_table("llama-quantize-mix16.tsv");
  EXPECT_EQ(table.presets.size(), 14u);
  expect_like_llama_quantize(mix16_model(), table, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Presets, Mix16,
                         testing::Values("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
                                         "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"),
                         preset_test_name);

// stories260K's rows (64, 172) are not whole super-blocks: every fallback fires. (The
// legacy presets are not in the table: llama-quantize refuses rows of 172 for them.)
class Stories260K : public testing::TestWithParam<std::string> {};
TEST_P(Stories260K, SameTypesAndBytesAsLlamaQuantize) {
  static const Table table = read_table("llama-quantize-stories260K.tsv");
  EXPECT_EQ(table.presets.size(), 9u);
  expect_like_llama_quantize(stories260k_model(), table, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Presets, Stories260K,
                         testing::Values("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
                                         "Q5_K_M", "Q6_K"),
                         preset_test_name);

// One model per family kiln runs besides llama, for llama-quantize-<family>.tsv: the
// family's tiny shape (src/model/generate_model.cpp) widened to dim 256 and 16 layers so
// that every position rule fires, F16, seed 3, stories260K's vocabulary. Their heads cover
// GQA 8, 4, 2 and 1 (Q2_K's value rule), fused QKV (phi3, mpt), tied and untied outputs,
// head sizes other than dim / heads, and gemma2's FFN of 384 takes ffn_down's fallbacks.
struct Family {
  const char* arch;
  const char* tiny_shape;
  uint32_t n_heads, n_kv_heads, ffn_dim;
  bool tied;
};
constexpr Family kFamilies[] = {
    {"qwen2", "qwen2-tiny", 4, 1, 256, false},  {"qwen3", "qwen3-tiny", 8, 4, 256, true},
    {"gemma", "gemma-tiny", 8, 1, 256, true},   {"gemma2", "gemma2-tiny", 8, 2, 384, true},
    {"gemma3", "gemma3-tiny", 8, 4, 256, true}, {"phi3", "phi3-tiny", 4, 4, 256, false},
    {"mpt", "mpt-tiny", 4, 4, 256, true},
};

Input family_model(const Family& f) {
  gen::GenerateOptions o;
  o.shape = *gen::find_shape(f.tiny_shape);
  o.shape.name = std::string("quant-") + f.arch;
  o.shape.dim = 256;
  o.shape.n_layers = 16;
  o.shape.n_heads = f.n_heads;
  o.shape.n_kv_heads = f.n_kv_heads;
  o.shape.ffn_dim = f.ffn_dim;
  o.type = TensorType::F16;
  o.seed = 3;
  o.tie_output = f.tied;
  auto vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
  const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
  Input in{temp_dir() + "/quant-" + f.arch + ".gguf", sha256_hex(bytes.data(), bytes.size())};
  write_file(in.path, std::string(bytes.begin(), bytes.end()));
  return in;
}

class Families : public testing::TestWithParam<Family> {};
TEST_P(Families, SameTypesAndBytesAsLlamaQuantizeForEveryKPreset) {
  const Family& f = GetParam();
  const Table table = read_table(std::string("llama-quantize-") + f.arch + ".tsv");
  ASSERT_EQ(table.presets.size(), 9u);
  const Input model = family_model(f);
  for (const std::string& preset : table.presets) expect_like_llama_quantize(model, table, preset);
}
INSTANTIATE_TEST_SUITE_P(Presets, Families, testing::ValuesIn(kFamilies),
                         [](const testing::TestParamInfo<Family>& info) { return std::string(info.param.arch); });

// ---------------------------------------------------------------- command line

std::string quantize_cmd(const std::string& args) { return shell_quote(kiln_binary()) + " quantize " + args; }

TEST(QuantizeCli, OneLinePerTensorWhenStderrIsNotATerminal) {
  const std::string out = temp_dir() + "/lines.gguf";
  auto r = run_command(quantize_cmd(shell_quote(stories260k_model().path) + " " + shell_quote(out) + " Q4_K_M"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  size_t tensor_lines = 0;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) tensor_lines += line.rfind("[", 0) == 0;
  EXPECT_EQ(tensor_lines, 48u) << r.err;
  EXPECT_NE(r.err.find("[46/48] blk.4.ffn_down.weight (172 x 64): F32 -> F16 (rows of 172 are not whole Q6_K blocks)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("[48/48] blk.4.ffn_norm.weight (64): F32 (kept)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("32 of 48 tensors quantized to Q4_K_M (F32 x11, F16 x5, Q5_0 x29, Q8_0 x3)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no progress bar into a file";
}

// util-linux's script(1) gives the command a terminal, as a user's shell would.
TEST(QuantizeCli, ProgressBarWhenStderrIsATerminal) {
  const std::string out = temp_dir() + "/bar.gguf";
  const std::string cmd = quantize_cmd(shell_quote(stories260k_model().path) + " " + shell_quote(out) + " q6_k");
  auto r = run_command("script -qec " + shell_quote(cmd) + " /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[##############################] 100% 48/48 blk.4.ffn_norm.weight -> F32"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("[1/48]"), std::string::npos) << "no per-tensor lines under a bar: " << r.out;
  EXPECT_NE(r.out.find("kiln: wrote"), std::string::npos) << r.out;
  auto quiet = run_command("script -qec " + shell_quote(cmd + " --quiet") + " /dev/null");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.out;
  EXPECT_EQ(trim(quiet.out), "") << "--quiet draws no bar either";
}

TEST(QuantizeCli, ThreadCountDoesNotChangeTheBytes) {
  const std::string one = temp_dir() + "/t1.gguf", two = temp_dir() + "/t3.gguf";  // Q3_K_M: four K types
  const std::string in = shell_quote(mix16_model().path);
  ASSERT_EQ(run_command(quantize_cmd(in + " " + shell_quote(one) + " Q3_K_M -q -t 1")).exit_code, 0);
  ASSERT_EQ(run_command(quantize_cmd(in + " " + shell_quote(two) + " Q3_K_M -q -t 3")).exit_code, 0);
  EXPECT_TRUE(read_file(one) == read_file(two)) << "-t 1 and -t 3 wrote different files";
}

TEST(QuantizeCli, ErrorsNameTheProblem) {
  const std::string in = shell_quote(stories260k_model().path);
  auto bad = run_command(quantize_cmd(in + " " + shell_quote(temp_dir() + "/x.gguf") + " Q4_K_X"));
  expect_one_line_error(bad, 2, "cannot quantize to 'Q4_K_X' (supported: Q8_0, Q4_0");

  // A K mix needs the llama architecture; the quantization fixture says "fixture".
  const std::string fixture = std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-quant-fixture.gguf";
  auto arch = run_command(quantize_cmd(shell_quote(fixture) + " " + shell_quote(temp_dir() + "/f.gguf") + " Q4_K_M"));
  expect_one_line_error(arch, 1, "ggml-quant-fixture.gguf: the Q4_K_M mix follows llama-quantize's rules");
  EXPECT_NE(arch.err.find("'fixture'"), std::string::npos) << arch.err;

  auto same = run_command(quantize_cmd(in + " " + in + " Q4_K_M"));
  expect_one_line_error(same, 1, "is the input file");

  // Requantizing is refused, as by llama-quantize.
  const std::string q8 = temp_dir() + "/q8.gguf";
  ASSERT_EQ(run_command(quantize_cmd(in + " " + shell_quote(q8) + " Q8_0 -q")).exit_code, 0);
  auto again = run_command(quantize_cmd(shell_quote(q8) + " " + shell_quote(temp_dir() + "/q8k.gguf") + " Q4_K_M"));
  expect_one_line_error(again, 1, "quantize from an F32, F16 or BF16 model");
  EXPECT_NE(again.err.find("q8.gguf: tensor '"), std::string::npos) << again.err;
}

}  // namespace
}  // namespace kiln::quantize
