// granitehybrid (Granite 4.0-H) beyond the reference logits of families_test: a model whose
// layers are partly attention (a KV cache of those layers only) and partly Mamba-2 (a
// recurrent state), through the Session API: both continue across calls, a truncation cuts
// the cache and returns the state to its checkpoint together, forks and session files
// carry both; the multipliers each matter; malformed files, `kiln info`, and
// `kiln perplexity` against llama-perplexity (tests/data/families/README.md). Chat turns,
// speculative decoding and kiln serve's engine: tests/recurrent_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/session_file.h"
#include "model_gen/generate_model.h"
#include "sha256.h"
#include "perplexity_reference.h"
#include "recurrent_fixture.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::test;

namespace {

const char* kVocab = "vocab/ggml-vocab-gpt-neox.gguf";

// tests/data/families/README.md's granitehybrid-tiny (F32, peaky, output.weight, GPT-NeoX
// vocabulary): 5 layers, attention on 1 and 4, Mamba-2 on 0, 2, 3; experts with a shared one.
std::string write_model(const std::string& name, const gen::GenerateOptions& o) {
  const std::string p = temp_dir() + "/" + name + ".gguf";
  gen::build_model(o, *gguf::File::open(shared_path(kVocab))).write(p);
  return p;
}

const std::string& tiny_path() {
  static const std::string path = write_model("granitehybrid-tiny", gen::peaky_options("granitehybrid-tiny", 7));
  return path;
}

const Model& tiny() {
  static const std::unique_ptr<Model> m = Model::load(tiny_path());
  return *m;
}

SessionParams params(KvLayout layout = KvLayout::contiguous, int32_t n_batch = 512) { return recurrent_params(layout, n_batch); }
std::vector<int32_t> tokens(size_t n, int32_t seed = 1) { return spread_tokens(n, seed); }

std::vector<float> fresh(const std::vector<int32_t>& t, const Model& m = tiny()) {
  Session s(m, params());
  return copy(s.decode(t));
}

}  // namespace

TEST(GraniteHybrid, LayersAreMarkedAndBothKindsOfMemoryAreSized) {
  const ModelConfig& c = tiny().config();
  for (uint32_t l = 0; l < c.n_layers; ++l) EXPECT_EQ(c.is_ssm(l), l != 1 && l != 4) << "layer " << l;
  EXPECT_EQ(c.positions, Positions::none);
  EXPECT_EQ(c.shared_expert_ffn_dim, 64u);
  EXPECT_FLOAT_EQ(c.embed_scale, 12.0f);
  EXPECT_FLOAT_EQ(c.residual_scale, 0.22f);
  EXPECT_FLOAT_EQ(c.attn_scale, 0.5f);
  EXPECT_FLOAT_EQ(c.logit_scale, 3.0f);
  Session s(tiny(), params());
  // Two attention layers of 2 KV heads of 16, keys and values in f16, 128 positions.
  EXPECT_EQ(s.kv_cache_bytes(), 2.0 * 128 * 32 * 2 * 2);
  // Three Mamba-2 layers: conv (128 + 2 x 16 channels x 3 inputs) + scan (128 x 16).
  EXPECT_EQ(s.recurrent_state_bytes(), uint64_t(3 * (160 * 3 + 128 * 16) * 4));
}

TEST(GraniteHybrid, CacheAndStateAreCarriedAcrossCallsOnBothLayouts) {
  const std::vector<int32_t> a = tokens(9), b = tokens(5, 2);
  const std::vector<float> want = fresh(concat(a, b));
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
    SCOPED_TRACE(layout == KvLayout::paged ? "paged" : "contiguous");
    Session s(tiny(), params(layout, 4));  // batches of 4: prefill in pieces
    s.decode(a);
    expect_same(copy(s.decode(b)), want, "a then b in two calls vs one");
    Session t(tiny(), params(layout));
    std::vector<float> last;
    for (int32_t x : concat(a, b)) last = copy(t.decode(std::span(&x, 1)));
    expect_same(last, want, "token by token");
  }
  EXPECT_GT(max_diff(fresh(b), want), 1e-2) << "the history matters";
}

