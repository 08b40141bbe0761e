// KV-cache eviction: Session::evict compacts the cache (keys turned back by RoPE by the
// distance each moved), StreamingLLM sinks and H2O heavy hitters keep generation going
// for many times the context in the same memory, and nothing changes when it is off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/generator.h"
#include "kiln/eviction_policy.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::stories;

SessionParams params(int32_t n_ctx, TensorType cache = TensorType::F32, int32_t threads = 2,
                     FlashAttention fa = FlashAttention::automatic) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = threads;
  p.kv_type_k = p.kv_type_v = cache;
  p.flash_attn = fa;
  return p;
}

std::vector<uint8_t> state(const Session& s) {
  std::vector<uint8_t> out;
  s.write_kv_state([&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); });
  return out;
}

std::vector<int32_t> story_tokens() {
  return stories().tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. "
      "One day, she saw a big red ball under a tree.",
      true);
}

double as_double(const std::vector<uint8_t>& v, size_t i, TensorType t) {
  if (t == TensorType::F32) {
    float x;
    std::memcpy(&x, &v[4 * i], 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, &v[2 * i], 2);
  return fp16_to_f32(h);
}

// Layer 0's keys depend only on the token and its position: after evicting scattered
// positions, every moved key (moved by different distances) must equal the key of a
// session that saw the kept tokens at their new positions; values are the same bytes.
void expect_layer0_like_fresh(TensorType cache, FlashAttention fa, double tolerance) {
  const std::vector<int32_t> tokens = story_tokens();
  ASSERT_GT(tokens.size(), 30u);
  const std::vector<int32_t> evicted = {2, 5, 6, 11, 12, 13, 20};
  Session evicting(stories(), params(64, cache, 2, fa));
  evicting.decode(tokens);
  evicting.evict(evicted);
  ASSERT_EQ(evicting.n_past(), int32_t(tokens.size() - evicted.size()));

  std::vector<int32_t> kept;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (std::find(evicted.begin(), evicted.end(), int32_t(i)) == evicted.end()) kept.push_back(tokens[i]);
  Session fresh(stories(), params(64, cache, 2, fa));
  fresh.decode(kept);
  ASSERT_EQ(evicting.flash_attn(), fa == FlashAttention::on);

  const std::vector<uint8_t> a = state(evicting), b = state(fresh);
  ASSERT_EQ(a.size(), b.size());
  const size_t kv_dim = fresh.kv_state_desc(fresh.n_past()).kv_dim, n = size_t(fresh.n_past());
  const size_t elem = cache == TensorType::F32 ? 4 : 2;
  double worst = 0;
  for (size_t row = 0; row < n; ++row) {
    double scale = 0, err = 0;
    for (size_t i = row * kv_dim; i < (row + 1) * kv_dim; ++i) {
      scale = std::max(scale, std::fabs(as_double(b, i, cache)));
      err = std::max(err, std::fabs(as_double(a, i, cache) - as_double(b, i, cache)));
    }
    worst = std::max(worst, err / scale);
  }
  EXPECT_LT(worst, tolerance) << "keys turned back by RoPE differ from keys computed at those positions";
  EXPECT_GT(worst, 0.0) << "the moved rows were not rotated at all?";
  const size_t key_bytes = n * kv_dim * elem;  // layer 0's keys, then its values
  EXPECT_TRUE(std::equal(a.begin() + key_bytes, a.begin() + 2 * key_bytes, b.begin() + key_bytes))
      << "layer 0's values moved wrongly";
}

TEST(KvEvict, CompactionMatchesFreshF32) { expect_layer0_like_fresh(TensorType::F32, FlashAttention::off, 1e-5); }
TEST(KvEvict, CompactionMatchesFreshF16) { expect_layer0_like_fresh(TensorType::F16, FlashAttention::off, 2e-3); }
// Values by position (tiled attention) move as whole rows instead of per dimension.
TEST(KvEvict, CompactionMatchesFreshValuesByPosition) {
  expect_layer0_like_fresh(TensorType::F32, FlashAttention::on, 1e-5);
}

// A contiguous eviction is a context shift: the same bytes in every layer.
TEST(KvEvict, ContiguousEvictionIsAShift) {
  const std::vector<int32_t> tokens = story_tokens();
  Session shifted(stories(), params(64, TensorType::F16)), evicted(stories(), params(64, TensorType::F16));
  shifted.decode(tokens);
  evicted.decode(tokens);
  shifted.shift_context(4, 9);
  std::vector<int32_t> range(9);
  std::iota(range.begin(), range.end(), 4);
  evicted.evict(range);
  EXPECT_EQ(state(shifted), state(evicted));
  // And both go on the same way.
  const std::vector<int32_t> next = {tokens[5]};
  const auto a = shifted.decode(next);
  const std::vector<float> la(a.begin(), a.end());
  const auto b = evicted.decode(next);
  EXPECT_TRUE(std::equal(la.begin(), la.end(), b.begin()));
}

TEST(KvEvict, RefusesBadPositions) {
  Session s(stories(), params(64));
  const std::vector<int32_t> t = story_tokens();
  s.decode(t);
  const int32_t n = s.n_past();
  EXPECT_THROW(s.evict(std::vector<int32_t>{3, 2}), Error);
  EXPECT_THROW(s.evict(std::vector<int32_t>{2, 2}), Error);
  EXPECT_THROW(s.evict(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(s.evict(std::vector<int32_t>{1, n}), Error);
  EXPECT_EQ(s.n_past(), n);
  s.evict({});
  EXPECT_EQ(s.n_past(), n);
}

// Text the model finds predictable: perplexity of `text` (after `prompt`) under a session
// whose context holds all of it, scored from position `from` on.
double judged_perplexity(const std::string& prompt, const std::string& text, size_t from) {
  const std::vector<int32_t> all = stories().tokenizer().encode(prompt + text, true);
  EXPECT_GT(all.size(), from + 100);
  Session judge(stories(), params(int32_t(all.size()) + 1));
  const auto logits = judge.decode(all, true);
  const size_t n_vocab = stories().config().n_vocab;
  double nll = 0;
  size_t scored = 0;
  for (size_t pos = from; pos + 1 < all.size(); ++pos, ++scored) {
    const float* row = &logits[pos * n_vocab];
    const double mx = *std::max_element(row, row + n_vocab);
    double sum = 0;
    for (size_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - mx);
    nll += std::log(sum) + mx - row[all[pos + 1]];
  }
  return std::exp(nll / double(scored));
}

struct LongRun {
  std::string text;
  GenerationStats stats;
};

LongRun generate_long(Session& session, const KvEvictionParams& p, int32_t n) {
  SamplerParams sp;
  sp.temperature = 0;
  Sampler sampler(sp, stories().config().n_vocab);
  Generator generator(session, stories().tokenizer(), sampler);
  generator.set_ignore_eos(true);
  generator.set_kv_eviction(p);
  LongRun r;
  r.stats = generator.generate(stories().tokenizer().encode("Once upon a time", true), n,
                               [&](std::string_view t) { r.text += t; });
  return r;
}

// 10x the context: 640 tokens through a cache of 64, in the memory allocated at the start,
// and the text stays English (its perplexity under a full-context judge stays low).
void expect_runs_ten_contexts(KvEviction policy) {
  Session session(stories(), params(64, TensorType::F16));
  const double bytes = session.kv_cache_bytes();
  KvEvictionParams p;
  p.policy = policy;
  const LongRun r = generate_long(session, p, 660);
  EXPECT_EQ(r.stats.n_generated, 660);
  EXPECT_EQ(r.stats.stop, StopReason::length);
  EXPECT_GT(r.stats.n_discarded, 580);
  EXPECT_LE(session.n_past(), 64);
  EXPECT_EQ(session.kv_cache_bytes(), bytes);
  const double ppl = judged_perplexity("Once upon a time", r.text, 64);
  std::printf("[ %s ] perplexity of the text past the first eviction: %.3f\n", kv_eviction_name(policy), ppl);
  EXPECT_LT(ppl, 3.0) << r.text;
}

TEST(KvEvict, SinkRunsTenContexts) { expect_runs_ten_contexts(KvEviction::sink); }
TEST(KvEvict, H2oRunsTenContexts) { expect_runs_ten_contexts(KvEviction::h2o); }

// Token by token (the pending token decoded by the next call): after every step the cache
// holds exactly the 4 sinks and the most recent tokens of the whole sequence.
TEST(KvEvict, SinkKeepsSinksAndRecentWindow) {
  test::GreedyRig rig(params(48, TensorType::F16));
  Session& session = rig.session;
  Generator& generator = rig.generator;
  generator.set_ignore_eos(true);
  KvEvictionParams p;
  p.policy = KvEviction::sink;
  p.sink_tokens = 4;
  p.budget = 40;
  generator.set_kv_eviction(p);
  std::vector<int32_t> all = story_tokens();  // 40+ tokens: the prompt itself is decoded in steps
  ASSERT_GT(all.size(), 40u);
  int32_t discarded = generator.generate(all, 1, [](std::string_view) {}).n_discarded;
  all.push_back(generator.history().back());
  for (int step = 0; step < 150; ++step) {
    const GenerationStats st = generator.generate({}, 1, [](std::string_view) {});
    discarded += st.n_discarded;
    all.push_back(generator.history().back());
    const std::vector<int32_t>& h = generator.history();
    ASSERT_EQ(h.size(), size_t(session.n_past()) + 1);  // the new token is pending
    ASSERT_LE(session.n_past(), 40);
    ASSERT_GE(session.n_past(), 40 - 2);  // chunks of budget / 32 = 1 token, after the step's token
    ASSERT_TRUE(std::equal(h.begin(), h.begin() + 4, all.begin())) << "step " << step;
    ASSERT_TRUE(std::equal(h.begin() + 4, h.end(), all.end() - ptrdiff_t(h.size() - 4))) << "step " << step;
  }
  EXPECT_EQ(size_t(discarded), all.size() - generator.history().size());
}

// A hand-checkable choice: the lowest scores outside the kept front and the recent window.
TEST(KvEvict, H2oSelectsLowestScores) {
  const std::vector<float> scores = {9, 0.1f, 3, 0.2f, 0.2f, 8, 0.05f, 0.01f};
  std::vector<int32_t> out;
  select_h2o(scores, 1, 2, 3, out);  // candidates 1..5: 0.1 3 0.2 0.2 8
  EXPECT_EQ(out, (std::vector<int32_t>{1, 3, 4}));
  select_h2o(scores, 1, 2, 2, out);  // a tie between 3 and 4: the older goes
  EXPECT_EQ(out, (std::vector<int32_t>{1, 3}));
  select_h2o(scores, 0, 0, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 7}));
  select_h2o(scores, 6, 2, 2, out);  // no candidates
  EXPECT_TRUE(out.empty());
}

// Each query's attention sums to 1 per head and layer, so the scores of a fresh prefill of
// B tokens add up to layers * heads * B, and each later token adds layers * heads.
TEST(KvEvict, AttentionScoresAreSoftmaxSums) {
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Session s(stories(), params(64, TensorType::F16, 2, fa));
    s.track_attention(true);
    const std::vector<int32_t> t = story_tokens();
    s.decode(t);
    const double per_query = double(stories().config().n_layers) * stories().config().n_heads;
    auto sum = [&] {
      const auto sc = s.attention_scores();
      EXPECT_EQ(sc.size(), size_t(s.n_past()));
      return std::accumulate(sc.begin(), sc.end(), 0.0);
    };
    EXPECT_NEAR(sum(), per_query * double(t.size()), 1e-3 * double(t.size()));
    s.decode(std::vector<int32_t>{t[3]});
    EXPECT_NEAR(sum(), per_query * double(t.size() + 1), 1e-3 * double(t.size()));
    // The first token sees itself only: in a fresh session it received all of its own
    // query's attention, then some of every later query.
    EXPECT_GT(s.attention_scores()[0], per_query);
    s.track_attention(false);
    EXPECT_TRUE(s.attention_scores().empty());
  }
}

