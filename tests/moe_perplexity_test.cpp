// Mixture-of-experts files scored by `kiln perplexity` against llama-perplexity: the
// qwen3moe, Mixtral and gpt-oss reference files of tests/families_test.cpp, in F32 and quantized
// by `kiln quantize` (whose tensors must be llama-quantize's, byte for byte: the reference
// line carries a digest of them; MXFP4_MOE included), on story.txt with 64-token chunks.
// tests/data/families/README.md says how moe.llama-perplexity.txt was made.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/tokenizer.h"
#include "model_gen/generate_model.h"
#include "sha256.h"
#include "perplexity_reference.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

struct Line {
  std::string file, preset, digest;
  double ppl = 0, err = 0;
};

std::vector<Line> read_references() {
  std::istringstream in(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/families/moe.llama-perplexity.txt"));
  std::vector<Line> out;
  for (std::string text; std::getline(in, text);) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream ls(text);
    Line l;
    ls >> l.file >> l.preset >> l.digest >> l.ppl >> l.err;
    if (!ls) throw std::runtime_error("moe.llama-perplexity.txt: bad line " + text);
    out.push_back(l);
  }
  return out;
}

// The file tests/data/families/README.md's kiln-gen lines write for the shape of that name;
// "SHAPE:N" is that shape with experts N wide (kiln-gen --expert-ffn N: qwen3moe-tiny's 48
// are not whole 32-value blocks, which MXFP4_MOE needs). f16: the same command with --type
// f16 (kiln-gen's F16 file, not a conversion by quantize).
std::string reference_file(const std::string& file, bool f16 = false) {
  static std::map<std::string, std::string> written;
  const std::string key = file + (f16 ? "-f16" : "");
  auto it = written.find(key);
  if (it != written.end()) return it->second;
  const size_t colon = file.find(':');
  const std::string shape = file.substr(0, colon);
  kiln::gen::GenerateOptions o = kiln::gen::peaky_options(shape, 7, shape == "qwen3moe-tiny");
  if (f16) o.type = kiln::TensorType::F16;
  if (colon != std::string::npos) {
    o.shape.expert_ffn_dim = uint32_t(std::stoul(file.substr(colon + 1)));
    if (o.shape.arch == "llama") o.shape.ffn_dim = o.shape.expert_ffn_dim;  // as kiln-gen --expert-ffn
  }
  const auto from_json = [&](const std::string& rel) {
    return kiln::gen::build_model(o, kiln::Tokenizer::from_file(shared_path(rel))->vocab()).to_bytes();
  };
  const std::vector<uint8_t> bytes =
      shape == "qwen3moe-tiny"   ? from_json("tokenizers/qwen3-hf/tokenizer.json")
      : shape == "gpt-oss-tiny" ? from_json("tokenizers/llama3-hf/tokenizer.json")
          : kiln::gen::build_model(o, *kiln::gguf::File::open(shared_path("vocab/ggml-vocab-llama-spm.gguf"))).to_bytes();
  std::string name = key;
  std::replace(name.begin(), name.end(), ':', '-');
  const std::string path = temp_dir() + "/" + name + ".gguf";
  write_file(path, std::string(bytes.begin(), bytes.end()));
  return written[key] = path;
}

// F32 runs agree to float noise (seen: 1e-6). Quantized ones move further: these are
// random peaky models in which two experts' router scores can nearly tie, and a
// difference in the last bits of an activation's Q8 quantization then flips the choice
// for one token; llama.cpp itself moves chunk 2 of mixtral-tiny Q8_0 by 0.3% between
// -ub 16 and -ub 64. Seen: Q4_0 0.004-0.008%, Q4_K_M 0.04-0.45%, Q8_0 0.09-0.56%,
// MXFP4_MOE 0.02-0.08% (qwen3moe-tiny:64 F32 5e-7); F16 weights 0.26% (llama.cpp rounds the
// activations to fp16 for them, kiln does not). A wrong expert
// kernel or routing rule moves these files by far more (the F32 numbers show how closely
// the rest agrees).
double tolerance(const std::string& preset) { return preset == "F32" ? 5e-4 : 1e-2; }

