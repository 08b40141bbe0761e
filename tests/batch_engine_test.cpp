// Continuous batching (kiln/batch_engine.h) on stories260K: a request's greedy text is the
// same alone, among others and after a prefix-cache hit as Generator's; mixed batches give
// each sequence the logits it would get by itself; stop strings, limits, cancellation,
// a full queue and shutdown end every stream.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/batch_engine.h"
#include "kiln/error.h"
#include "kiln/session.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::long_tokens;
using test::stories;

SessionParams paged(int32_t n_ctx = 512, int32_t n_batch = 64) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_threads = 2;
  p.kv_layout = KvLayout::paged;
  p.kv_block = 16;
  return p;
}

std::vector<int32_t> prompt_of(const std::string& text) { return stories().tokenizer().encode(text, true); }

SamplerParams greedy() {
  SamplerParams sp;
  sp.temperature = 0;
  return sp;
}

struct Result {
  std::string text;
  std::vector<int32_t> tokens;
  CompletionEvent last;
  int n_events = 0;
};

// Reads a stream to its end; fails the test (instead of hanging) after 60 s.
Result collect(CompletionStream& s) {
  Result r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  CompletionEvent e;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!s.next(e, std::chrono::milliseconds(100))) continue;
    ++r.n_events;
    r.text += e.text;
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.done) {
      r.last = e;
      return r;
    }
  }
  ADD_FAILURE() << "stream did not end within 60 s";
  return r;
}

// Generator's greedy text for the prompt (the `kiln run --temp 0` path).
std::string generator_text(const std::vector<int32_t>& prompt, int32_t n) {
  test::GreedyRig rig(paged());
  std::string text;
  rig.generator.generate(prompt, n, [&](std::string_view t) { text += t; });
  return text;
}

CompletionRequest request(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  CompletionRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling = greedy();
  return r;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Lily and Ben went to the park",
                                           "One day, a big bird", "Tom had a red ball", "The sun was hot",
                                           "There was a girl named Sue", "A cat sat"};

// Weights (F32: the float GEMM; Q8_0, Q4_0: the packed int8 kernels) x KV cache (F16:
// direct attention; Q8_0: tiled attention over quantized keys and values).
class DecodeBatch : public ::testing::TestWithParam<std::tuple<std::string, TensorType>> {};

TEST_P(DecodeBatch, EachSequenceGetsTheLogitsItWouldGetAlone) {
  const Model& model = stories(std::get<0>(GetParam()));
  SessionParams params = paged();
  params.kv_type_k = params.kv_type_v = std::get<1>(GetParam());
  const std::vector<int32_t>& t = long_tokens();
  // Alone: sequence A holds 40 tokens and decodes one more; B prefills 25; C holds 300
  // (past a 256-key tile of the tiled attention) and decodes one more.
  Session alone(model, params);
  const int32_t a = alone.add_sequence(), b = alone.add_sequence(), c = alone.add_sequence();
  alone.decode_sequence(a, std::span(t.data(), 40));
  alone.decode_sequence(c, std::span(t.data() + 300, 300));
  const auto copy = [](std::span<const float> l) { return std::vector<float>(l.begin(), l.end()); };
  const std::vector<float> want_a = copy(alone.decode_sequence(a, std::span(t.data() + 40, 1)));
  const std::vector<float> want_b = copy(alone.decode_sequence(b, std::span(t.data() + 100, 25)));
  const std::vector<float> want_c = copy(alone.decode_sequence(c, std::span(t.data() + 600, 1)));

  Session mixed(model, params);
  const int32_t ma = mixed.add_sequence(), mb = mixed.add_sequence(), mc = mixed.add_sequence();
  mixed.decode_sequence(ma, std::span(t.data(), 40));
  mixed.decode_sequence(mc, std::span(t.data() + 300, 300));
  const Session::BatchPart parts[] = {
      {ma, std::span(t.data() + 40, 1)}, {mb, std::span(t.data() + 100, 25)}, {mc, std::span(t.data() + 600, 1)}};
  const auto got = mixed.decode_batch(parts);
  const ptrdiff_t n_vocab = model.config().n_vocab;
  ASSERT_EQ(got.size(), 3 * size_t(n_vocab));
  // A's token, B's 25 and C's token run as rows 0, 1..25 and 26 of one batch of 27
  // instead of alone: bit for bit the same (batch-invariant kernels: every output of a
  // matmul is one chain over k whatever the tile, and a query row's attention does not
  // depend on the other rows).
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + n_vocab), want_a);
  EXPECT_EQ(std::vector<float>(got.begin() + n_vocab, got.begin() + 2 * n_vocab), want_b);
  EXPECT_EQ(std::vector<float>(got.begin() + 2 * n_vocab, got.end()), want_c);
  EXPECT_EQ(mixed.n_past(ma), 41);
  EXPECT_EQ(mixed.n_past(mb), 25);
  EXPECT_EQ(mixed.n_past(mc), 301);
}

