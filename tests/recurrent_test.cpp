// What every model with recurrent (Mamba-2) layers must do with its state beyond one
// forward pass, on mamba2-tiny (recurrent layers only) and granitehybrid-tiny (recurrent
// and attention layers: a state and a cache that must move together): chat turns continue
// the state or recompute it, speculative decoding undoes refused drafts (Generator and
// kiln serve's engine), and the engine's slots and prefix cache keep each request's state.
// Every text is compared with a fresh session's greedy text for the same tokens.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "engine_text.h"
#include "kiln/batch_engine.h"
#include "kiln/chat.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/speculative.h"
#include "model_gen/generate_model.h"
#include "recurrent_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::engine_text;

struct Family {
  const char* shape;
  bool tied;  // mamba2-tiny ties its output to the embeddings
};

// tests/data/families/README.md's tiny files (seed 7), and the same shape with seed 8:
// a draft that mostly disagrees.
std::unique_ptr<Model> load(const Family& f, uint64_t seed) {
  const std::string path = test::temp_dir() + "/" + f.shape + "-seed" + std::to_string(seed) + ".gguf";
  gen::build_model(gen::peaky_options(f.shape, seed, f.tied),
                   *gguf::File::open(test::shared_path("vocab/ggml-vocab-gpt-neox.gguf")))
      .write(path);
  return Model::load(path);
}

SessionParams params(KvLayout layout = KvLayout::contiguous, int32_t n_batch = 512) { return test::recurrent_params(layout, n_batch); }

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

std::vector<int32_t> tokens(size_t n, int32_t seed) { return test::spread_tokens(n, seed); }
using test::concat;

// Two requests in one engine at once (two slots): their texts, a's and b's.
std::pair<std::string, std::string> texts_together(BatchEngine& engine, const std::vector<int32_t>& a,
                                                   const std::vector<int32_t>& b, int32_t n) {
  std::string got_b;
  std::thread other([&] { got_b = engine_text(engine, b, n); });
  std::string got_a = engine_text(engine, a, n);
  other.join();
  return {got_a, got_b};
}

class Recurrent : public ::testing::TestWithParam<Family> {
 protected:
  const Model& tiny() {
    if (!tiny_ || tiny_shape_ != GetParam().shape) tiny_ = load(GetParam(), 7), tiny_shape_ = GetParam().shape;
    return *tiny_;
  }
  // The greedy reply of a fresh session to `t`: what every continuation must say.
  std::string fresh_reply(const std::vector<int32_t>& t, int32_t n) {
    Session s(tiny(), params());
    Sampler sampler(greedy(), tiny().config().n_vocab);
    Generator g(s, tiny().tokenizer(), sampler);
    std::string reply;
    g.generate(t, n, [&](std::string_view piece) { reply.append(piece); });
    return reply;
  }

 private:
  static inline std::unique_ptr<Model> tiny_;
  static inline std::string tiny_shape_;
};

// kiln chat's turns: turn 2 runs only its new tokens on the state turn 1 left, and says
// what a fresh session given the whole conversation says; a new system prompt changes the
// text before everything, so the state is recomputed from the start (and still agrees).
TEST_P(Recurrent, ChatTurnsContinueTheStateOrRecomputeIt) {
  Session s(tiny(), params());
  Sampler sampler(greedy(), tiny().config().n_vocab);
  Generator g(s, tiny().tokenizer(), sampler);
  Chat chat(g, tiny().tokenizer(), ChatTemplate(builtin_chat_template("chatml")));
  const auto ignore = [](std::string_view) {};
  chat.send("Once upon a time", 6, ignore);
  const size_t after1 = g.history().size();
  const ChatTurn t2 = chat.send("The dog", 6, ignore);
  EXPECT_EQ(size_t(t2.n_reused), after1);
  const std::vector<int32_t> before2(g.history().begin(), g.history().end() - t2.stats.n_generated);
  // The new turn's tokens and turn 1's last reply token (sampled, not yet run).
  EXPECT_EQ(size_t(t2.stats.n_prompt), before2.size() - after1 + 1);
  EXPECT_EQ(t2.reply, fresh_reply(before2, 6));

  chat.set_system("You tell stories.");
  const ChatTurn t3 = chat.send("A cat", 6, ignore);
  const std::vector<int32_t> before3(g.history().begin(), g.history().end() - t3.stats.n_generated);
  EXPECT_EQ(t3.stats.n_prompt, int32_t(before3.size())) << "everything run again";
  EXPECT_EQ(t3.reply, fresh_reply(before3, 6));
}

