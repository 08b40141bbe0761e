// Model families against llama.cpp: for each of qwen2, qwen3, Llama 3 (untied and tied
// output), Mistral (a window wider than the prompt), gemma, gemma2, gemma3, phi3, Phi-3
// 128k (LongRoPE, at two contexts), mamba2 and granitehybrid, a tiny random-weight file from kiln's generator
// (byte-identical to the one llama.cpp evaluated: its sha256 is committed) must give
// llama.cpp's logits at every position, through every decode path (one batch, batches,
// token by token with the KV cache, both attention kernels), and llama.cpp's greedy
// continuation. Qwen, Llama 3 and Gemma 3 files carry their real vocabularies, and kiln
// must tokenize the prompt text as llama.cpp did.
// tests/data/families/README.md says how the reference data was made.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/tokenizer.h"
#include "model_gen/generate_model.h"
#include "sha256.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

struct Case {
  const char* name;   // file stem in tests/data/families
  const char* shape;  // kiln-gen --shape
  const char* arch;   // general.architecture
  // In ../shared: the family's own tokenizer.json, or a vocabulary GGUF where the family's
  // is not used (below).
  const char* vocab;
  bool tied;  // kiln-gen --tied (Gemma ties whatever it is told)
  // The session's context, as llama-logits -c gave llama.cpp's (LongRoPE picks its
  // factors by it); the generated file's stem when cases share one (else `name`).
  int32_t n_ctx = 64;
  const char* file = nullptr;
};
// Qwen2/3, Llama 3 and Gemma 3 carry their real vocabularies (151669, 128256 and 262145
// tokens; Gemma 3's SentencePiece-style BPE restated with scores), and their prompt is
// prompt.txt, which kiln must tokenize as llama.cpp did. Phi-3's vocabulary is its own;
// Gemma 1/2 (whose own is not in ../shared; Gemma 3's would add 15 s to the test) and
// Mistral have the llama-spm one. Those are given the ids of a prompt directly.
const Case kCases[] = {
    {"qwen2-tiny", "qwen2-tiny", "qwen2", "tokenizers/qwen3-hf/tokenizer.json", true},
    {"qwen3-tiny", "qwen3-tiny", "qwen3", "tokenizers/qwen3-hf/tokenizer.json", true},
    {"qwen3moe-tiny", "qwen3moe-tiny", "qwen3moe", "tokenizers/qwen3-hf/tokenizer.json", true},
    {"llama3-tiny", "llama3-tiny", "llama", "tokenizers/llama3-hf/tokenizer.json", false},
    {"llama3-tiny-tied", "llama3-tiny", "llama", "tokenizers/llama3-hf/tokenizer.json", true},
    {"mistral-tiny", "mistral-tiny", "llama", "vocab/ggml-vocab-llama-spm.gguf", false},
    {"mixtral-tiny", "mixtral-tiny", "llama", "vocab/ggml-vocab-llama-spm.gguf", false},
    // o200k's vocabulary is not in ../shared: Llama 3's, under gpt-oss's split (gpt-4o).
    {"gpt-oss-tiny", "gpt-oss-tiny", "gpt-oss", "tokenizers/llama3-hf/tokenizer.json", false},
    {"gemma-tiny", "gemma-tiny", "gemma", "vocab/ggml-vocab-llama-spm.gguf", true},
    {"gemma2-tiny", "gemma2-tiny", "gemma2", "vocab/ggml-vocab-llama-spm.gguf", true},
    {"gemma3-tiny", "gemma3-tiny", "gemma3", "tokenizers/gemma3-hf/tokenizer.json", true},
    {"phi3-tiny", "phi3-tiny", "phi3", "vocab/ggml-vocab-phi-3.gguf", false},
    // LongRoPE, original context 256: short factors at a context of 256, long ones at 512.
    {"phi3-128k-tiny-short", "phi3-128k-tiny", "phi3", "vocab/ggml-vocab-phi-3.gguf", false, 256, "phi3-128k-tiny"},
    {"phi3-128k-tiny-long", "phi3-128k-tiny", "phi3", "vocab/ggml-vocab-phi-3.gguf", false, 512, "phi3-128k-tiny"},
    {"mamba2-tiny", "mamba2-tiny", "mamba2", "vocab/ggml-vocab-gpt-neox.gguf", true},  // no attention: tiled = direct
    {"granitehybrid-tiny", "granitehybrid-tiny", "granitehybrid", "vocab/ggml-vocab-gpt-neox.gguf", false},
    {"granitehybrid-dense-tiny", "granitehybrid-dense-tiny", "granitehybrid", "vocab/ggml-vocab-gpt-neox.gguf", false},
};