INSTANTIATE_TEST_SUITE_P(WeightsAndCache, DecodeBatch,
                         ::testing::Combine(::testing::Values("F32", "Q8_0", "Q4_0"),
                                            ::testing::Values(TensorType::F16, TensorType::Q8_0)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_kv_" +
                                  (std::get<1>(info.param) == TensorType::F16 ? "F16" : "Q8_0");
                         });

TEST(DecodeBatchRefusal, RefusesWithoutAppendingAnything) {
  Session s(stories(), paged(512, 16));
  const int32_t a = s.add_sequence();
  const std::vector<int32_t>& t = long_tokens();
  const Session::BatchPart too_many[] = {{a, std::span(t.data(), 17)}};
  EXPECT_THROW(s.decode_batch(too_many), Error);
  const Session::BatchPart twice[] = {{a, std::span(t.data(), 2)}, {a, std::span(t.data(), 2)}};
  EXPECT_THROW(s.decode_batch(twice), Error);
  const Session::BatchPart unknown[] = {{a, std::span(t.data(), 2)}, {99, std::span(t.data(), 2)}};
  EXPECT_THROW(s.decode_batch(unknown), Error);
  EXPECT_EQ(s.n_past(a), 0);
}

TEST(BatchEngine, GreedyTextAloneIsGeneratorsText) {
  Session session(stories(), paged());
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 4});
  const std::vector<int32_t> prompt = prompt_of("Once upon a time");
  const Result r = collect(*engine.submit(request(prompt, 60)));
  EXPECT_EQ(r.text, generator_text(prompt, 60));
  EXPECT_EQ(r.last.finish, FinishReason::length);
  EXPECT_EQ(r.last.completion_tokens, 60);
  EXPECT_EQ(r.last.prompt_tokens, int32_t(prompt.size()));
  EXPECT_EQ(r.tokens.size(), 60u);
  EXPECT_GT(r.n_events, 10);  // streamed, not one block at the end
}

// Sixteen requests at once (the eight prompts twice: the second ones partly from the
// prefix cache), all running together with prompts fed in chunks of 8 beside the
// decoding ones: each gives, token for token, the greedy text it gets alone. Then the
// same with 4 running and 12 waiting.
TEST(BatchEngine, ConcurrentRequestsGiveTheirTextsAlone) {
  std::vector<std::string> alone;
  for (const std::string& p : kPrompts) alone.push_back(generator_text(prompt_of(p), 40));
  for (const int32_t n_parallel : {16, 4}) {
    Session session(stories(), paged());
    BatchEngine engine(session, stories().tokenizer(), {.n_parallel = n_parallel, .max_queue = 16, .prefill_chunk = 8});
    std::vector<std::shared_ptr<CompletionStream>> streams;
    for (int round = 0; round < 2; ++round)
      for (const std::string& p : kPrompts) streams.push_back(engine.submit(request(prompt_of(p), 40)));
    for (size_t i = 0; i < streams.size(); ++i) {
      const Result r = collect(*streams[i]);
      EXPECT_EQ(r.text, alone[i % kPrompts.size()]) << kPrompts[i % kPrompts.size()] << ", -np " << n_parallel;
      EXPECT_EQ(r.last.finish, FinishReason::length);
    }
    const BatchEngineMetrics m = engine.metrics();
    EXPECT_EQ(m.requests_total, 2 * kPrompts.size());
    EXPECT_EQ(m.completion_tokens_total, 80 * kPrompts.size());
  }
}

TEST(BatchEngine, PrefixCacheSkipsTheSharedPromptAndKeepsTheText) {
  Session session(stories(), paged());
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 2});
  const std::vector<int32_t> first = prompt_of("Once upon a time, there was a little girl named Lily. She liked to play");
  const Result r1 = collect(*engine.submit(request(first, 20)));
  EXPECT_EQ(r1.last.cached_tokens, 0);
  // The same prompt again: all but its last token come from the cache.
  const Result r2 = collect(*engine.submit(request(first, 20)));
  EXPECT_EQ(r2.last.cached_tokens, int32_t(first.size()) - 1);
  EXPECT_EQ(r2.text, r1.text);
  // A longer prompt that starts the same way.
  std::vector<int32_t> longer = first;
  const std::vector<int32_t> more = stories().tokenizer().encode(" with her dog.", false);
  longer.insert(longer.end(), more.begin(), more.end());
  const Result r3 = collect(*engine.submit(request(longer, 20)));
  EXPECT_GE(r3.last.cached_tokens, int32_t(first.size()));
  EXPECT_EQ(r3.text, generator_text(longer, 20));
  EXPECT_GE(engine.metrics().cached_tokens_total, uint64_t(r2.last.cached_tokens + r3.last.cached_tokens));
}

