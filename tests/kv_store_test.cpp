// One KV interface under every feature (runtime/kv_store.h): truncation, context shifts,
// eviction, attention scores, saved state and several sequences behave the same on the
// contiguous and the paged layout, bit for bit (the same rows, the same arithmetic), and
// the paged layout's shared blocks are copied before any edit writes into them.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/error.h"
#include "kiln/generator.h"
#include "kiln/model.h"
#include "kiln/eviction_policy.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "model_gen/generate_model.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::long_tokens;
using test::stories;

SessionParams params(KvLayout layout, TensorType t = TensorType::F16, FlashAttention fa = FlashAttention::automatic,
                     int32_t n_ctx = 512) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  p.kv_type_k = p.kv_type_v = t;
  p.flash_attn = fa;
  p.kv_layout = layout;
  p.kv_block = 16;
  return p;
}

std::span<const int32_t> tokens(size_t from, size_t n) { return {long_tokens().data() + from, n}; }

std::vector<float> decode_all(Session& s, std::span<const int32_t> t) {
  const auto l = s.decode(t, true);
  return {l.begin(), l.end()};
}

std::vector<uint8_t> state(const Session& s) {
  std::vector<uint8_t> out;
  s.write_kv_state([&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); });
  return out;
}

const char* name(KvLayout l) { return l == KvLayout::paged ? "paged" : "contiguous"; }

class KvLayouts : public ::testing::TestWithParam<KvLayout> {};

// Speculative decoding's rejected drafts and /clear: tokens decoded then truncated away
// leave no trace. 100 positions end inside a paged block (16), so the truncation keeps
// part of a block the rejected tokens wrote into.
TEST_P(KvLayouts, TruncatedTokensLeaveNoTrace) {
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Session clean(stories(), params(GetParam(), TensorType::F16, fa));
    clean.decode(tokens(0, 100));
    const auto want = decode_all(clean, tokens(100, 20));

    Session s(stories(), params(GetParam(), TensorType::F16, fa));
    s.decode(tokens(0, 100));
    s.decode(tokens(300, 7));  // the rejected draft
    s.truncate(100);
    EXPECT_EQ(s.n_past(), 100);
    EXPECT_TRUE(decode_all(s, tokens(100, 20)) == want) << "flash " << int(fa);
    s.truncate_sequence(0, 50);
    EXPECT_EQ(s.n_past(), 50);
  }
}

// A session file's state: each layout restores its own, and continues bit for bit.
TEST_P(KvLayouts, SavedStateRoundTrips) {
  Session a(stories(), params(GetParam()));
  a.decode(tokens(0, 150));
  const std::vector<uint8_t> saved = state(a);
  const KvStateDesc desc = a.kv_state_desc(a.n_past());
  ASSERT_EQ(saved.size(), desc.bytes());
  const auto want = decode_all(a, tokens(150, 30));

  Session b(stories(), params(GetParam()));
  b.decode(tokens(400, 20));  // something to replace
  b.read_kv_state(desc, saved);
  EXPECT_EQ(b.n_past(), 150);
  EXPECT_EQ(state(b), saved);
  EXPECT_TRUE(decode_all(b, tokens(150, 30)) == want);
}

INSTANTIATE_TEST_SUITE_P(Kv, KvLayouts, ::testing::Values(KvLayout::contiguous, KvLayout::paged),
                         [](const auto& info) { return std::string(name(info.param)); });

// The saved bytes do not depend on the layout: a file saved by one loads in the other.
TEST(KvLayoutsAgree, SavedStateIsTheSameBytesAndLoadsAcross) {
  for (TensorType t : {TensorType::F16, TensorType::Q8_0}) {
    Session contiguous(stories(), params(KvLayout::contiguous, t));
    Session paged(stories(), params(KvLayout::paged, t));
    contiguous.decode(tokens(0, 77));
    paged.decode(tokens(0, 77));
    const std::vector<uint8_t> bytes = state(contiguous);
    EXPECT_EQ(state(paged), bytes) << type_name(t);
    EXPECT_EQ(paged.kv_state_desc(77), contiguous.kv_state_desc(77));

    Session back(stories(), params(KvLayout::contiguous, t));
    back.read_kv_state(paged.kv_state_desc(77), state(paged));
    Session forth(stories(), params(KvLayout::paged, t));
    forth.read_kv_state(contiguous.kv_state_desc(77), bytes);
    const auto want = decode_all(contiguous, tokens(77, 10));
    EXPECT_TRUE(decode_all(back, tokens(77, 10)) == want) << type_name(t);
    EXPECT_TRUE(decode_all(forth, tokens(77, 10)) == want) << type_name(t);
  }
}

