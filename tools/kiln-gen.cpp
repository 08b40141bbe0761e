// kiln-gen: writes a GGUF of any family kiln runs (the shape says which) with seeded random
// weights of a real model's shape, for benchmarks of models we cannot ship and for reference
// files other engines run. The work is in src/model/generate_model.cpp.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "model_gen/generate_model.h"

namespace {

bool is_gguf(const std::string& path) {
  char magic[4] = {};
  std::ifstream(path, std::ios::binary).read(magic, 4);
  return std::string(magic, 4) == "GGUF";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a GGUF (llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, phi3, mpt, gpt-oss, mamba2, granitehybrid or bert) with random weights of a real model's shape"};
  std::string shape_name, type_name = "f16", vocab_path, out_path;
  uint64_t seed = 1;
  uint32_t layers = 0;
  kiln::gen::GenerateOptions o;
  std::string shapes;
  for (const auto& n : kiln::gen::shape_names()) shapes += (shapes.empty() ? "" : "|") + n;
  app.add_option("--shape", shape_name, "Model shape: " + shapes)->required();
  app.add_option("--type", type_name, "Weight type of the matrices: f32|f16|bf16 (norms stay f32)")
      ->capture_default_str();
  app.add_option("--vocab-from", vocab_path,
                 "GGUF whose tokenizer.* metadata is copied, or a tokenizer.json / tokenizer.model whose "
                 "vocabulary is written as GGUF metadata; its token list sets the vocabulary size")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--seed", seed, "Random seed (the same seed gives the same file)")->capture_default_str();
  app.add_option("-o,--output", out_path, "Output GGUF file")->required();
  app.add_option("--layers", layers, "Override the shape's number of blocks");
  app.add_option("--weight-std", o.weight_std, "Standard deviation of the matrix weights")->capture_default_str();
  app.add_option("--norm-jitter", o.norm_jitter, "Norm weights are 1 + uniform(-j, j)")->capture_default_str();
  app.add_option("--residual-std", o.residual_std,
                 "Standard deviation of attn_output and ffn_down (what writes into the residual stream; default "
                 "--weight-std). Small: each block is a small correction, so the same seed with fewer --layers makes a "
                 "draft that agrees with the whole model");
  app.add_flag("--tied", o.tie_output, "Tie the output projection to token_embd (no output.weight)");
  bool qk_norm = false;
  app.add_flag("--qk-norm", qk_norm, "mpt: add Q/K LayerNorms (attn_q_norm, attn_k_norm; MPT's qk_ln)");
  uint32_t swa_window = 0, swa_pattern = 0;
  app.add_option("--swa-window", swa_window, "RoPE families: write attention.sliding_window (every layer slides)");
  app.add_option("--swa-pattern", swa_pattern, "RoPE families: write attention.sliding_window_pattern N (every Nth layer global)");
  uint32_t longrope = 0, context = 0;
  app.add_option("--longrope", longrope,
                 "phi3: LongRoPE (rope_factors_short/long.weight, attn factor) for this original context");
  app.add_option("--context", context, "Override the shape's context_length");
  uint32_t expert_ffn = 0;
  app.add_option("--expert-ffn", expert_ffn,
                 "Mixture-of-experts shapes: override the experts' width (e.g. 64 for whole MXFP4/Q8_0 blocks)");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto shape = kiln::gen::find_shape(shape_name);
    if (!shape) throw kiln::Error("unknown --shape '" + shape_name + "' (known: " + shapes + ")");
    const auto type = kiln::type_from_name(type_name);
    if (!type) throw kiln::Error("unknown --type '" + type_name + "' (f32, f16 or bf16)");
    o.shape = *shape;
    if (layers) o.shape.n_layers = layers;
    if (qk_norm) {
      if (o.shape.arch != "mpt") throw kiln::Error("--qk-norm is for mpt shapes");
      o.shape.qk_norm = true;
    }
    if (swa_pattern && !swa_window && !o.shape.swa_window) throw kiln::Error("--swa-pattern needs --swa-window");
    if (swa_window) o.shape.swa_window = swa_window, o.shape.swa_pattern = 0;  // the shape's pattern goes with its window
    if (swa_pattern) o.shape.swa_pattern = swa_pattern;
    if (context) o.shape.n_ctx = context;
    if (longrope) o.shape.longrope_orig_ctx = longrope;
    if (expert_ffn) {
      if (!o.shape.n_experts) throw kiln::Error("--expert-ffn is for mixture-of-experts shapes");
      o.shape.expert_ffn_dim = expert_ffn;
      if (o.shape.arch == "llama") o.shape.ffn_dim = expert_ffn;  // Mixtral's files give the width as feed_forward_length
    }
    o.type = *type;
    o.seed = seed;

    const auto t0 = std::chrono::steady_clock::now();
    const kiln::gguf::Writer writer = is_gguf(vocab_path)
                                          ? kiln::gen::build_model(o, *kiln::gguf::File::open(vocab_path))
                                          : kiln::gen::build_model(o, kiln::Tokenizer::from_file(vocab_path)->vocab());
    const auto t1 = std::chrono::steady_clock::now();
    writer.write(out_path);
    const auto t2 = std::chrono::steady_clock::now();

    auto written = kiln::gguf::File::open(out_path);  // re-read: proves the file parses
    uint64_t n_params = 0;
    for (const auto& t : written->tensors()) n_params += t.n_elements;
    const auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    std::fprintf(stderr, "kiln-gen: %s: %s, %u layers, %s, %.1fM parameters, %.1f MiB (generate %.2fs, write %.2fs)\n",
                 out_path.c_str(), o.shape.name.c_str(), o.shape.n_layers, kiln::type_name(o.type).c_str(),
                 double(n_params) / 1e6, double(written->file_size()) / (1 << 20), sec(t0, t1), sec(t1, t2));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-gen: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