TEST(MoePerplexity, MatchesLlamaPerplexityInF32AndQuantized) {
  const std::vector<Line> refs = read_references();
  ASSERT_EQ(refs.size(), 14u);
  const std::string story = std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt";
  for (const Line& ref : refs) {
    SCOPED_TRACE(ref.file + " " + ref.preset);
    std::string model = reference_file(ref.file, ref.preset == "F16");
    if (ref.preset != "F32" && ref.preset != "F16") {
      const std::string quantized = model.substr(0, model.size() - 5) + "-" + ref.preset + ".gguf";
      auto q = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(model) + " " + shell_quote(quantized) +
                           " " + ref.preset + " --quiet");
      ASSERT_EQ(q.exit_code, 0) << q.err;
      model = quantized;
    }
    EXPECT_EQ(tensor_digest(model), ref.digest) << "not the tensors llama.cpp scored";
    // MXFP4 experts have an integer kernel per table: each SIMD table this machine runs
    // scores them (the default one for the other files). The others are scored twice:
    // experts read from the file's layout, and repacked (--repack-experts: the packed
    // kernels, which the dense matrices use).
    std::vector<std::string> runs = {""};
    if (ref.preset == "MXFP4_MOE") {
      for (kiln::kernels::Isa isa : kiln::kernels::available_isas())
        if (isa != kiln::kernels::Isa::scalar) runs.push_back(std::string("KILN_ISA=") + kiln::kernels::isa_name(isa) + " ");
    } else {
      runs.push_back("--repack-experts");
    }
    for (const std::string& run : runs) {
      SCOPED_TRACE(run);
      const bool flag = run.starts_with("--");
      auto r = run_command((flag ? "" : run) + shell_quote(kiln_binary()) + " perplexity " + shell_quote(model) + " -f " +
                           shell_quote(story) + " -c 64 -t 2" + (flag ? " " + run : ""));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      double ppl = 0, err = 0;
      ASSERT_EQ(std::sscanf(trim(r.out).c_str(), "PPL = %lf +/- %lf", &ppl, &err), 2) << r.out;
      EXPECT_NEAR(ppl, ref.ppl, ref.ppl * tolerance(ref.preset));
      EXPECT_NEAR(err, ref.err, ref.err * 5 * tolerance(ref.preset));
    }
  }
}

// --repack-experts really moves the experts: every expert matrix of a type the kernels
// pack is marked packed (without the flag they stay in the file's layout); the perplexity
// test above scores the numbers they give.
TEST(MoePerplexity, RepackExpertsPacksEveryExpert) {
  const std::string f32 = reference_file("mixtral-tiny", false);
  const std::string q8 = f32.substr(0, f32.size() - 5) + "-repack-Q8_0.gguf";
  auto q = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32) + " " + shell_quote(q8) + " Q8_0 --quiet");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  kiln::LoadParams mapped, repacked;
  repacked.repack_experts = true;
  const auto a = kiln::Model::load(q8, mapped), b = kiln::Model::load(q8, repacked);
  size_t n_experts = 0;
  for (size_t l = 0; l < b->layers.size(); ++l)
    for (auto member : {&kiln::LayerWeights::gate_exps, &kiln::LayerWeights::up_exps, &kiln::LayerWeights::down_exps})
      for (size_t e = 0; e < (b->layers[l].*member).size(); ++e) {
        const kiln::WeightView &w = (b->layers[l].*member)[e], &v = (a->layers[l].*member)[e];
        if (kiln::kernels::ops().packed_bytes(w.type, w.rows, w.cols) == 0) continue;
        EXPECT_TRUE(w.packed) << "layer " << l << " expert " << e;
        EXPECT_FALSE(v.packed) << "layer " << l << " expert " << e;
        ++n_experts;
      }
  if (n_experts == 0) GTEST_SKIP() << "the kernels of this machine pack no Q8_0 matrix";
}

}  // namespace