// Each of Granite's parts moves the logits: a file without the key (its default) gives
// other logits than the file with it, so the loader must read it and the forward pass use it.
TEST(GraniteHybrid, EachMultiplierMatters) {
  const std::vector<int32_t> t = tokens(12, 3);
  const std::vector<float> base = fresh(t);
  struct Off {
    const char* what;
    void (*edit)(gen::ModelShape&);
  };
  for (const Off& off : {Off{"embedding_scale", [](gen::ModelShape& s) { s.embedding_scale = 0; }},
                         Off{"residual_scale", [](gen::ModelShape& s) { s.residual_scale = 0; }},
                         Off{"attention.scale", [](gen::ModelShape& s) { s.attention_scale = 0; }},
                         Off{"logit_scale", [](gen::ModelShape& s) { s.logit_scale = 0; }},
                         Off{"shared expert", [](gen::ModelShape& s) { s.shared_expert_ffn_dim = 0; }},
                         Off{"rope", [](gen::ModelShape& s) { s.nope = false; }}}) {
    gen::GenerateOptions o = gen::peaky_options("granitehybrid-tiny", 7);
    off.edit(o.shape);
    const std::unique_ptr<Model> m = Model::load(write_model(std::string("granite-without-") + off.what, o));
    EXPECT_GT(max_diff(fresh(t, *m), base), 1e-3) << off.what;
  }
}

// A context shift moves the attention layers' keys (turned back when they rotate: here a
// RoPE variant) and leaves the state, which holds no positions; both layouts agree.
TEST(GraniteHybrid, ContextShiftMovesTheCacheAndKeepsTheState) {
  gen::GenerateOptions o = gen::peaky_options("granitehybrid-tiny", 7);
  o.shape.nope = false;
  const std::unique_ptr<Model> rope = Model::load(write_model("granitehybrid-tiny-rope", o));
  ASSERT_EQ(rope->config().positions, Positions::rope);
  const std::vector<int32_t> a = tokens(20), b = tokens(3, 5);
  std::vector<std::vector<float>> got;
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
    Session s(*rope, params(layout));
    s.decode(a);
    s.shift_context(2, 6);
    EXPECT_EQ(s.n_past(), 14);
    got.push_back(copy(s.decode(b)));
    EXPECT_TRUE(std::all_of(got.back().begin(), got.back().end(), [](float v) { return std::isfinite(v); }));
  }
  expect_same(got[1], got[0], "paged vs contiguous");
  EXPECT_GT(max_diff(got[0], fresh(concat(a, b), *rope)), 1e-3) << "six tokens fewer in the cache";
}

// A truncation keeps the attention layers' cache up to n and returns the Mamba-2 state to
// the checkpoint (taken after the prompt); both then continue as one fresh session would.
TEST(GraniteHybrid, TruncationCutsTheCacheAndReturnsTheStateTogether) {
  const std::vector<int32_t> prompt = tokens(12), reply = tokens(6, 3), other = tokens(4, 4);
  Session s(tiny(), params(KvLayout::paged));
  s.decode(prompt);
  s.checkpoint();
  for (int32_t t : reply) s.decode(std::span(&t, 1));
  s.truncate(15);
  EXPECT_EQ(s.n_past(), 12) << "back to the checkpoint, not to 15";
  const std::vector<int32_t> redo(reply.begin(), reply.begin() + 3);
  s.decode(redo);
  expect_same(copy(s.decode(other)), fresh(concat(concat(prompt, redo), other)), "after the checkpoint");
  s.truncate(5);
  EXPECT_EQ(s.n_past(), 0) << "before the checkpoint: recomputed from scratch";
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 5);
  s.decode(head);
  expect_same(copy(s.decode(other)), fresh(concat(head, other)), "from scratch");
}