// Context shift and eviction move rows and turn their keys back: the same rows and the
// same turn-back on both layouts give the same logits afterwards.
TEST(KvLayoutsAgree, ShiftEvictAndScoresGiveTheSameBits) {
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    std::vector<float> logits[2], scores[2];
    for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
      Session s(stories(), params(layout, TensorType::F16, fa));
      std::vector<float>& out = logits[int(layout)];
      s.track_attention(true);
      s.decode(tokens(0, 200));
      s.shift_context(5, 90);  // 110 left
      EXPECT_EQ(s.n_past(), 110);
      auto l = decode_all(s, tokens(200, 20));
      out.insert(out.end(), l.begin(), l.end());
      const std::vector<int32_t> evicted{1, 2, 17, 40, 41, 42, 100, 129};
      s.evict(evicted);
      EXPECT_EQ(s.n_past(), 122);
      l = decode_all(s, tokens(220, 20));
      out.insert(out.end(), l.begin(), l.end());
      const auto sc = s.attention_scores();
      scores[int(layout)].assign(sc.begin(), sc.end());
    }
    EXPECT_EQ(logits[1].size(), logits[0].size());
    EXPECT_TRUE(logits[1] == logits[0]) << "flash " << int(fa);
    EXPECT_EQ(scores[1].size(), 142u);
    EXPECT_TRUE(scores[1] == scores[0]) << "flash " << int(fa);
  }
}

// Generated family models (random weights, real code paths): GQA with per-head Q/K norms
// (qwen3) and ALiBi with no RoPE to turn back (mpt); the same edits as above.
TEST(KvLayoutsAgree, FamiliesShiftAndEvictTheSame) {
  for (const char* shape : {"qwen3-tiny", "mpt-tiny"}) {
    const gen::GenerateOptions o = gen::peaky_options(shape, 7);
    const std::string path = test::temp_dir() + "/" + shape + ".gguf";
    gen::build_model(o, *gguf::File::open(test::shared_path("models/stories260K.gguf"))).write(path);
    const auto model = Model::load(path);
    std::vector<float> logits[2];
    for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
      SessionParams p = params(layout, TensorType::F16, FlashAttention::automatic, 256);
      Session s(*model, p);
      s.decode(tokens(0, 150));
      s.shift_context(3, 60);
      const std::vector<int32_t> evicted{0, 10, 11, 50};
      s.evict(evicted);
      const auto l = s.decode(tokens(150, 40), true);
      logits[int(layout)].assign(l.begin(), l.end());
    }
    EXPECT_TRUE(logits[1] == logits[0]) << shape;
  }
}

std::string generate(KvLayout layout, KvEviction policy, int32_t n) {
  SessionParams p = params(layout, TensorType::F16, FlashAttention::automatic, 64);
  test::GreedyRig rig(p);
  rig.generator.set_ignore_eos(true);
  KvEvictionParams e;
  e.policy = policy;
  rig.generator.set_kv_eviction(e);
  std::string text;
  const GenerationStats st = rig.generator.generate(stories().tokenizer().encode("Once upon a time", true), n,
                                                    [&](std::string_view t) { text += t; });
  EXPECT_GT(st.n_discarded, 0) << kv_eviction_name(policy);
  return text;
}

// --kv-evict shift|sink|h2o: 300 tokens through a context of 64, the same greedy text.
TEST(KvLayoutsAgree, EvictionPoliciesGiveTheSameText) {
  for (KvEviction policy : {KvEviction::shift, KvEviction::sink, KvEviction::h2o}) {
    const std::string want = generate(KvLayout::contiguous, policy, 300);
    EXPECT_EQ(generate(KvLayout::paged, policy, 300), want) << kv_eviction_name(policy);
  }
}

// Copy-on-write under edits: a fork shares the prompt's blocks; truncating it inside a
// shared block and evicting from sequence 0 leave the other's rows as they were. Each
// sequence's next logits equal a fresh contiguous session holding its tokens.
TEST(PagedKvEdits, ForkTruncateAndEvictCopySharedBlocks) {
  Session s(stories(), params(KvLayout::paged));
  s.decode(tokens(0, 40));  // blocks 0, 1 full, 2 partly
  const int32_t seq0 = 0, fork = s.fork_sequence(0);
  s.truncate_sequence(fork, 35);  // inside shared block 2
  // One sequence per call: a batch of one row is a plain decode's arithmetic.
  const int32_t next[2] = {long_tokens()[40], long_tokens()[300]};
  const auto as_vector = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  const std::vector<float> got1 = as_vector(s.decode_parallel(std::span(&fork, 1), std::span(&next[1], 1)));
  const std::vector<float> got0 = as_vector(s.decode_parallel(std::span(&seq0, 1), std::span(&next[0], 1)));
  Session fresh0(stories(), params(KvLayout::contiguous));
  fresh0.decode(tokens(0, 40));
  const auto f0 = fresh0.decode(std::span(&next[0], 1));
  EXPECT_TRUE(got0 == std::vector<float>(f0.begin(), f0.end()));
  Session fresh1(stories(), params(KvLayout::contiguous));
  fresh1.decode(tokens(0, 35));
  const auto f1 = fresh1.decode(std::span(&next[1], 1));
  EXPECT_TRUE(got1 == std::vector<float>(f1.begin(), f1.end()));

  // Evicting from sequence 0 (41 positions) while the fork still shares blocks 0 and 1.
  const std::vector<int32_t> evicted{3, 20};
  s.evict(evicted);
  EXPECT_EQ(s.n_past(0), 39);
  fresh0.evict(evicted);
  const int32_t one[1] = {fork}, t1[1] = {long_tokens()[301]};
  const auto after = s.decode_parallel(one, t1);
  const auto f1b = fresh1.decode(std::span(&t1[0], 1));
  EXPECT_TRUE(std::vector<float>(after.begin(), after.end()) == std::vector<float>(f1b.begin(), f1b.end()))
      << "the fork saw sequence 0's eviction";
  const auto own = s.decode(tokens(41, 5));
  const auto f0b = fresh0.decode(tokens(41, 5));
  EXPECT_TRUE(std::vector<float>(own.begin(), own.end()) == std::vector<float>(f0b.begin(), f0b.end()));
  s.free_sequence(fork);
  EXPECT_EQ(s.kv_memory().blocks_used, 3);  // 44 positions
}