// Tracking only reads: the logits are the same bits with it on.
TEST(KvEvict, TrackingChangesNoLogits) {
  const std::vector<int32_t> t = story_tokens();
  Session a(stories(), params(64)), b(stories(), params(64));
  b.track_attention(true);
  const auto la = a.decode(t, true);
  const std::vector<float> va(la.begin(), la.end());
  const auto lb = b.decode(t, true);
  EXPECT_TRUE(std::equal(va.begin(), va.end(), lb.begin()));
}

// The evictor drops exactly select_h2o's choice, from the cache, the token list and the
// scores alike, and every kept older position scored at least as much as any dropped one.
TEST(KvEvict, H2oEvictsTheLeastAttended) {
  std::vector<int32_t> tokens = story_tokens();
  tokens.insert(tokens.end(), tokens.begin() + 1, tokens.end());  // > 64 tokens
  tokens.resize(64);
  Session s(stories(), params(64));
  KvEvictionParams p;
  p.policy = KvEviction::h2o;
  KvEvictor evictor(s, p, stories().tokenizer().bos());
  s.decode(tokens);
  const std::vector<float> before(s.attention_scores().begin(), s.attention_scores().end());
  std::vector<int32_t> expected;
  select_h2o(before, 1, 32, 2, expected);  // BOS kept, half the budget recent, chunk 64 / 32
  ASSERT_EQ(expected.size(), 2u);
  std::vector<int32_t> cached = tokens;
  EXPECT_EQ(evictor.make_room(1, cached), 2);
  EXPECT_EQ(s.n_past(), 62);
  std::vector<int32_t> want_tokens;
  std::vector<float> want_scores;
  for (int32_t i = 0; i < 64; ++i) {
    if (std::find(expected.begin(), expected.end(), i) != expected.end()) continue;
    want_tokens.push_back(tokens[size_t(i)]);
    want_scores.push_back(before[size_t(i)]);
  }
  EXPECT_EQ(cached, want_tokens);
  EXPECT_TRUE(std::equal(want_scores.begin(), want_scores.end(), s.attention_scores().begin()));
  const float dropped_max = std::max(before[size_t(expected[0])], before[size_t(expected[1])]);
  for (int32_t i = 1; i < 32; ++i)
    if (std::find(expected.begin(), expected.end(), i) == expected.end()) {
      EXPECT_GE(before[size_t(i)], dropped_max) << i;
    }
}

