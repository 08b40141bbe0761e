// Mamba-2 beyond the reference logits of families_test: the recurrent state through the
// Session API (it continues across calls, a truncation goes back to a checkpoint or
// recomputes, forks carry it, session files save and restore it, context shifts and
// eviction leave it alone), malformed files, `kiln info`, and `kiln perplexity` against
// llama-perplexity on the reference file (tests/data/families/README.md). Chat turns,
// speculative decoding and kiln serve's engine: tests/recurrent_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// tests/data/families/README.md's mamba2-tiny (F32, peaky, tied, GPT-NeoX vocabulary).
const std::string& tiny_path() {
  static const std::string path = [] {
    const std::string p = temp_dir() + "/mamba2-tiny.gguf";
    gen::build_model(gen::peaky_options("mamba2-tiny", 7, true), *gguf::File::open(shared_path("vocab/ggml-vocab-gpt-neox.gguf")))
        .write(p);
    return p;
  }();
  return path;
}

const Model& tiny() {
  static const std::unique_ptr<Model> m = Model::load(tiny_path());
  return *m;
}

SessionParams params(KvLayout layout = KvLayout::contiguous, int32_t n_batch = 512) { return recurrent_params(layout, n_batch); }
std::vector<int32_t> tokens(size_t n, int32_t seed = 1) { return spread_tokens(n, seed); }

// The logits of the last of `t` in a fresh session: what any continuation must equal.
std::vector<float> fresh(const std::vector<int32_t>& t) {
  Session s(tiny(), params());
  return copy(s.decode(t));
}

}  // namespace

TEST(Mamba2, StateIsCarriedAcrossCallsAndMatters) {
  const std::vector<int32_t> a = tokens(9), b = tokens(5, 2);
  Session s(tiny(), params());
  s.decode(a);
  const std::vector<float> continued = copy(s.decode(b));
  expect_same(continued, fresh(concat(a, b)), "a then b in two calls vs one");
  // Without the state the same tokens give other logits: the state is what carries a.
  const std::vector<float> alone = fresh(b);
  double diff = 0;
  for (size_t i = 0; i < alone.size(); ++i) diff = std::max(diff, double(std::fabs(alone[i] - continued[i])));
  EXPECT_GT(diff, 1e-2);
  EXPECT_EQ(s.kv_cache_bytes(), 0.0) << "no layer attends: no KV cache";
  // conv (192 channels x 3 inputs) + scan (8 heads x 16 x 16) floats, per layer, 3 layers.
  EXPECT_EQ(s.recurrent_state_bytes(), uint64_t(3 * (192 * 3 + 8 * 16 * 16) * 4));
}

// A chat turn re-rendering part of the reply: the state cannot be cut back, so the
// session returns to the checkpoint taken after the prompt and the caller runs the rest
// again; before the checkpoint, everything is forgotten.
TEST(Mamba2, TruncationGoesBackToTheCheckpointOrToNothing) {
  const std::vector<int32_t> prompt = tokens(12), reply = tokens(6, 3), other = tokens(4, 4);
  Session s(tiny(), params());
  s.decode(prompt);
  s.checkpoint();  // as Generator does after a prompt
  for (int32_t t : reply) s.decode(std::span(&t, 1));
  ASSERT_EQ(s.n_past(), 18);
  s.truncate(15);
  EXPECT_EQ(s.n_past(), 12) << "back to the checkpoint at the end of the prompt, not to 15";
  const std::vector<int32_t> redo(reply.begin(), reply.begin() + 3);
  s.decode(redo);
  expect_same(copy(s.decode(other)), fresh(concat(concat(prompt, redo), other)), "after the checkpoint");
  s.truncate(5);
  EXPECT_EQ(s.n_past(), 0) << "before the checkpoint: recomputed from scratch";
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 5);
  s.decode(head);
  expect_same(copy(s.decode(other)), fresh(concat(head, other)), "from scratch");
  s.truncate(s.n_past());  // to its own end: nothing is lost
  EXPECT_EQ(s.n_past(), 9);
}

TEST(Mamba2, ContextShiftAndEvictionLeaveTheStateAlone) {
  const std::vector<int32_t> a = tokens(20), b = tokens(3, 5);
  const std::vector<float> want = fresh(concat(a, b));  // no positions: nothing to move
  for (bool evict : {false, true}) {
    Session s(tiny(), params());
    s.decode(a);
    if (evict) s.evict(std::vector<int32_t>{3, 4, 10});
    else s.shift_context(2, 6);
    EXPECT_EQ(s.n_past(), evict ? 17 : 14);
    expect_same(copy(s.decode(b)), want, evict ? "evict" : "shift");
  }
}

TEST(Mamba2, ForksAndMixedBatchesCarryEachSequencesState) {
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
  expect_same({all.begin() + 2 * V, all.end()}, fresh(y), "a new sequence starts at zero");
}

