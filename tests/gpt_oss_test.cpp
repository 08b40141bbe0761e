// gpt-oss beyond the llama.cpp reference of tests/families_test.cpp: that each of its parts
// moves the reference file's logits (so that the reference can catch an error in it),
// the quantized KV caches with sinks in both attention kernels, malformed files refused
// with an error naming the key or tensor, and its chat template (harmony) rendered as
// Jinja2 renders it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ctime>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "engine_text.h"
#include "kiln/batch_engine.h"
#include "kiln/chat_template.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/generator.h"
#include "kiln/session.h"
#include "kiln/tokenizer.h"
#include "model_gen/generate_model.h"
#include "runtime/swiglu_clamped.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

// The file tests/data/families/gpt-oss-tiny.logits.txt was computed on (families_test
// checks its sha256), written once.
const std::string& reference_file() {
  static const std::string path = [] {
    const kiln::gen::GenerateOptions o = kiln::gen::peaky_options("gpt-oss-tiny", 7);
    const std::string p = temp_dir() + "/gpt-oss-tiny.gguf";
    kiln::gen::build_model(o, kiln::Tokenizer::from_file(shared_path("tokenizers/llama3-hf/tokenizer.json"))->vocab())
        .write(p);
    return p;
  }();
  return path;
}

// The reference's tokens and sampled logits (subset.py's format: families_test reads it in full).
struct Reference {
  std::vector<int32_t> tokens;
  size_t stride = 0;
  std::vector<std::vector<double>> logits;
};

const Reference& reference() {
  static const Reference r = [] {
    Reference r;
    std::istringstream in(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/families/gpt-oss-tiny.logits.txt"));
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::string tag;
      ls >> tag;
      if (tag == "tokens") {
        for (int32_t id; ls >> id;) r.tokens.push_back(id);
      } else if (tag == "columns") {
        size_t n_vocab;
        ls >> n_vocab >> r.stride;
      } else if (tag == "logits") {
        size_t pos;
        ls >> pos;
        r.logits.emplace_back();
        for (double v; ls >> v;) r.logits.back().push_back(v);
      }
    }
    return r;
  }();
  return r;
}

// Worst NMSE over the positions of one batch against llama.cpp's logits.
double worst_nmse(const kiln::Model& model, kiln::FlashAttention fa = kiln::FlashAttention::off,
                  kiln::TensorType kv = kiln::TensorType::F32, int32_t n_batch = 512) {
  const Reference& ref = reference();
  kiln::SessionParams p;
  p.n_ctx = 64, p.n_batch = n_batch, p.n_threads = 2, p.flash_attn = fa;
  p.kv_type_k = p.kv_type_v = kv;
  kiln::Session s(model, p);
  const auto all = s.decode(ref.tokens, /*all_logits=*/true);
  const size_t n_vocab = model.config().n_vocab;
  double worst = 0;
  for (size_t pos = 0; pos < ref.tokens.size(); ++pos) {
    double err = 0, sum = 0;
    for (size_t i = 0; i < ref.logits[pos].size(); ++i) {
      const double want = ref.logits[pos][i], d = all[pos * n_vocab + i * ref.stride] - want;
      err += d * d, sum += want * want;
    }
    worst = std::max(worst, err / sum);
  }
  return worst;
}

}  // namespace