// Off (the default, or none given explicitly) is the plain generator: the golden text. And
// a budget the run never reaches changes nothing either, h2o's tracking included.
TEST(KvEvict, OffAndUnreachedBudgetKeepTheGoldenText) {
  const std::string golden =
      test::trim(test::read_file(test::shared_path("models/expected/stories260K.once-upon-a-time.greedy100.txt")));
  for (KvEviction policy : {KvEviction::none, KvEviction::sink, KvEviction::h2o}) {
    Session session(stories(), params(256, TensorType::F16));
    KvEvictionParams p;
    p.policy = policy;
    const LongRun r = generate_long(session, p, 100);
    EXPECT_EQ(r.stats.n_discarded, 0);
    EXPECT_EQ(test::trim(r.text), golden) << kv_eviction_name(policy);
  }
}

// One and two threads: the same text through many evictions, a long prompt decoded in
// steps included (big enough steps for the pool to split the work).
TEST(KvEvict, ThreadCountsAgree) {
  std::string prompt;
  for (int i = 0; i < 4; ++i) prompt += "Once upon a time, there was a little girl named Lily. She loved to play. ";
  for (KvEviction policy : {KvEviction::sink, KvEviction::h2o}) {
    std::string texts[2];
    for (int threads : {1, 2}) {
      test::GreedyRig rig(params(96, TensorType::F16, threads));
      Generator& g = rig.generator;
      g.set_ignore_eos(true);
      KvEvictionParams p;
      p.policy = policy;
      p.budget = 80;
      g.set_kv_eviction(p);
      const GenerationStats st = g.generate(stories().tokenizer().encode(prompt, true), 200,
                                            [&](std::string_view t) { texts[threads - 1] += t; });
      EXPECT_GT(st.n_discarded, 100);
    }
    EXPECT_EQ(texts[0], texts[1]) << kv_eviction_name(policy);
  }
}