TEST(Mamba2, SessionFileSavesAndRestoresTheState) {
  const std::vector<int32_t> a = tokens(11), b = tokens(5, 8);
  Session s(tiny(), params());
  s.decode(a);
  const std::string path = temp_dir() + "/mamba2.session";
  save_session_file(path, s, a, "app");
  const uint64_t state = s.recurrent_state_bytes();
  EXPECT_EQ(read_file(path).size(), 96 + a.size() * 4 + 3 + state) << "header, tokens, app data, the state";
  const std::vector<float> want = copy(s.decode(b));
  Session t(tiny(), params(KvLayout::paged));
  const LoadedSession loaded = load_session_file(path, t);
  EXPECT_EQ(loaded.tokens, a);
  EXPECT_EQ(t.n_past(), int32_t(a.size()));
  expect_same(copy(t.decode(b)), want, "restored");
  // A damaged state byte is caught by the checksum and leaves the session as it was.
  std::string bytes = read_file(path);
  bytes[bytes.size() - 100] ^= 0x40;
  write_file(path, bytes);
  Session u(tiny(), params());
  try {
    load_session_file(path, u);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(u.n_past(), 0);
}

namespace {

// A copy of the tiny file with one key or tensor changed (or dropped).
std::string edited(const std::string& name, const std::string& drop_key, const std::string& drop_tensor,
                   const std::string& set_key = "", uint32_t set_value = 0, const std::string& reshape = "") {
  auto f = gguf::File::open(tiny_path());
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata())
    if (k != drop_key) w.set(k, v);
  if (!set_key.empty()) w.set(set_key, gguf::Value::of_u32(set_value));
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (t.name == drop_tensor) continue;
    std::vector<uint64_t> dims = t.dims;
    if (t.name == reshape) std::swap(dims[0], dims[1]);
    w.add_tensor(t.name, t.type, dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  const std::string path = temp_dir() + "/" + name + ".gguf";
  w.write(path);
  return path;
}

void expect_refused(const std::string& path, const std::string& fragment) {
  try {
    Model::load(path);
    ADD_FAILURE() << path << " loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Mamba2, MalformedFilesNameTheKeyOrTensor) {
  expect_refused(edited("no-state", "mamba2.ssm.state_size", ""), "mamba2.ssm.state_size");
  expect_refused(edited("bad-groups", "", "", "mamba2.ssm.group_count", 3),
                 "mamba2.ssm.group_count is 3, expected a divisor of ssm.time_step_rank 8");
  expect_refused(edited("bad-heads", "", "", "mamba2.ssm.time_step_rank", 7), "mamba2.ssm.time_step_rank is 7");
  expect_refused(edited("bad-conv", "", "", "mamba2.ssm.conv_kernel", 0), "mamba2.ssm.conv_kernel is 0");
  expect_refused(edited("attn", "", "", "mamba2.attention.head_count", 4), "mamba2.attention.head_count is 4");
  expect_refused(edited("no-a", "", "blk.1.ssm_a"), "missing tensor 'blk.1.ssm_a'");
  expect_refused(edited("no-norm", "", "blk.2.ssm_norm.weight"), "missing tensor 'blk.2.ssm_norm.weight'");
  expect_refused(edited("conv-shape", "", "", "", 0, "blk.0.ssm_conv1d.weight"), "tensor 'blk.0.ssm_conv1d.weight' has shape");
  expect_refused(edited("in-shape", "", "", "", 0, "blk.0.ssm_in.weight"), "tensor 'blk.0.ssm_in.weight' has shape");
}

TEST(Mamba2, InfoShowsTheMixerAndTheStatePerSequence) {
  const auto r = run_command(shell_quote(kiln_binary()) + " info " + shell_quote(tiny_path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"architecture: mamba2", "ssm:          Mamba-2 on 3 of 3 layers: d_inner 128, d_state 16, 8 heads of 16, 2 groups, conv 4",
                           "ffn:          none", "recurrent state 30.75 KiB per sequence, no KV cache"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
  EXPECT_EQ(r.out.find("ignored:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rope:"), std::string::npos) << r.out;
}

// llama-perplexity on the same file and on llama-quantize's Q8_0 and Q4_0 of it, which
// `kiln quantize` must reproduce tensor for tensor (tests/data/families/mamba2.llama-perplexity.txt).
// F32 agrees to 0.05% (seen 3.6e-8); quantized within 0.1% (seen 0.006%).
TEST(Mamba2, PerplexityMatchesLlamaPerplexityInF32AndQuantized) {
  expect_perplexities_match("mamba2.llama-perplexity.txt", "mamba2-tiny", tiny_path(), 3);
}

// kiln chat --session through the binary: the second run resumes the saved state (only its
// new tokens evaluated) and answers exactly as one run holding both turns.
TEST(Mamba2, ChatSessionFileResumesTheState) {
  const std::string file = temp_dir() + "/mamba2-chat.kiln";
  const std::string chat = shell_quote(kiln_binary()) + " chat " + shell_quote(tiny_path()) + " -n 8 --temp 0 -t 2";
  const auto first = run_command(chat + " --verbose --session " + shell_quote(file), "Once upon a time\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto second = run_command(chat + " --verbose --session " + shell_quote(file), "The dog ran\n");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("(resumed "), std::string::npos) << second.err;
  int evaluated = 0, reused = 0;
  const size_t at = second.err.find("[prompt: ");
  ASSERT_NE(at, std::string::npos) << second.err;
  ASSERT_EQ(std::sscanf(second.err.c_str() + at, "[prompt: %d tokens evaluated, %d reused", &evaluated, &reused), 2);
  EXPECT_GT(reused, 8) << "the first turn's state was reused, not recomputed";
  EXPECT_LT(evaluated, reused);
  const auto together = run_command(chat, "Once upon a time\nThe dog ran\n");
  ASSERT_EQ(together.exit_code, 0) << together.err;
  EXPECT_EQ(first.out + second.out, together.out);
}
