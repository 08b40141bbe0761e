// The i-quant and ternary presets of kiln quantize against llama-quantize, on the
// generated 16-layer models of tests/quant_llama_tables_test.cpp (tables
// tests/data/quant/llama-quantize-iq-<model>.tsv, README.md there):
//  * IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 through the real binary: every tensor's type and bytes;
//  * every i-quant preset, with and without an importance matrix where llama-quantize has
//    both: the type choose_types gives each tensor (kiln cannot write the codebook
//    i-quants' bytes yet, nor take an imatrix);
//  * the refusal of a preset that needs an importance matrix.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "quantize/mix.h"
#include "sha256.h"
#include "test_util.h"

namespace kiln::quantize {
namespace {

using namespace kiln::test;

// A table column: a preset, made with or without an importance matrix ("IQ4_XS+imatrix").
struct Column {
  std::string preset;
  bool imatrix;
};
struct Table {
  std::string input_sha256;
  std::vector<Column> columns;
  std::vector<uint32_t> file_type;                                      // by column
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> cells;  // tensor -> (type, sha) by column
};

Table read_table(const std::string& model) {
  const std::string file = "llama-quantize-iq-" + model + ".tsv";
  std::istringstream in(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/" + file));
  Table t;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# input sha256 ", 0) == 0) t.input_sha256 = line.substr(15);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::string field;
    std::istringstream ss(line);
    while (std::getline(ss, field, '\t')) f.push_back(field);
    if (f[0] == "tensor") {
      for (size_t i = 1; i < f.size(); ++i) {
        const size_t plus = f[i].find("+imatrix");
        t.columns.push_back({f[i].substr(0, plus), plus != std::string::npos});
      }
      continue;
    }
    if (f.size() != t.columns.size() + 1) throw std::runtime_error(file + ": bad line " + line);
    for (size_t i = 1; i < f.size(); ++i) {
      if (f[0] == "general.file_type") {
        t.file_type.push_back(uint32_t(std::stoul(f[i])));
      } else {
        const size_t colon = f[i].find(':');
        t.cells[f[0]].push_back({f[i].substr(0, colon), f[i].substr(colon + 1)});
      }
    }
  }
  return t;
}

// The models of quant_llama_tables_test.cpp (same build_model options: its tables and
// these were made from the same files).
struct Model {
  const char* name;
  const char* tiny_shape;  // nullptr: the llama mix16 model
  uint32_t n_heads, n_kv_heads, ffn_dim;
  bool tied;
  uint32_t n_experts;
};
constexpr Model kModels[] = {
    {"mix16", nullptr, 4, 1, 256, true, 0},          {"qwen2", "qwen2-tiny", 4, 1, 256, false, 0},
    {"qwen3", "qwen3-tiny", 8, 4, 256, true, 0},     {"gemma", "gemma-tiny", 8, 1, 256, true, 0},
    {"gemma2", "gemma2-tiny", 8, 2, 384, true, 0},   {"phi3", "phi3-tiny", 4, 4, 256, false, 0},
    {"qwen3moe", "qwen3moe-tiny", 8, 4, 256, true, 4}, {"mixtral", "mixtral-tiny", 4, 1, 256, false, 8},
};

struct Input {
  std::string path, sha256;
};

Input write_model(const Model& m) {
  gen::GenerateOptions o;
  if (m.tiny_shape) {
    o.shape = *gen::find_shape(m.tiny_shape);
    o.shape.name = std::string("quant-") + m.name;
    o.shape.dim = 256;
    o.shape.n_layers = 16;
    o.shape.n_heads = m.n_heads;
    o.shape.n_kv_heads = m.n_kv_heads;
    o.shape.ffn_dim = m.ffn_dim;
  } else {
    o.shape = {"quant-mix-16", 256, 16, 4, 1, 256, 256, 10000.0f, 1e-5f};
  }
  if (m.n_experts) {
    o.shape.n_experts = m.n_experts;
    o.shape.n_experts_used = 2;
    o.shape.expert_ffn_dim = m.ffn_dim;
  }
  o.type = TensorType::F16;
  o.seed = 3;
  o.tie_output = m.tied;
  auto vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
  const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
  Input in{temp_dir() + "/iq-" + m.name + ".gguf", sha256_hex(bytes.data(), bytes.size())};
  write_file(in.path, std::string(bytes.begin(), bytes.end()));
  return in;
}

// What choose_types needs, from the file as kiln quantize reads it.
ModelFacts facts_of(const gguf::File& f) {
  ModelFacts m;
  m.arch = f.get_string("general.architecture", "");
  const std::string p = m.arch + ".";
  m.n_layers = uint32_t(f.get_uint(p + "block_count"));
  m.n_heads = uint32_t(f.get_uint(p + "attention.head_count"));
  m.n_kv_heads = uint32_t(f.get_uint(p + "attention.head_count_kv", m.n_heads));
  m.n_experts = uint32_t(f.get_uint(p + "expert_count", 0));
  return m;
}

// The presets kiln can write byte for byte today (no importance matrix).
bool kiln_writes(const Column& c) {
  return !c.imatrix && (c.preset == "IQ4_NL" || c.preset == "IQ4_XS" || c.preset == "TQ1_0" || c.preset == "TQ2_0");
}

class IqPresets : public testing::TestWithParam<Model> {};

TEST_P(IqPresets, SameTypesAsLlamaQuantize) {
  const Model& m = GetParam();
  const Table table = read_table(m.name);
  ASSERT_GE(table.columns.size(), 6u);  // phi3's has no +imatrix columns (README.md)
  const Input in = write_model(m);
  EXPECT_EQ(in.sha256, table.input_sha256) << "the generator changed: regenerate the table (tests/data/quant/README.md)";
  auto file = gguf::File::open(in.path);
  std::vector<TensorDesc> descs;
  for (const gguf::TensorInfo& t : file->tensors()) descs.push_back({t.name, t.dims, t.type});
  for (size_t c = 0; c < table.columns.size(); ++c) {
    const Column& col = table.columns[c];
    const std::string label = col.preset + (col.imatrix ? "+imatrix" : "");
    const Preset* preset = find_preset(col.preset);
    ASSERT_NE(preset, nullptr) << col.preset;
    EXPECT_EQ(uint32_t(preset->file_type), table.file_type[c]) << label;
    const std::vector<TypeChoice> types = choose_types(*preset, facts_of(*file), descs, col.imatrix);
    ASSERT_EQ(types.size(), descs.size());
    ASSERT_EQ(table.cells.size(), descs.size()) << label;
    for (size_t i = 0; i < descs.size(); ++i) {
      auto it = table.cells.find(descs[i].name);
      ASSERT_NE(it, table.cells.end()) << descs[i].name;
      EXPECT_EQ(type_name(types[i].type), it->second[c].first) << label << " " << descs[i].name;
    }
  }
}

// The real binary on the presets whose quantizers kiln has: same types and bytes.
TEST_P(IqPresets, SameBytesAsLlamaQuantize) {
  const Model& m = GetParam();
  const Table table = read_table(m.name);
  const Input in = write_model(m);
  ASSERT_EQ(in.sha256, table.input_sha256);
  size_t presets = 0;
  for (size_t c = 0; c < table.columns.size(); ++c) {
    const Column& col = table.columns[c];
    if (!kiln_writes(col)) continue;
    ++presets;
    const std::string out = temp_dir() + "/" + m.name + "-" + col.preset + ".gguf";
    auto r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(in.path) + " " + shell_quote(out) + " " +
                         col.preset + " --quiet");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto file = gguf::File::open(out);
    EXPECT_EQ(file->get_uint("general.file_type"), table.file_type[c]) << col.preset;
    EXPECT_EQ(file->tensors().size(), table.cells.size());
    for (const gguf::TensorInfo& t : file->tensors()) {
      auto it = table.cells.find(t.name);
      ASSERT_NE(it, table.cells.end()) << t.name;
      const auto& [type, sha] = it->second[c];
      EXPECT_EQ(type_name(t.type), type) << col.preset << " " << t.name;
      EXPECT_EQ(sha256_hex(t.data, t.n_bytes).substr(0, 16), sha) << col.preset << " " << t.name << " bytes";
    }
  }
  EXPECT_EQ(presets, 4u);
}

INSTANTIATE_TEST_SUITE_P(Models, IqPresets, testing::ValuesIn(kModels),
                         [](const testing::TestParamInfo<Model>& info) { return std::string(info.param.name); });

// Not in the tables (no 80-layer model there): a 70B llama's value matrices (8 query heads
// per KV head) go from Q4_K to Q5_K in the IQ3 presets, as in the K mixes, but the 1-2 bit
// presets have their own value rule without that step.
TEST(IqPresetsRules, SeventyBValueMatrices) {
  ModelFacts facts{"llama", 80, 64, 8, 0};
  std::vector<TensorDesc> descs = {{"token_embd.weight", {256, 512}, TensorType::F16},
                                   {"output.weight", {256, 512}, TensorType::F16}};
  for (int l = 0; l < 80; ++l) descs.push_back({"blk." + std::to_string(l) + ".attn_v.weight", {256, 32}, TensorType::F16});
  const std::pair<const char*, TensorType> want[] = {{"IQ3_XS", TensorType::Q5_K}, {"IQ3_S", TensorType::Q5_K},
                                                     {"IQ3_M", TensorType::Q5_K}, {"IQ3_XXS", TensorType::Q5_K},
                                                     {"IQ4_XS", TensorType::Q5_K}, {"IQ2_XXS", TensorType::Q4_K},
                                                     {"TQ1_0", TensorType::TQ1_0}};
  for (const auto& [name, type] : want) {
    const std::vector<TypeChoice> got = choose_types(*find_preset(name), facts, descs, true);
    for (size_t i = 2; i < descs.size(); ++i) EXPECT_EQ(type_name(got[i].type), type_name(type)) << name << " " << i;
    facts.arch = "qwen3";  // no 70B size: the plain GQA rule
    const std::vector<TypeChoice> plain = choose_types(*find_preset(name), facts, descs, true);
    facts.arch = "llama";
    const TensorType no_70b = type == TensorType::Q5_K && std::string(name) != "IQ4_XS" ? TensorType::Q4_K : type;
    EXPECT_EQ(type_name(plain[2].type), type_name(no_70b)) << name;
  }
}

// llama-quantize stops rather than write IQ2_XXS (and the other 1-2 bit types, and
// IQ3_XXS) without an importance matrix; kiln names the first tensor that would need one.
TEST(IqPresetsCli, RefusesLowBitPresetsWithoutAnImportanceMatrix) {
  const Input in = write_model(kModels[0]);
  for (const char* preset : {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS"}) {
    const std::string out = temp_dir() + "/refused.gguf";
    auto r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(in.path) + " " + shell_quote(out) + " " +
                         preset + " --quiet");
    expect_one_line_error(r, 1, "this quantization requires an importance matrix: tensor 'blk.0.");
    EXPECT_FALSE(std::filesystem::exists(out)) << preset;
  }
}

// llama-quantize's type overrides: an unknown or unwritable type is a usage error naming the
// flag; a forced type that needs an importance matrix there is none of names the tensor
// (llama-quantize lets that through to an assertion in ggml). (Their effect on the bytes is checked against
// llama-quantize's files in tests/iquant_perplexity_test.cpp.)
TEST(IqPresetsCli, TypeOverridesAreChecked) {
  const Input in = write_model(kModels[0]);
  const std::string out = temp_dir() + "/override.gguf";
  const std::string base = shell_quote(kiln_binary()) + " quantize " + shell_quote(in.path) + " " + shell_quote(out) + " ";
  expect_one_line_error(run_command(base + "IQ4_XS --output-tensor-type q9_k --quiet"), 2,
                        "--output-tensor-type: unknown or unwritable type 'q9_k'");
  expect_one_line_error(run_command(base + "IQ4_XS --token-embedding-type q8_k --quiet"), 2,
                        "--token-embedding-type: unknown or unwritable type 'q8_k'");
  expect_one_line_error(run_command(base + "IQ4_XS --pure --token-embedding-type iq2_xxs --quiet"), 1,
                        "tensor 'token_embd.weight' would be IQ2_XXS, which cannot be written without an importance matrix");
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace kiln::quantize