TEST(GraniteHybrid, ForksAndMixedBatchesCarryEachSequencesCacheAndState) {
  const std::vector<int32_t> prefix = tokens(10), x = tokens(4, 6), y = tokens(7, 7);
  Session s(tiny(), params(KvLayout::paged));
  s.decode(prefix);
  const int32_t f = s.fork_sequence(0);
  const int32_t n = s.add_sequence();
  const Session::BatchPart parts[] = {{0, x}, {f, y}, {n, y}};
  const std::vector<float> all = copy(s.decode_batch(parts));
  const size_t V = tiny().config().n_vocab;
  expect_same({all.begin(), all.begin() + V}, fresh(concat(prefix, x)), "sequence 0");
  expect_same({all.begin() + V, all.begin() + 2 * V}, fresh(concat(prefix, y)), "the fork");
  expect_same({all.begin() + 2 * V, all.end()}, fresh(y), "a new sequence starts empty");
}

TEST(GraniteHybrid, SessionFileSavesAndRestoresCacheAndState) {
  const std::vector<int32_t> a = tokens(11), b = tokens(5, 8);
  Session s(tiny(), params(KvLayout::paged));
  s.decode(a);
  const std::string path = temp_dir() + "/granitehybrid.session";
  save_session_file(path, s, a, "app");
  // Header, tokens, app data, 2 cache layers of 11 f16 key and value rows of 32, the state.
  EXPECT_EQ(read_file(path).size(), 96 + a.size() * 4 + 3 + 2 * a.size() * 2 * 64 + s.recurrent_state_bytes());
  const std::vector<float> want = copy(s.decode(b));
  Session t(tiny(), params(KvLayout::contiguous));  // saved paged, loaded contiguous
  const LoadedSession loaded = load_session_file(path, t);
  EXPECT_EQ(loaded.tokens, a);
  EXPECT_EQ(t.n_past(), int32_t(a.size()));
  expect_same(copy(t.decode(b)), want, "restored");
}

TEST(GraniteHybrid, InfoShowsTheLayoutTheStateAndTheExperts) {
  const auto r = run_command(shell_quote(kiln_binary()) + " info " + shell_quote(tiny_path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"architecture: granitehybrid", "mixers:       attention on 1, 4; Mamba-2 on 0, 2-3",
                           "ssm:          Mamba-2 on 3 of 5 layers: d_inner 128, d_state 16, 8 heads of 16, 1 group, conv 4",
                           "positions:    none (NoPE attention)",
                           "mixture of 8 experts (2 used per token, width 32, weights renormalized) + a shared expert of width 64",
                           "embeddings x12, residual x0.22, logits /3, query scale 0.5",
                           "recurrent state 29.62 KiB per sequence"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
  EXPECT_EQ(r.out.find("ignored:"), std::string::npos) << r.out;
}

// llama-perplexity on the reference file and on llama-quantize's Q8_0 and Q4_0 of it, which
// `kiln quantize` must reproduce tensor for tensor (granitehybrid.llama-perplexity.txt).
// F32 agrees to 0.05% (seen 6e-9); quantized within 0.1% (seen 2.2e-5).
TEST(GraniteHybrid, PerplexityMatchesLlamaPerplexityInF32AndQuantized) {
  expect_perplexities_match("granitehybrid.llama-perplexity.txt", "granitehybrid-tiny", tiny_path(), 3);
}

// kiln chat --session through the binary: the second run resumes cache and state (only its
// new tokens evaluated) and answers exactly as one run holding both turns.
TEST(GraniteHybrid, ChatSessionFileResumes) {
  const std::string file = temp_dir() + "/granitehybrid-chat.kiln";
  const std::string chat = shell_quote(kiln_binary()) + " chat " + shell_quote(tiny_path()) + " -n 8 --temp 0 -t 2";
  const auto first = run_command(chat + " --verbose --session " + shell_quote(file), "Once upon a time\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto second = run_command(chat + " --verbose --session " + shell_quote(file), "The dog ran\n");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("(resumed "), std::string::npos) << second.err;
  const auto together = run_command(chat, "Once upon a time\nThe dog ran\n");
  ASSERT_EQ(together.exit_code, 0) << together.err;
  EXPECT_EQ(first.out + second.out, together.out);
}