std::string file_of(const Case& c) { return c.file ? c.file : c.name; }

bool has_text_prompt(const Case& c) { return std::string(c.vocab).ends_with(".json"); }

std::string data_path(const std::string& name) { return std::string(KILN_SOURCE_DIR) + "/tests/data/families/" + name; }

// Exactly what tests/data/families/README.md's kiln-gen command lines write.
kiln::gen::GenerateOptions reference_options(const Case& c) {
  return kiln::gen::peaky_options(c.shape, 7, c.tied);
}

// As kiln-gen --vocab-from does with the case's vocabulary file (a tokenizer.json is read
// once: Qwen's serves two files).
kiln::gguf::Writer build(const kiln::gen::GenerateOptions& o, const Case& c) {
  const std::string path = shared_path(c.vocab);
  static std::map<std::string, std::unique_ptr<kiln::Tokenizer>> loaded;
  if (has_text_prompt(c)) {
    auto& tok = loaded[path];
    if (!tok) tok = kiln::Tokenizer::from_file(path);
    return kiln::gen::build_model(o, tok->vocab());
  }
  return kiln::gen::build_model(o, *kiln::gguf::File::open(path));
}

// The reference file of a case, written once per test program; its sha256 is taken from
// the bytes written (generating a 70 MB file twice would double the test's time).
struct Written {
  std::string path, sha256;
};
const Written& reference_model(const Case& c) {
  static std::map<std::string, Written> written;
  auto it = written.find(file_of(c));
  if (it == written.end()) {
    const std::vector<uint8_t> bytes = build(reference_options(c), c).to_bytes();
    Written w{temp_dir() + "/" + file_of(c) + ".gguf", sha256_hex(bytes.data(), bytes.size())};
    write_file(w.path, std::string(bytes.begin(), bytes.end()));
    it = written.emplace(file_of(c), std::move(w)).first;
  }
  return it->second;
}

// subset.py's format: "tokens ids", "columns <n_vocab> <stride>", per position
// "logits <pos> <every stride-th logit>" and "argmax <pos> <id> <value>", "greedy ids";
// and for a text prompt "prompt_tokens ids", llama.cpp's tokenization of prompt.txt.
struct Reference {
  std::vector<int32_t> tokens, greedy, prompt_tokens;
  size_t n_vocab = 0, stride = 0;
  std::vector<std::vector<double>> logits;  // [position][column / stride]
  std::vector<size_t> argmax;               // [position], over the whole vocabulary
};

Reference read_reference(const Case& c) {
  Reference r;
  std::istringstream in(read_file(data_path(std::string(c.name) + ".logits.txt")));
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    if (tag == "tokens" || tag == "greedy" || tag == "prompt_tokens") {
      auto& ids = tag == "tokens" ? r.tokens : tag == "greedy" ? r.greedy : r.prompt_tokens;
      for (int32_t id; ls >> id;) ids.push_back(id);
    } else if (tag == "columns") {
      ls >> r.n_vocab >> r.stride;
    } else if (tag == "logits") {
      size_t pos;
      ls >> pos;
      EXPECT_EQ(pos, r.logits.size());
      r.logits.emplace_back();
      for (double v; ls >> v;) r.logits.back().push_back(v);
    } else if (tag == "argmax") {
      size_t pos, id;
      ls >> pos >> id;
      EXPECT_EQ(pos, r.argmax.size());
      r.argmax.push_back(id);
    }
  }
  return r;
}

// NMSE = sum (kiln - llama)^2 / sum llama^2 over one position's sampled columns.
double nmse(std::span<const float> got, const Reference& r, size_t pos) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < r.logits[pos].size(); ++i) {
    const double want = r.logits[pos][i], d = got[i * r.stride] - want;
    err += d * d;
    ref += want * want;
  }
  return err / ref;
}

size_t argmax(std::span<const float> v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// Bound on every position's NMSE, F32 weights and F32 KV cache on both sides. Measured
// (README.md has the table per family) 1e-7 at most: float summation order, and the GELU
// of the Gemma families, which llama.cpp reads from a table of fp16 values.
constexpr double kNmseBound = 1e-5;

kiln::SessionParams session_params(int32_t n_batch, int32_t n_threads, kiln::FlashAttention fa, int32_t n_ctx = 64) {
  kiln::SessionParams p;
  p.n_ctx = n_ctx, p.n_batch = n_batch, p.n_threads = n_threads, p.flash_attn = fa;
  p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
  return p;
}

}  // namespace