// Each part, left out of kiln's forward pass, moves the logits far from llama.cpp's; the
// softmax over the chosen experts' logits and a softmax over all renormalized over the
// chosen are the same weights (only rounding apart).
TEST(GptOss, EachPartMovesTheLogits) {
  ASSERT_FALSE(reference().tokens.empty());
  struct Part {
    const char* name;
    std::function<void(kiln::Model&)> breaks;
  };
  const auto each_layer = [](auto f) {
    return [f](kiln::Model& m) {
      for (kiln::LayerWeights& L : m.layers) f(L);
    };
  };
  const Part parts[] = {
      {"attention sinks", each_layer([](kiln::LayerWeights& L) { L.attn_sinks = {}; })},
      {"router bias", each_layer([](kiln::LayerWeights& L) { L.ffn_gate_inp_b = {}; })},
      {"expert gate/up biases", each_layer([](kiln::LayerWeights& L) { L.gate_exps_b = L.up_exps_b = {}; })},
      {"expert down bias", each_layer([](kiln::LayerWeights& L) { L.down_exps_b = {}; })},
      {"Q/K/V biases", each_layer([](kiln::LayerWeights& L) { L.bq = L.bk = L.bv = {}; })},
      {"output bias", each_layer([](kiln::LayerWeights& L) { L.bo = {}; })},
      {"the SwiGLU clamp", [](kiln::Model& m) { m.mutable_config().swiglu_limit = INFINITY; }},
      {"alpha 1.702 (1 instead)", [](kiln::Model& m) { m.mutable_config().swiglu_alpha = 1.0f; }},
      {"the clamped SwiGLU (plain SwiGLU instead)", [](kiln::Model& m) { m.mutable_config().ffn = kiln::Ffn::swiglu; }},
      {"the softmax over the chosen (over all, not renormalized, instead)",
       [](kiln::Model& m) { m.mutable_config().expert_softmax_chosen = false, m.mutable_config().expert_weights_norm = false; }},
      {"YaRN", [](kiln::Model& m) { m.mutable_config().rope_scaling = kiln::RopeScaling::None; }},
      {"the windows", [](kiln::Model& m) { m.mutable_config().swa_window.assign(m.config().n_layers, 0); }},
  };
  for (const Part& part : parts) {
    auto model = kiln::Model::load(reference_file());
    part.breaks(*model);
    for (kiln::FlashAttention fa : {kiln::FlashAttention::off, kiln::FlashAttention::on}) {
      const double e = worst_nmse(*model, fa);
      std::printf("[ gpt-oss-tiny ] without %s (%s): worst NMSE %.3g\n", part.name,
                  fa == kiln::FlashAttention::on ? "tiled" : "direct", e);
      EXPECT_GT(e, 1e-4) << part.name;
    }
  }
  auto model = kiln::Model::load(reference_file());
  model->mutable_config().expert_softmax_chosen = false;
  model->mutable_config().expert_weights_norm = true;
  const double same = worst_nmse(*model);
  std::printf("[ gpt-oss-tiny ] softmax over all, renormalized over the chosen: worst NMSE %.3g\n", same);
  EXPECT_LT(same, 1e-9);
}

// The sinks start the tiled kernel's running softmax and join the direct one's. F16
// caches keep the logits near llama.cpp's F32-cache ones. A Q8_0 cache (values stored by
// position: the tiled kernel's pv path) moves this peaky file's routing (a small error
// flips a near-tied expert: NMSE 0.1-0.3 with or without sinks), so it is compared with
// every expert used, where the routing is continuous: near kiln's F32 direct logits, far
// from them without the sinks.
TEST(GptOss, QuantizedKvCachesKeepTheSinks) {
  auto model = kiln::Model::load(reference_file());
  for (kiln::FlashAttention fa : {kiln::FlashAttention::off, kiln::FlashAttention::on})
    for (int32_t n_batch : {512, 3}) {
      const double e = worst_nmse(*model, fa, kiln::TensorType::F16, n_batch);
      std::printf("[ gpt-oss-tiny ] KV F16, %s, batches of %d: worst NMSE vs llama.cpp %.3g\n",
                  fa == kiln::FlashAttention::on ? "tiled" : "direct", n_batch, e);
      EXPECT_LT(e, 1e-5);
    }
  model->mutable_config().n_experts_used = model->config().n_experts;
  const auto logits = [&](kiln::FlashAttention fa, kiln::TensorType kv, int32_t n_batch) {
    kiln::SessionParams p;
    p.n_ctx = 64, p.n_batch = n_batch, p.n_threads = 2, p.flash_attn = fa;
    p.kv_type_k = p.kv_type_v = kv;
    kiln::Session s(*model, p);
    const auto all = s.decode(reference().tokens, /*all_logits=*/true);
    return std::vector<float>(all.begin(), all.end());
  };
  const auto worst_between = [&](const std::vector<float>& got, const std::vector<float>& want) {
    const size_t n_vocab = model->config().n_vocab;
    double worst = 0;
    for (size_t pos = 0; pos < reference().tokens.size(); ++pos) {
      double err = 0, sum = 0;
      for (size_t i = pos * n_vocab; i < (pos + 1) * n_vocab; ++i)
        err += std::pow(got[i] - want[i], 2), sum += std::pow(want[i], 2);
      worst = std::max(worst, err / sum);
    }
    return worst;
  };
  const std::vector<float> f32 = logits(kiln::FlashAttention::off, kiln::TensorType::F32, 512);
  for (int32_t n_batch : {512, 3}) {
    const double e = worst_between(logits(kiln::FlashAttention::on, kiln::TensorType::Q8_0, n_batch), f32);
    std::printf("[ gpt-oss-tiny, every expert ] KV Q8_0, tiled, batches of %d: worst NMSE vs F32 direct %.3g\n", n_batch, e);
    EXPECT_LT(e, 0.03);
  }
  for (kiln::LayerWeights& L : model->layers) L.attn_sinks = {};
  const double without = worst_between(logits(kiln::FlashAttention::on, kiln::TensorType::Q8_0, 512), f32);
  std::printf("[ gpt-oss-tiny, every expert ] KV Q8_0 without sinks: worst NMSE %.3g\n", without);
  EXPECT_GT(without, 0.3);
}

