// kiln quantize, the real binary, against llama-quantize: a generated 16-layer model of
// each family kiln runs and stories260K, every preset, compared with tables of what
// llama-quantize wrote for the same inputs (each tensor's type and the SHA-256 of its
// bytes, tests/data/quant/README.md); and its command-line behaviour (names, progress
// output, errors, threads).
#include <gtest/gtest.h>

#include <algorithm>
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

const std::vector<std::string> kKPresets = {"Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
                                            "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"};
std::vector<std::string> k_and_legacy_presets() {
  std::vector<std::string> all = kKPresets;
  for (const char* legacy : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}) all.push_back(legacy);
  return all;
}

class Mix16 : public testing::TestWithParam<std::string> {};
TEST_P(Mix16, SameTypesAndBytesAsLlamaQuantize) {
  static const Table table = read_table("llama-quantize-mix16.tsv");
  EXPECT_EQ(table.presets.size(), 14u);
  expect_like_llama_quantize(mix16_model(), table, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Presets, Mix16, testing::ValuesIn(k_and_legacy_presets()), preset_test_name);

// stories260K's rows (64, 172) are not whole super-blocks: every fallback fires. (The
// legacy presets are not in the table: llama-quantize refuses rows of 172 for them.)
class Stories260K : public testing::TestWithParam<std::string> {};
TEST_P(Stories260K, SameTypesAndBytesAsLlamaQuantize) {
  static const Table table = read_table("llama-quantize-stories260K.tsv");
  EXPECT_EQ(table.presets.size(), 9u);
  expect_like_llama_quantize(stories260k_model(), table, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Presets, Stories260K, testing::ValuesIn(kKPresets), preset_test_name);

// One model per family kiln runs besides llama, for llama-quantize-<family>.tsv: the
// family's tiny shape (tools/model_gen/generate_model.cpp) widened to dim 256 and 16 layers so
// that every position rule fires, F16, seed 3, stories260K's vocabulary. Their heads cover
// GQA 8, 4, 2 and 1 (Q2_K's value rule), fused QKV (phi3, mpt), tied and untied outputs,
// head sizes other than dim / heads, and gemma2's FFN of 384 takes ffn_down's fallbacks.
// The two mixtures of experts (expert width = ffn_dim) cover ffn_down positions taken
// from the tensor name (qwen3moe, 4 experts) and the rules for exactly 8 experts (Mixtral),
// which reach the legacy presets too, so their tables have all fourteen, plus MXFP4_MOE
// (experts MXFP4, every other matrix Q8_0).
struct Family {
  const char* name;
  const char* tiny_shape;
  uint32_t n_heads, n_kv_heads, ffn_dim;  // 0: the tiny shape's (mamba2 has no attention or FFN)
  bool tied;
  uint32_t n_experts = 0;
  bool every_preset = false;  // the tables of the recurrent families and gpt-oss have all fifteen
};
constexpr Family kFamilies[] = {
    {"qwen2", "qwen2-tiny", 4, 1, 256, false},  {"qwen3", "qwen3-tiny", 8, 4, 256, true},
    {"gemma", "gemma-tiny", 8, 1, 256, true},   {"gemma2", "gemma2-tiny", 8, 2, 384, true},
    {"gemma3", "gemma3-tiny", 8, 4, 256, true}, {"phi3", "phi3-tiny", 4, 4, 256, false},
    {"mpt", "mpt-tiny", 4, 4, 256, true},       {"qwen3moe", "qwen3moe-tiny", 8, 4, 256, true, 4},
    {"mixtral", "mixtral-tiny", 4, 1, 256, false, 8},
    {"gpt-oss", "gpt-oss-tiny", 8, 2, 256, false, 4, true},
    {"mamba2", "mamba2-tiny", 0, 0, 0, true, 0, true},
    {"granitehybrid", "granitehybrid-tiny", 8, 2, 256, false, 4, true},
};

Input family_model(const Family& f) {
  gen::GenerateOptions o;
  o.shape = *gen::find_shape(f.tiny_shape);
  o.shape.name = std::string("quant-") + f.name;
  o.shape.dim = 256;
  o.shape.n_layers = 16;
  if (f.n_heads) {
    o.shape.n_heads = f.n_heads;
    o.shape.n_kv_heads = f.n_kv_heads;
    o.shape.ffn_dim = f.ffn_dim;
  }
  // Attention on four of the sixteen layers, so the value projections' positions (counted
  // over the attention layers) differ from their layer numbers.
  if (std::string(f.name) == "granitehybrid") o.shape.attn_layers = {1, 4, 9, 14}, o.shape.shared_expert_ffn_dim = 512;
  if (f.n_experts) {
    o.shape.n_experts = f.n_experts;
    o.shape.n_experts_used = 2;
    o.shape.expert_ffn_dim = f.ffn_dim;
  }
  o.type = TensorType::F16;
  o.seed = 3;
  o.tie_output = f.tied;
  auto vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
  const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
  Input in{temp_dir() + "/quant-" + f.name + ".gguf", sha256_hex(bytes.data(), bytes.size())};
  write_file(in.path, std::string(bytes.begin(), bytes.end()));
  return in;
}

class Families : public testing::TestWithParam<Family> {};
TEST_P(Families, SameTypesAndBytesAsLlamaQuantizeForEveryPreset) {
  const Family& f = GetParam();
  const Table table = read_table(std::string("llama-quantize-") + f.name + ".tsv");
  std::vector<std::string> presets = kKPresets;
  if (f.n_experts || f.every_preset) {
    presets = k_and_legacy_presets();
    presets.push_back("MXFP4_MOE");
  }
  ASSERT_EQ(table.presets, presets);
  const Input model = family_model(f);
  for (const std::string& preset : table.presets) expect_like_llama_quantize(model, table, preset);
}
INSTANTIATE_TEST_SUITE_P(Presets, Families, testing::ValuesIn(kFamilies),
                         [](const testing::TestParamInfo<Family>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');  // gtest names: letters, digits, _
                           return name;
                         });

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