TEST(BatchEngine, StopStringEndsTheTextBeforeIt) {
  const std::vector<int32_t> prompt = prompt_of("Once upon a time");
  const std::string full = generator_text(prompt, 60);
  const size_t cut = full.find(' ', 30);
  ASSERT_NE(cut, std::string::npos);
  const std::string stop = full.substr(cut, 6);  // a word or two, inside the greedy text
  Session session(stories(), paged());
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 2});
  CompletionRequest req = request(prompt, 60);
  req.stop = {"never appears in it \x01", stop};
  const Result r = collect(*engine.submit(req));
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(r.last.finish, FinishReason::stop);
}

TEST(BatchEngine, BadRequestsAreRefusedAtSubmit) {
  Session session(stories(), paged(64));
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 2});
  EXPECT_THROW(engine.submit(request({}, 5)), UsageError);
  EXPECT_THROW(engine.submit(request(std::vector<int32_t>(64, 1), 5)), UsageError);  // no room left
  EXPECT_THROW(engine.submit(request({1, 100000}, 5)), UsageError);
  CompletionRequest bad_top_p = request(prompt_of("Hi"), 5);
  bad_top_p.sampling.top_p = 7;
  EXPECT_THROW(engine.submit(bad_top_p), UsageError);
  // A prompt that fills the context but for 4 tokens: those 4 are decoded, and the token
  // sampled from the last of them is the 5th and final one (it needs no room).
  const Result r = collect(*engine.submit(request(std::vector<int32_t>(long_tokens().begin(), long_tokens().begin() + 60), -1)));
  EXPECT_EQ(r.last.finish, FinishReason::length);
  EXPECT_EQ(r.last.completion_tokens, 5);
}

TEST(BatchEngine, FullQueueRefusesAndEveryAcceptedRequestEnds) {
  Session session(stories(), paged());
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 1, .max_queue = 2});
  std::vector<std::shared_ptr<CompletionStream>> accepted;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    try {
      accepted.push_back(engine.submit(request(prompt_of(kPrompts[size_t(i)]), 30)));
    } catch (const QueueFullError&) {
      ++refused;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_GE(accepted.size(), 2u);
  for (auto& s : accepted) EXPECT_EQ(collect(*s).last.finish, FinishReason::length);
  EXPECT_EQ(engine.metrics().requests_rejected, uint64_t(refused));
}

TEST(BatchEngine, CancelEndsTheStreamAndFreesTheSlot) {
  Session session(stories(), paged());
  BatchEngine engine(session, stories().tokenizer(), {.n_parallel = 1});
  auto endless = engine.submit(request(prompt_of("Once upon a time"), -1));
  CompletionEvent e;
  ASSERT_TRUE(endless->next(e, std::chrono::seconds(30)));
  endless->cancel();
  const Result r = collect(*endless);
  EXPECT_EQ(r.last.finish, FinishReason::cancelled);
  // The one slot is free again.
  EXPECT_EQ(collect(*engine.submit(request(prompt_of("The little dog"), 10))).last.finish, FinishReason::length);
}

TEST(BatchEngine, ShutdownEndsRunningAndWaitingStreams) {
  Session session(stories(), paged());
  auto engine = std::make_unique<BatchEngine>(session, stories().tokenizer(), BatchEngine::Params{.n_parallel = 1});
  auto running = engine->submit(request(prompt_of("Once upon a time"), -1));
  auto waiting = engine->submit(request(prompt_of("The little dog"), -1));
  CompletionEvent e;
  ASSERT_TRUE(running->next(e, std::chrono::seconds(30)));
  engine->shutdown(false);
  EXPECT_EQ(collect(*running).last.finish, FinishReason::cancelled);
  EXPECT_EQ(collect(*waiting).last.finish, FinishReason::cancelled);
  EXPECT_THROW(engine->submit(request(prompt_of("A cat"), 5)), Error);
}

}  // namespace
}  // namespace kiln