// A decoding token whose global layers see more than 512 keys has them cut into slices
// whose partial softmaxes the tiled kernel merges (flash-decoding): the sink must count
// once. The direct kernel, which softmaxes whole rows, gives the same logits.
TEST(GptOss, SplitDecodeCountsTheSinkOnce) {
  auto model = kiln::Model::load(reference_file());
  std::vector<int32_t> tokens;
  while (tokens.size() < 1100) tokens.insert(tokens.end(), reference().tokens.begin(), reference().tokens.end());
  tokens.resize(1100);
  std::vector<std::vector<float>> out[2];
  for (int tiled = 0; tiled < 2; ++tiled) {
    kiln::SessionParams p;
    p.n_ctx = 1200, p.n_batch = 512, p.n_threads = 2;
    p.flash_attn = tiled ? kiln::FlashAttention::on : kiln::FlashAttention::off;
    p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
    kiln::Session s(*model, p);
    s.decode(std::span(tokens).first(1090));
    for (size_t i = 1090; i < tokens.size(); ++i) {  // 1091 to 1100 keys: 3 slices
      const auto row = s.decode(std::span(&tokens[i], 1));
      out[tiled].emplace_back(row.begin(), row.end());
    }
  }
  double worst = 0;
  for (size_t t = 0; t < out[0].size(); ++t) {
    double err = 0, sum = 0;
    for (size_t i = 0; i < out[0][t].size(); ++i) err += std::pow(out[1][t][i] - out[0][t][i], 2), sum += std::pow(out[0][t][i], 2);
    worst = std::max(worst, err / sum);
  }
  std::printf("[ gpt-oss-tiny ] split decode (tiled) vs whole rows (direct) past 1090 keys: worst NMSE %.3g\n", worst);
  EXPECT_LT(worst, 1e-8);
}

namespace {

// A copy of the reference file with `edit` applied to its metadata and tensors.
struct Edit {
  std::function<void(kiln::gguf::Writer&)> keys;
  std::function<bool(const kiln::gguf::TensorInfo&, kiln::gguf::Writer&)> tensor;  // true: written by the edit
};

std::string edited(const std::string& name, const Edit& e) {
  auto f = kiln::gguf::File::open(reference_file());
  kiln::gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  if (e.keys) e.keys(w);
  for (const kiln::gguf::TensorInfo& t : f->tensors())
    if (!e.tensor || !e.tensor(t, w)) w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string path = temp_dir() + "/" + name + ".gguf";
  w.write(path);
  return path;
}

Edit drop(const std::string& tensor) {
  return {nullptr, [tensor](const kiln::gguf::TensorInfo& t, kiln::gguf::Writer&) { return t.name == tensor; }};
}

}  // namespace