// Speculative decoding: the verification's refused drafts are undone by going back to the
// checkpoint before it (the cache is cut with it) and re-running the accepted tokens.
// Greedy output is the plain output with a draft that agrees (the model itself), one that
// mostly does not (another seed) and n-grams, on both cache layouts.
TEST_P(Recurrent, SpeculativeDecodingKeepsTheGreedyOutput) {
  const std::unique_ptr<Model> other = load(GetParam(), 8);
  const std::vector<int32_t> prompt = tokens(10, 11);
  const std::string want = fresh_reply(prompt, 24);
  SpeculativeParams sp;
  sp.draft_max = 4;
  sp.adaptive = false;
  const Model* drafts[] = {&tiny(), other.get(), nullptr};
  for (const Model* draft : drafts) {
    SCOPED_TRACE(draft == &tiny() ? "self draft" : draft ? "other seed" : "n-grams");
    for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
      Session s(tiny(), params(layout));
      Session draft_session(draft ? *draft : tiny(), params());
      const std::unique_ptr<Drafter> drafter = draft ? make_model_drafter(draft_session, greedy(), 0.0f) : make_ngram_drafter(2);
      Sampler sampler(greedy(), tiny().config().n_vocab);
      Generator g(s, tiny().tokenizer(), sampler);
      g.set_speculative(drafter.get(), sp);
      std::string got;
      const GenerationStats st = g.generate(prompt, 24, [&](std::string_view piece) { got.append(piece); });
      EXPECT_EQ(got, want);
      if (draft) {
        EXPECT_GT(st.spec.n_drafted, 0);
      }
      if (draft == &tiny()) {
        EXPECT_EQ(st.spec.n_accepted, st.spec.n_drafted);
      } else if (draft == other.get()) {
        EXPECT_LT(st.spec.n_accepted, st.spec.n_drafted) << "some drafts refused";
      }
    }
  }
}

// kiln serve's engine: concurrent requests each scan their own state in the shared
// batches; a request extending an earlier one's prompt continues from the checkpoint the
// engine took after that prompt, and a prefix-cache hit that would need the state cut back
// further recomputes (cached_tokens says 0) rather than skipping tokens; every text is
// the one alone.
TEST_P(Recurrent, ServerSlotsKeepEachRequestsState) {
  const std::vector<int32_t> a = tokens(14, 9), b = tokens(9, 10);
  const std::string want_a = fresh_reply(a, 10), want_b = fresh_reply(b, 10);
  Session session(tiny(), params(KvLayout::paged, 64));
  BatchEngine::Params bp;
  bp.n_parallel = 2;
  BatchEngine engine(session, tiny().tokenizer(), bp);
  EXPECT_EQ(texts_together(engine, a, b, 10), std::make_pair(want_a, want_b));
  int32_t cached = -1;
  const std::vector<int32_t> longer = concat(a, tokens(5, 12));
  EXPECT_EQ(engine_text(engine, longer, 10, &cached), fresh_reply(longer, 10)) << "a's prompt extended";
  EXPECT_EQ(cached, int32_t(a.size())) << "from the checkpoint after a's prompt";
  EXPECT_EQ(engine_text(engine, a, 10, &cached), want_a) << "the same prompt again";
  EXPECT_EQ(cached, 0) << "one token short of a's prompt: before every checkpoint";
}

// Speculative decoding in the engine (kiln serve --model-draft / --spec-type ngram): two
// requests verify their drafts in one batch; a refusal sends that request's state back to
// the checkpoint before the step and its accepted tokens run again after it. Each text is
// the one alone; the draft of another seed has drafts refused, so the rollback ran.
TEST_P(Recurrent, ServerSpeculativeDecodingKeepsEachRequestsText) {
  const std::unique_ptr<Model> other = load(GetParam(), 8);
  const std::vector<int32_t> a = tokens(12, 21), b = tokens(7, 22);
  const std::string want_a = fresh_reply(a, 20), want_b = fresh_reply(b, 20);
  const Model* drafts[] = {other.get(), nullptr};
  for (const Model* draft : drafts) {
    SCOPED_TRACE(draft ? "draft model of another seed" : "n-grams");
    Session session(tiny(), params(KvLayout::paged, 64));
    Session draft_session(draft ? *draft : tiny(), params(KvLayout::paged, 64));
    BatchEngine::Params bp;
    bp.n_parallel = 2;
    bp.spec_type = draft ? SpecType::draft : SpecType::ngram;
    bp.spec.draft_max = 4;
    bp.spec.adaptive = false;
    bp.spec.ngram_n = 2;
    if (draft) bp.draft_session = &draft_session;
    BatchEngine engine(session, tiny().tokenizer(), bp);
    EXPECT_EQ(texts_together(engine, a, b, 20), std::make_pair(want_a, want_b));
    const BatchEngineMetrics m = engine.metrics();
    if (draft) {
      EXPECT_GT(m.draft_tokens_total, 0u);
      EXPECT_LT(m.draft_accepted_total, m.draft_tokens_total) << "some drafts refused";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Recurrent,
                         ::testing::Values(Family{"mamba2-tiny", true}, Family{"granitehybrid-tiny", false}),
                         [](const ::testing::TestParamInfo<Family>& i) {
                           return std::string(i.param.shape[0] == 'm' ? "Mamba2" : "GraniteHybrid");
                         });

}  // namespace
}  // namespace kiln