class FamilyReference : public ::testing::TestWithParam<Case> {};

TEST_P(FamilyReference, LogitsAndGreedyMatchLlamaCppOnEveryPath) {
  std::istringstream sha(read_file(data_path(file_of(GetParam()) + ".gguf.sha256")));
  std::string want;
  sha >> want;
  ASSERT_EQ(reference_model(GetParam()).sha256, want)
      << "kiln-gen no longer writes the file the committed llama.cpp logits were computed on";
  const Reference ref = read_reference(GetParam());
  ASSERT_GE(ref.tokens.size(), 16u);
  ASSERT_EQ(ref.logits.size(), ref.tokens.size());
  ASSERT_EQ(ref.argmax.size(), ref.tokens.size());
  auto model = kiln::Model::load(reference_model(GetParam()).path);
  const kiln::ModelConfig& c = model->config();
  ASSERT_EQ(c.arch, GetParam().arch);
  ASSERT_EQ(c.n_vocab, ref.n_vocab);
  ASSERT_EQ(ref.logits[0].size(), (c.n_vocab + ref.stride - 1) / ref.stride);
  EXPECT_TRUE(c.ignored_keys.empty()) << c.ignored_keys.front();
  if (has_text_prompt(GetParam())) {
    // The file's own tokenizer (the GGUF metadata written from tokenizer.json) splits
    // the prompt as llama.cpp did, BOS included where the family adds one; those ids are
    // the ones whose logits llama.cpp printed.
    const std::string prompt = read_file(data_path("prompt.txt"));
    ASSERT_FALSE(ref.prompt_tokens.empty());
    EXPECT_EQ(model->tokenizer().encode(prompt, /*add_bos=*/true), ref.prompt_tokens);
    EXPECT_EQ(ref.tokens, ref.prompt_tokens);
  }

  struct Path {
    const char* name;
    int32_t n_batch, n_threads;
    bool token_by_token;
    kiln::FlashAttention fa = kiln::FlashAttention::off;
  };
  for (const Path& p : {Path{"one batch", 512, 1, false}, Path{"one batch, 2 threads", 512, 2, false},
                        Path{"batches of 5", 5, 1, false}, Path{"token by token", 512, 2, true},
                        Path{"tiled attention", 512, 2, false, kiln::FlashAttention::on},
                        Path{"tiled attention, batches of 3", 3, 1, false, kiln::FlashAttention::on},
                        Path{"tiled attention, token by token", 512, 1, true, kiln::FlashAttention::on}}) {
    if (kThreadSanitized && p.n_threads == 1) continue;  // nothing there for TSan to find
    SCOPED_TRACE(p.name);
    kiln::Session s(*model, session_params(p.n_batch, p.n_threads, p.fa, GetParam().n_ctx));
    std::vector<float> logits;
    if (p.token_by_token) {
      for (int32_t t : ref.tokens) {
        const auto row = s.decode(std::span(&t, 1));
        logits.insert(logits.end(), row.begin(), row.end());
      }
    } else {
      const auto all = s.decode(ref.tokens, /*all_logits=*/true);
      logits.assign(all.begin(), all.end());
    }
    double worst = 0;
    for (size_t pos = 0; pos < ref.tokens.size(); ++pos) {
      const std::span<const float> row(logits.data() + pos * c.n_vocab, c.n_vocab);
      const double e = nmse(row, ref, pos);
      worst = std::max(worst, e);
      EXPECT_LT(e, kNmseBound) << "position " << pos;
      EXPECT_EQ(argmax(row), ref.argmax[pos]) << "position " << pos;
    }
    std::printf("[ %s ] %s: worst NMSE vs llama.cpp %.3g\n", GetParam().name, p.name, worst);
  }

  // llama.cpp's greedy continuation of the reference tokens (the KV cache path, both
  // attention kernels): the same ids. In this test, not one of its own, so that the file
  // is generated, written and loaded once.
  ASSERT_FALSE(ref.greedy.empty());
  for (kiln::FlashAttention fa : {kiln::FlashAttention::off, kiln::FlashAttention::on}) {
    if (kThreadSanitized) break;  // one thread
    kiln::Session s(*model, session_params(512, 1, fa, GetParam().n_ctx));
    std::span<const float> logits = s.decode(ref.tokens);
    std::vector<int32_t> got;
    for (size_t i = 0; i < ref.greedy.size(); ++i) {
      got.push_back(int32_t(argmax(logits)));
      logits = s.decode(std::span(&got.back(), 1));
    }
    EXPECT_EQ(got, ref.greedy) << "greedy continuation, " << (fa == kiln::FlashAttention::on ? "tiled" : "direct")
                               << " attention";
  }
}

