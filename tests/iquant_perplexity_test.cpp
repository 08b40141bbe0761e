// kiln perplexity on i-quant and ternary models against llama-perplexity's figures
// (tests/data/quant/iquant-perplexity.txt; README there says how they were made):
// iquant-tiny (the kiln-gen shape, every row whole 256-value super-blocks) in F32, and
// llama-quantize's i-quant presets of it with an importance matrix made by llama-imatrix
// (tests/data/quant/iquant-tiny.imatrix.gguf). The quantized lines need `kiln quantize` to
// write the tensors llama-quantize wrote (same tensor digest), so both engines score the
// same weights; until kiln has the i-quant quantizers those lines are skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "perplexity_reference.h"
#include "sha256.h"
#include "test_util.h"

namespace kiln::test {
namespace {

const std::string kData = std::string(KILN_SOURCE_DIR) + "/tests/data/quant/";

// `kiln-gen --shape iquant-tiny --type f32 --vocab-from stories260K.gguf --seed 7
// --weight-std 0.1 --norm-jitter 0.3`, written once per test program.
const std::string& f32_model() {
  static const std::string path = [] {
    gen::GenerateOptions o;
    o.shape = *gen::find_shape("iquant-tiny");
    o.type = TensorType::F32;
    o.seed = 7;
    o.weight_std = 0.1;
    o.norm_jitter = 0.3;
    const std::vector<uint8_t> bytes =
        gen::build_model(o, *gguf::File::open(shared_path("models/stories260K.gguf"))).to_bytes();
    const std::string p = temp_dir() + "/iquant-tiny.gguf";
    write_file(p, std::string(bytes.begin(), bytes.end()));
    return p;
  }();
  return path;
}

// A line of iquant-perplexity.txt: "file preset tensor-digest PPL +/-". Preset F32 is the
// kiln-gen file; "T" is `llama-quantize --imatrix IMATRIX F32 OUT T`, "T+pure" the same
// with `--pure --output-tensor-type T` (and `--token-embedding-type T` where ggml can
// quantize token_embd, which has no importance weights, to T).
struct Line {
  std::string file, preset, digest;
  double ppl = 0, err = 0;
};

std::vector<Line> lines() {
  std::vector<Line> out;
  std::istringstream in(read_file(kData + "iquant-perplexity.txt"));
  for (std::string text; std::getline(in, text);) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream ls(text);
    Line l;
    ls >> l.file >> l.preset >> l.digest >> l.ppl >> l.err;
    if (!ls) throw std::runtime_error("iquant-perplexity.txt: bad line " + text);
    out.push_back(l);
  }
  return out;
}

double kiln_perplexity(const std::string& model, double* err) {
  const auto r = run_command(shell_quote(kiln_binary()) + " perplexity " + shell_quote(model) + " -f " +
                             shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt") + " -c 64 -t 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  double ppl = 0;
  EXPECT_EQ(std::sscanf(trim(r.out).c_str(), "PPL = %lf +/- %lf", &ppl, err), 2) << r.out;
  return ppl;
}

TEST(IquantPerplexity, GeneratedModelIsTheOneLlamaCppScored) {
  std::istringstream want(read_file(kData + "iquant-tiny.gguf.sha256"));
  std::string sha;
  want >> sha;
  const std::string bytes = read_file(f32_model());
  EXPECT_EQ(sha256_hex(bytes.data(), bytes.size()), sha) << "the generator changed: regenerate the references";
}

class IquantPerplexity : public testing::TestWithParam<Line> {};

TEST_P(IquantPerplexity, MatchesLlamaPerplexity) {
  const Line& l = GetParam();
  ASSERT_EQ(l.file, "iquant-tiny");
  std::string model = f32_model();
  if (l.preset != "F32") {
    const size_t plus = l.preset.find('+');
    const std::string type = l.preset.substr(0, plus);
    std::string flags = " --imatrix " + shell_quote(kData + "iquant-tiny.imatrix.gguf");
    if (plus != std::string::npos) flags += " --pure --output-tensor-type " + type;
    model = temp_dir() + "/iquant-tiny-" + l.preset + ".gguf";
    const auto q = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32_model()) + " " +
                               shell_quote(model) + " " + type + flags + " --quiet");
    if (q.exit_code != 0)
      GTEST_SKIP() << "kiln quantize cannot write " << l.preset << " yet (the i-quant quantizers are missing): "
                   << trim(q.err);
  }
  EXPECT_EQ(tensor_digest(model), l.digest) << "not the tensors llama.cpp scored";
  double err = 0;
  const double ppl = kiln_perplexity(model, &err);
  std::printf("[ iquant-tiny %s ] kiln %.4f vs llama-perplexity %.4f\n", l.preset.c_str(), ppl, l.ppl);
  const double bound = l.preset == "F32" ? 5e-4 : 1e-3;
  EXPECT_NEAR(ppl, l.ppl, l.ppl * bound);
  EXPECT_NEAR(err, l.err, l.err * 5 * bound);
}

INSTANTIATE_TEST_SUITE_P(Presets, IquantPerplexity, testing::ValuesIn(lines()),
                         [](const testing::TestParamInfo<Line>& info) {
                           std::string n = info.param.preset;
                           for (char& c : n) c = c == '+' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace kiln::test