TEST(GptOss, MalformedFilesNameTheKeyOrTensor) {
  using kiln::gguf::Value;
  const std::vector<std::pair<Edit, std::string>> cases = {
      {drop("blk.1.attn_sinks.weight"), "missing tensor 'blk.1.attn_sinks.weight'"},
      {drop("blk.2.ffn_down_exps.bias"), "missing tensor 'blk.2.ffn_down_exps.bias'"},
      {drop("blk.0.ffn_gate_inp.bias"), "missing tensor 'blk.0.ffn_gate_inp.bias'"},
      {drop("blk.3.attn_output.bias"), "missing tensor 'blk.3.attn_output.bias'"},
      {drop("blk.0.post_attention_norm.weight"), "missing tensor 'blk.0.post_attention_norm.weight'"},
      {drop("output.weight"), "missing tensor 'output.weight'"},
      {{nullptr,
        [](const kiln::gguf::TensorInfo& t, kiln::gguf::Writer& w) {
          if (t.name != "blk.0.attn_sinks.weight") return false;
          w.add_tensor(t.name, t.type, {t.dims[0] + 1}, std::vector<uint8_t>((t.dims[0] + 1) * 4));
          return true;
        }},
       "tensor 'blk.0.attn_sinks.weight' has shape [5], expected [4]"},
      {{nullptr,
        [](const kiln::gguf::TensorInfo& t, kiln::gguf::Writer& w) {
          if (t.name != "blk.1.ffn_up_exps.bias") return false;
          w.add_tensor(t.name, kiln::TensorType::F16, t.dims, std::vector<uint8_t>(t.n_bytes / 2));
          return true;
        }},
       "tensor 'blk.1.ffn_up_exps.bias' is F16; biases must be F32"},
      {{[](kiln::gguf::Writer& w) { w.set("gpt-oss.rope.scaling.yarn_beta_fast", Value::of_f32(16.0f)); }, nullptr},
       "gpt-oss.rope.scaling.yarn_beta_fast 16"},
      {{[](kiln::gguf::Writer& w) { w.set("gpt-oss.rope.freq_base_swa", Value::of_f32(10000.0f)); }, nullptr},
       "gpt-oss.rope.freq_base_swa differs from rope.freq_base"},
      {{[](kiln::gguf::Writer& w) { w.set("gpt-oss.attention.sliding_window", Value::of_u32(0)); }, nullptr},
       "gpt-oss.attention.sliding_window is 0"},
      {{[](kiln::gguf::Writer& w) { w.set("gpt-oss.expert_used_count", Value::of_u32(9)); }, nullptr},
       "gpt-oss.expert_used_count is 9, expected 1 to gpt-oss.expert_count (8)"},
  };
  int i = 0;
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    const std::string path = edited("bad-" + std::to_string(i++), edit);
    try {
      kiln::Model::load(path);
      ADD_FAILURE() << "loaded";
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

// A file without the window key is refused too (llama.cpp requires it).
TEST(GptOss, MissingSlidingWindowKeyIsNamed) {
  auto f = kiln::gguf::File::open(reference_file());
  kiln::gguf::Writer w;
  for (const auto& [k, v] : f->metadata())
    if (k != "gpt-oss.attention.sliding_window") w.set(k, v);
  for (const kiln::gguf::TensorInfo& t : f->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string path = temp_dir() + "/no-window.gguf";
  w.write(path);
  try {
    kiln::Model::load(path);
    ADD_FAILURE() << "loaded";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing key 'gpt-oss.attention.sliding_window'"), std::string::npos) << e.what();
  }
}

// gpt-oss's published template (tests/data/templates/openai-gpt-oss-120b.jinja, from
// llama.cpp's repository) states the current date, so Jinja2's renderings were made with
// the date 2026-12-02 (tests/data/templates/generate.py: expected-dated/): kiln's, with
// today's date put back to that one, must be the same text, for the five conversations of
// the other templates and a harmony one (developer message, reasoning effort, builtin
// tools, chain of thought, a tool call and its result).
TEST(GptOss, ChatTemplateRendersLikeJinja2) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/tests/data/templates";
  const kiln::ChatTemplate t(read_file(dir + "/openai-gpt-oss-120b.jinja"));
  const auto convs = nlohmann::ordered_json::parse(read_file(dir + "/expected-dated/conversations.json"));
  const auto today = [] {
    char buf[16];
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &local);
    return std::string(buf);
  };
  size_t compared = 0;
  for (const char* name : {"hello", "libai", "kvcache", "tools", "think", "harmony"}) {
    SCOPED_TRACE(name);
    const std::string file = dir + "/expected-dated/openai-gpt-oss-120b." + name + ".txt";
    ASSERT_TRUE(std::filesystem::exists(file));
    const auto& c = convs.at(name);
    const std::string date = today();
    std::string got = t.render(c.at("messages"), c.at("add_generation_prompt").get<bool>(), "<BOS>", "<EOS>", c.at("context"));
    const std::string line = "Current date: " + date + "\n";
    const size_t at = got.find(line);
    ASSERT_NE(at, std::string::npos) << got;
    got.replace(at, line.size(), "Current date: 2026-12-02\n");
    EXPECT_EQ(got, read_file(file));
    ++compared;
  }
  EXPECT_EQ(compared, 6u);
}

// kiln info names what sets the family apart, and no gpt-oss key goes unread (the YaRN
// beta keys included).
TEST(GptOss, InfoNamesItsParts) {
  const auto r = run_command(shell_quote(kiln_binary()) + " info " + shell_quote(reference_file()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"architecture: gpt-oss", "neox, scaling yarn x32, original context 64",
                        "SwiGLU clamped at 7, alpha 1.702, up + 1, mixture of 8 experts (2 used per token, width 64, "
                        "softmax over the chosen, biases)",
                        "features:     Q/K/V biases, attention sinks", "sliding win:  6 on layers 0, 2; global 1, 3",
                        "output:       output.weight"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
  EXPECT_EQ(r.out.find("ignored:"), std::string::npos) << r.out;
}

// H2O's scores weigh keys as the attention does, sink included: a query's weights over
// the keys sum to 1 minus the sink's share, so a very low sink leaves the total at
// layers x heads x queries, a very high one takes nearly everything, the file's sinks
// something in between.
TEST(GptOss, AttentionScoresLeaveTheSinkItsShare) {
  auto model = kiln::Model::load(reference_file());
  const kiln::ModelConfig& c = model->config();
  const std::vector<int32_t>& tokens = reference().tokens;
  const auto total = [&](const float* sinks) {
    if (sinks)
      for (kiln::LayerWeights& L : model->layers) L.attn_sinks.data = sinks;
    kiln::SessionParams p;
    p.n_ctx = 64, p.n_threads = 2, p.swa_window = 0;  // scores are for global attention
    p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
    kiln::Session s(*model, p);
    s.track_attention(true);
    s.decode(tokens);
    double sum = 0;
    for (float v : s.attention_scores()) sum += v;
    return sum;
  };
  const double all = double(c.n_layers) * c.n_heads * tokens.size();
  const double file = total(nullptr);
  const std::vector<float> low(c.n_heads, -60.0f), high(c.n_heads, 60.0f);
  const double with_low = total(low.data()), with_high = total(high.data());
  std::printf("[ gpt-oss-tiny ] attention received: %.6g of %.6g (file's sinks), %.6g (sinks -60), %.6g (sinks 60)\n",
              file, all, with_low, with_high);
  EXPECT_NEAR(with_low, all, all * 1e-5);
  EXPECT_LT(with_high, all * 1e-6);
  EXPECT_LT(file, all * 0.95);
  EXPECT_GT(file, all * 0.05);
}

// The paged layout (no sliding windows there: kiln refuses them, so the windows are off on
// both sides; blocks of 16 positions, the prompt spans three) keeps the sinks: the same
// logits as the contiguous cache, in both attention kernels.
// The paged cache (kiln serve's) holds every position of the sliding-window layers and
// masks them; the contiguous cache keeps those layers in rings of window + batch - 1. The
// logits agree over a prompt several windows long, in batches smaller than the window.
TEST(GptOss, PagedCacheGivesTheContiguousLogits) {
  auto model = kiln::Model::load(reference_file());
  const std::vector<int32_t>& tokens = reference().tokens;
  ASSERT_GT(tokens.size(), 3 * size_t(model->config().swa_window[0]));
  for (kiln::FlashAttention fa : {kiln::FlashAttention::off, kiln::FlashAttention::on}) {
    std::vector<float> out[2];
    for (int paged = 0; paged < 2; ++paged) {
      kiln::SessionParams p;
      p.n_ctx = 64, p.n_batch = 5, p.n_threads = 2, p.flash_attn = fa;
      p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
      p.kv_layout = paged ? kiln::KvLayout::paged : kiln::KvLayout::contiguous;
      kiln::Session s(*model, p);
      if (!paged) {
        EXPECT_LT(s.kv_cache_layer_bytes(0), s.kv_cache_layer_bytes(1)) << "layer 0 slides: a ring";
      }
      const auto all = s.decode(tokens, /*all_logits=*/true);
      out[paged].assign(all.begin(), all.end());
    }
    double err = 0, sum = 0;
    for (size_t i = 0; i < out[0].size(); ++i) err += std::pow(out[1][i] - out[0][i], 2), sum += std::pow(out[0][i], 2);
    std::printf("[ gpt-oss-tiny ] paged vs contiguous (%s): NMSE %.3g\n", fa == kiln::FlashAttention::on ? "tiled" : "direct",
                err / sum);
    EXPECT_LT(err / sum, 1e-12);
  }
}

// kiln serve's engine on gpt-oss (paged cache, sliding windows masked): two concurrent
// requests whose prompts and replies run past the window each get Generator's text on the
// contiguous cache with rings.
TEST(GptOss, ServerRequestsGiveTheirTextsAlone) {
  auto model = kiln::Model::load(reference_file());
  const std::vector<int32_t>& ref = reference().tokens;
  const std::vector<int32_t> a(ref.begin(), ref.begin() + 9), b(ref.begin() + 3, ref.begin() + 14);
  kiln::SessionParams p;
  p.n_ctx = 96, p.n_batch = 32, p.n_threads = 2;
  kiln::SamplerParams greedy;
  greedy.temperature = 0;
  const auto alone = [&](const std::vector<int32_t>& prompt) {
    kiln::Session s(*model, p);  // contiguous: rings
    kiln::Sampler sampler(greedy, model->config().n_vocab);
    kiln::Generator g(s, model->tokenizer(), sampler);
    std::string text;
    g.generate(prompt, 24, [&](std::string_view piece) { text += piece; });
    return text;
  };
  kiln::SessionParams paged = p;
  paged.kv_layout = kiln::KvLayout::paged;
  kiln::Session session(*model, paged);
  kiln::BatchEngine::Params bp;
  bp.n_parallel = 2;
  kiln::BatchEngine engine(session, model->tokenizer(), bp);
  std::string got_b;
  std::thread second([&] { got_b = engine_text(engine, b, 24); });
  EXPECT_EQ(engine_text(engine, a, 24), alone(a));
  second.join();
  EXPECT_EQ(got_b, alone(b));
}

// The clamped SwiGLU on values around its limits, against the formula in double: the
// gate is capped from above only, the up projection on both sides.
TEST(GptOss, ClampedSwigluCapsGateAboveAndUpBothSides) {
  const float gate[] = {-9.0f, -1.0f, 0.0f, 0.5f, 6.9f, 7.0f, 12.0f, 3.0f, 3.0f};
  const float up[] = {0.0f, 2.0f, 5.0f, -0.5f, 1.0f, -8.0f, 9.0f, -7.5f, 7.5f};
  float out[9];
  kiln::swiglu_clamped(gate, up, out, 9, 1.702f, 7.0f);
  for (size_t i = 0; i < 9; ++i) {
    const double g = std::min(double(gate[i]), 7.0), u = std::clamp(double(up[i]), -7.0, 7.0);
    const double want = g / (1 + std::exp(-1.702 * g)) * (u + 1);
    EXPECT_NEAR(out[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << i;
  }
  EXPECT_NEAR(out[6], 7.0 / (1 + std::exp(-1.702 * 7.0)) * 8.0, 1e-4);  // both capped at 7
  EXPECT_LT(out[0], 0.0f);  // a large negative gate is not clamped: -9 sigmoid(-15.3) ~ -2e-6
}