// "llama3-tiny-tied" -> "Llama3Tied".
INSTANTIATE_TEST_SUITE_P(Files, FamilyReference, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string out;
  std::istringstream parts(info.param.name);
  for (std::string part; std::getline(parts, part, '-');) {
    if (part == "tiny") continue;
    part[0] = char(std::toupper(part[0]));
    out += part;
  }
  return out;
});

namespace {

const Case& case_named(const std::string& name) {
  for (const Case& c : kCases)
    if (name == c.name) return c;
  throw std::runtime_error("no case " + name);
}

// A copy of a reference file with one more metadata key.
std::string with_key(const Case& c, const std::string& key, const kiln::gguf::Value& value) {
  auto f = kiln::gguf::File::open(reference_model(c).path);
  kiln::gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  w.set(key, value);
  for (const kiln::gguf::TensorInfo& t : f->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string path = temp_dir() + "/" + c.name + "-with-" + key + ".gguf";
  w.write(path);
  return path;
}

kiln::test::CommandResult info(const std::string& path) {
  return run_command(shell_quote(kiln_binary()) + " info " + shell_quote(path));
}

}  // namespace

// kiln info names the family, what sets it apart, and each metadata key of the family the
// loader did not read: Phi-3's window is ignored on purpose (as llama.cpp does), a key of a
// newer converter because kiln does not know it. (Six runs of the binary, not one per
// family: each maps and reads a whole file.)
TEST(Families, InfoNamesTheFamilyItsPartsAndIgnoredKeys) {
  if (kThreadSanitized) GTEST_SKIP() << "kiln info runs on one thread (77 s under TSan)";
  struct Want {
    std::string path;
    std::vector<std::string> fragments;
    bool ignored;
  };
  const std::vector<Want> wants = {
      {reference_model(case_named("qwen2-tiny")).path, {"architecture: qwen2", "neox", "features:     Q/K/V biases"}, false},
      {reference_model(case_named("gemma3-tiny")).path,
       {"architecture: gemma3", "GeGLU", "per-head Q/K RMSNorm, post-norms, embeddings x8", "scaling linear x8",
        "window layers' RoPE base 10000", "6 on layers 0-1, 3; global 2", "tied to token_embd"},
       false},
      {with_key(case_named("phi3-tiny"), "phi3.attention.sliding_window", kiln::gguf::Value::of_u32(2047)),
       {"architecture: phi3", "fused QKV, fused gate/up", "output:       output.weight",
        "ignored:      phi3.attention.sliding_window (metadata kiln's phi3 does not read)"},
       true},
      {reference_model(case_named("mistral-tiny")).path, {"architecture: llama", "sliding win:  48 on every layer"}, false},
      {reference_model(case_named("qwen3moe-tiny")).path,
       {"architecture: qwen3moe", "mixture of 8 experts (2 used per token, width 48, weights renormalized)"}, false},
      {reference_model(case_named("phi3-128k-tiny-long")).path,
       {"context:      2048 (trained)",
        "scaling none, attn factor 1.1726, frequency factors from rope_factors_short.weight (LongRoPE; "
        "rope_factors_long.weight for contexts over 256)"},
       false},
      {with_key(case_named("gemma2-tiny"), "gemma2.attention.query_pre_attn_scalar", kiln::gguf::Value::of_u32(32)),
       {"architecture: gemma2", "post-norms", "attention soft-cap 1.5", "final soft-cap 3", "6 on layers 0, 2; global 1, 3",
        "ignored:      gemma2.attention.query_pre_attn_scalar"},
       true},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.path);
    const auto r = info(w.path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const std::string& s : w.fragments) EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
    EXPECT_EQ(r.out.find("ignored:") != std::string::npos, w.ignored) << r.out;
  }
}