// A chat past its context with sinks: turns append to the evicted cache.
TEST(KvEvict, ChatWithSinksKeepsGoing) {
  test::GreedyRig rig(params(64, TensorType::F16));
  Session& session = rig.session;
  Generator& generator = rig.generator;
  KvEvictionParams p;
  p.policy = KvEviction::sink;
  generator.set_kv_eviction(p);
  Chat chat(generator, stories().tokenizer(), ChatTemplate(Chat::plain_template()));
  for (int turn = 0; turn < 8; ++turn) {
    const ChatTurn t = chat.send("Once upon a time", 30, [](std::string_view) {});
    EXPECT_EQ(t.stats.n_generated, 30) << turn;
    EXPECT_LE(session.n_past(), 64);
  }
  EXPECT_TRUE(chat.shifted());
  EXPECT_EQ(chat.messages().size(), 16u);
}

std::string kiln(const std::string& args) {
  return test::shell_quote(test::kiln_binary()) + " " + args;
}
std::string model() { return test::shell_quote(test::shared_path("models/stories260K.gguf")); }

TEST(KvEvictCli, BadFlagsGiveOneLine) {
  const std::string run = "run " + model() + " 'Once upon a time' -n 10 ";
  test::expect_one_line_error(test::run_command(kiln(run + "-c 64 --kv-evict sink --kv-budget 65")), 2, "--kv-budget 65");
  test::expect_one_line_error(test::run_command(kiln(run + "--context-shift --kv-evict sink")), 2, "not both");
  test::expect_one_line_error(test::run_command(kiln(run + "--sink-tokens 2")), 2, "--sink-tokens");
  test::expect_one_line_error(test::run_command(kiln(run + "--kv-budget 32")), 2, "--kv-budget");
  test::expect_one_line_error(test::run_command(kiln(run + "-c 64 --kv-evict sink --sink-tokens 62")), 2, "budget");
  auto bad = test::run_command(kiln(run + "--kv-evict lru"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--kv-evict"), std::string::npos) << bad.err;
  auto ppl = test::run_command(kiln("perplexity " + model() + " -f " +
                                    test::shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt") +
                                    " --kv-evict sink"));
  EXPECT_EQ(ppl.exit_code, 2);
  EXPECT_NE(ppl.err.find("--stream"), std::string::npos) << ppl.err;
}

TEST(KvEvictCli, RunAndPerplexityStream) {
  auto r = test::run_command(kiln("run " + model() + " 'Once upon a time' -c 64 -n 300 --temp 0 --ignore-eos --kv-evict h2o"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kv eviction:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generation: 300 tokens"), std::string::npos) << r.err;

  const std::string file = test::shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt");
  const auto ppl = [&](const std::string& flags) {
    auto p = test::run_command(kiln("perplexity " + model() + " -f " + file + " --stream " + flags));
    EXPECT_EQ(p.exit_code, 0) << p.err;
    const size_t at = p.out.find("PPL = ");
    return at == std::string::npos ? -1.0 : std::stod(p.out.substr(at + 6));
  };
  const double full = ppl(""), sink = ppl("--kv-evict sink --kv-budget 64"), shift = ppl("--kv-evict shift --kv-budget 64");
  std::printf("[ stream ] story.txt: full %.3f, sink@64 %.3f, shift@64 %.3f\n", full, sink, shift);
  EXPECT_GT(full, 1.0);
  EXPECT_GE(sink, full * 0.95);  // less context cannot help much
  EXPECT_LT(sink, full * 2.0);   // but a working cache keeps it close
  EXPECT_LT(shift, full * 2.0);
}

}  // namespace
}  // namespace kiln