// Speculative decoding on a fork: a draft of 6 tokens verified in one batch, 4 rejected
// and truncated, then decoding goes on; sequence 0, which shares the prefix, is untouched.
TEST(PagedKvEdits, DraftVerifiedAndRejectedOnAFork) {
  Session s(stories(), params(KvLayout::paged));
  s.decode(tokens(0, 60));
  const int32_t fork = s.fork_sequence(0);
  const auto verify = s.decode_sequence(fork, tokens(200, 6), true);
  EXPECT_EQ(verify.size(), 6 * size_t(stories().config().n_vocab));
  s.truncate_sequence(fork, 62);  // 2 of the draft accepted
  const auto as_vector = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  const std::vector<float> got = as_vector(s.decode_sequence(fork, tokens(300, 3), true));
  const std::vector<float> own = as_vector(s.decode(tokens(60, 3), true));

  Session fresh(stories(), params(KvLayout::contiguous));
  fresh.decode(tokens(0, 60));
  fresh.decode(tokens(200, 2));
  EXPECT_TRUE(got == as_vector(fresh.decode(tokens(300, 3), true)));
  fresh.truncate(60);
  EXPECT_TRUE(own == as_vector(fresh.decode(tokens(60, 3), true)));
  EXPECT_EQ(s.n_past(fork), 65);
  EXPECT_EQ(s.n_past(0), 63);
}

// --parallel N --chat: the rendered user message sampled N times.
TEST(KvLayoutsCli, ParallelChatPrintsEachAnswer) {
  const std::string model = test::shell_quote(test::shared_path("models/stories260K.gguf"));
  const auto one = test::run_command(test::kiln_binary() + " run " + model + " -p 'The dog' --chat -n 20 --temp 0");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto two = test::run_command(test::kiln_binary() + " run " + model + " -p 'The dog' --chat -n 20 --temp 0 -np 2 -s 3");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const std::string want = "--- sequence 0 (seed 3) ---\n" + one.out + "\n--- sequence 1 (seed 4) ---\n" + one.out;
  EXPECT_EQ(two.out, want);
}

// --kv-evict and --context-shift on the paged layout: the contiguous layout's text.
TEST(KvLayoutsCli, EvictionRunsOnThePagedLayout) {
  const std::string cmd = test::kiln_binary() + " run " + test::shell_quote(test::shared_path("models/stories260K.gguf")) +
                          " -p 'Once upon a time' -n 200 -c 64 --temp 0 --ignore-eos ";
  for (const std::string flags : {"--context-shift", "--kv-evict sink", "--kv-evict h2o"}) {
    const auto want = test::run_command(cmd + flags);
    ASSERT_EQ(want.exit_code, 0) << want.err;
    const auto got = test::run_command(cmd + flags + " --kv-layout paged");
    ASSERT_EQ(got.exit_code, 0) << got.err;
    EXPECT_EQ(got.out, want.out) << flags;
  }
}

// kiln chat --session on the paged layout: the second run resumes the first one's cache
// and answers as one run holding both turns; the file also resumes on the other layout.
TEST(KvLayoutsCli, ChatSessionResumesOnThePagedLayout) {
  const std::string file = test::temp_dir() + "/paged.kiln";
  const std::string chat = test::kiln_binary() + " chat " + test::shell_quote(test::shared_path("models/stories260K.gguf")) +
                           " -n 16 --temp 0 --verbose";
  const std::string args = chat + " --kv-layout paged --session " + test::shell_quote(file);
  const auto first = test::run_command(args, "Once upon a time\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto second = test::run_command(args, "The dog ran\n");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("(resumed "), std::string::npos) << second.err;
  const auto together = test::run_command(chat, "Once upon a time\nThe dog ran\n");
  ASSERT_EQ(together.exit_code, 0) << together.err;
  EXPECT_EQ(first.out + second.out, together.out);
  const auto third = test::run_command(chat + " --session " + test::shell_quote(file), "/stats\n");
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.err.find("(resumed "), std::string::npos) << third.err;
}

}  // namespace
}  // namespace kiln