// Gemma 3 rotates local and global layers with different tables; a context shift and an
// eviction must turn each layer's kept keys back with its own. Layer 0's keys depend only
// on token and position, so afterwards they equal those of a session that saw the kept
// tokens at their new positions. Layer 0 is local in gemma3-tiny; made global (the model's
// config edited after loading) it checks the global, linearly scaled table.
TEST(Families, Gemma3ContextShiftAndEvictionTurnEachLayerBackWithItsOwnRope) {
  const Reference ref = read_reference(case_named("gemma3-tiny"));
  for (bool layer0_global : {false, true}) {
    SCOPED_TRACE(layer0_global ? "layer 0 global" : "layer 0 local");
    auto model = kiln::Model::load(reference_model(case_named("gemma3-tiny")).path);
    if (layer0_global) model->mutable_config().swa_window[0] = 0;
    kiln::SessionParams p = session_params(512, 1, kiln::FlashAttention::off);
    p.swa_full = true;  // the shift keeps positions a ring would have dropped
    const int32_t n_keep = 2, n_discard = 9;
    std::vector<int32_t> kept(ref.tokens.begin(), ref.tokens.begin() + n_keep);
    kept.insert(kept.end(), ref.tokens.begin() + n_keep + n_discard, ref.tokens.end());
    std::vector<int32_t> evicted;
    for (int32_t i = n_keep; i < n_keep + n_discard; ++i) evicted.push_back(i);

    const auto layer0_keys = [&](const kiln::Session& s) {
      std::vector<uint8_t> bytes;
      s.write_kv_state([&](const void* d, size_t n) { bytes.insert(bytes.end(), (const uint8_t*)d, (const uint8_t*)d + n); });
      std::vector<float> out(size_t(s.n_past()) * model->config().n_kv_heads * model->config().head_dim);
      std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));  // layer 0's keys come first
      return out;
    };
    kiln::Session fresh(*model, p);
    fresh.decode(kept);
    const std::vector<float> want = layer0_keys(fresh);
    for (bool evict : {false, true}) {
      SCOPED_TRACE(evict ? "evict" : "shift_context");
      kiln::SessionParams q = p;
      if (evict) q.swa_window = 0;  // eviction refuses sliding layers; the tables stay the model's
      kiln::Session s(*model, q);
      s.decode(ref.tokens);
      if (evict) s.evict(evicted);
      else s.shift_context(n_keep, n_discard);
      ASSERT_EQ(s.n_past(), int32_t(kept.size()));
      const std::vector<float> got = layer0_keys(s);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, double(std::fabs(got[i] - want[i]))), scale = std::max(scale, double(std::fabs(want[i])));
      EXPECT_LT(worst / scale, 1e-5);
    }
  }
}

// The LongRoPE references can only catch a wrong choice if the choice shows: the two
// llama.cpp references differ, and so do kiln's logits without the attention factor.
TEST(Families, Phi3LongRopeFactorsAndAttentionFactorEachMatter) {
  const Case& short_case = case_named("phi3-128k-tiny-short");
  const Case& long_case = case_named("phi3-128k-tiny-long");
  const Reference short_ref = read_reference(short_case), long_ref = read_reference(long_case);
  ASSERT_EQ(short_ref.tokens, long_ref.tokens);
  auto model = kiln::Model::load(reference_model(long_case).path);
  ASSERT_FALSE(model->config().rope_freq_factors_long.empty());
  const auto worst_against = [&](const Reference& ref, const std::vector<float>& logits) {
    double worst = 0;
    for (size_t pos = 0; pos < ref.tokens.size(); ++pos)
      worst = std::max(worst, nmse(std::span(logits).subspan(pos * ref.n_vocab, ref.n_vocab), ref, pos));
    return worst;
  };
  double sets_apart = 0;  // as nmse(), between the two references' sampled columns
  for (size_t pos = 0; pos < long_ref.tokens.size(); ++pos) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < long_ref.logits[pos].size(); ++i)
      err += std::pow(short_ref.logits[pos][i] - long_ref.logits[pos][i], 2), ref += std::pow(long_ref.logits[pos][i], 2);
    sets_apart = std::max(sets_apart, err / ref);
  }
  std::printf("[ phi3-128k ] short vs long factors (llama.cpp): worst NMSE %.3g\n", sets_apart);
  EXPECT_GT(sets_apart, 1e-3);

  model->mutable_config().rope_attn_factor = 1.0f;
  kiln::Session s(*model, session_params(512, 1, kiln::FlashAttention::off, long_case.n_ctx));
  const auto all = s.decode(long_ref.tokens, /*all_logits=*/true);
  const double no_attn_factor = worst_against(long_ref, std::vector<float>(all.begin(), all.end()));
  std::printf("[ phi3-128k ] without rope.scaling.attn_factor: worst NMSE %.3g\n", no_attn_factor);
  EXPECT_GT(no_attn_factor, 1e-3);
}

// One LongRoPE tensor without the other is refused: llama.cpp would rotate with it at
// some contexts and without factors at others.
TEST(Families, Phi3LongRopeNeedsBothSets) {
  auto f = kiln::gguf::File::open(reference_model(case_named("phi3-128k-tiny-long")).path);
  kiln::gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  for (const kiln::gguf::TensorInfo& t : f->tensors())
    if (t.name != "rope_factors_short.weight")
      w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string path = temp_dir() + "/phi3-long-only.gguf";
  w.write(path);
  try {
    kiln::Model::load(path);
    ADD_FAILURE() << "loaded";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'rope_factors_long.weight' without 'rope_factors_short.weight'"), std::string::npos)
        << e.what();
  }
}

// An architecture kiln lacks is one line naming it and what kiln runs, exit code 1.
TEST(Families, UnsupportedArchitectureIsOneLine) {
  kiln::gguf::Writer w;
  w.set("general.architecture", kiln::gguf::Value::of_string("xyz"));
  const std::string path = temp_dir() + "/xyz.gguf";
  w.write(path);
  expect_one_line_error(run_command(shell_quote(kiln_binary()) + " run " + shell_quote(path) + " hi -n 1"), 1,
                        "unsupported architecture 'xyz' (supported: llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, phi3, mpt, gpt-oss, mamba2, granitehybrid, bert, nomic-bert)");
}

// A qwen2 file without its Q/K/V biases is refused rather than run as something else.
TEST(Families, Qwen2WithoutBiasesIsRefused) {
  kiln::gen::GenerateOptions o = reference_options(case_named("qwen2-tiny"));
  o.shape.biases = false;
  const std::string path = temp_dir() + "/qwen2-no-bias.gguf";
  // The vocabulary plays no part here: the 32000-token one is faster to build than Qwen's.
  kiln::gen::build_model(o, *kiln::gguf::File::open(shared_path("vocab/ggml-vocab-llama-spm.gguf"))).write(path);
  try {
    kiln::Model::load(path);
    ADD_FAILURE() << "loaded";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0 lacks attn_q/attn_k/attn_v bias"), std::string::npos) << e.what();
  }
}

// A vocabulary that a GGUF cannot carry as its source tokenizes is refused, not written
// with another tokenizer's behaviour: a byte-level split without a tokenizer.ggml.pre name,
// and SentencePiece-style BPE (a tokenizer.json without a byte-level split) whose merges
// are not the listing of every split that scores can restate (spm_scores.cpp).
TEST(Families, GeneratorRefusesVocabulariesAGgufCannotState) {
  const auto tokenizer = [](const std::string& merges, const std::string& rest) {
    const std::string path = temp_dir() + "/tokenizer.json";
    write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}, "merges": [)" +
                         merges + "]}, " + rest + "}");
    return kiln::Tokenizer::from_file(path);
  };
  const kiln::gen::GenerateOptions o = reference_options(case_named("qwen2-tiny"));
  const std::string all = R"("a b", "b c", "ab c", "a bc")";
  const std::tuple<std::string, std::string, std::string> cases[] = {
      {all, R"("normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "ByteLevel"})", "has no tokenizer.ggml.pre name"},
      {R"("a b", "b c", "ab c")", R"("pre_tokenizer": null)", "'a' + 'bc' makes token 5 but is not a merge"},
      {R"("a b", "ab c", "b c", "a bc")", R"("pre_tokenizer": null)", "the merges making 'abc' are not consecutive"},
  };
  for (const auto& [merges, rest, message] : cases) {
    try {
      kiln::gen::build_model(o, tokenizer(merges, rest)->vocab());
      ADD_FAILURE() << rest << ": built";
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // The same split without the normalizer is GPT-2's and is written; every split listed,
  // the SentencePiece-style vocabulary is written with scores and no merges.
  EXPECT_NO_THROW(kiln::gen::build_model(o, tokenizer(all, R"("pre_tokenizer": {"type": "ByteLevel"})")->vocab()));
  const std::string path = temp_dir() + "/spm-from-merges.gguf";
  kiln::gen::build_model(o, tokenizer(all, R"("pre_tokenizer": null)")->vocab()).write(path);
  const kiln::Vocab v = kiln::Vocab::from_gguf(*kiln::gguf::File::open(path));
  EXPECT_EQ(v.model, "llama");
  EXPECT_TRUE(v.merges.empty());
  EXPECT_EQ(v.scores, (std::vector<float>{-4, -4, -4, 0, -1, -2}));
}
