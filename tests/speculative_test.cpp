// Speculative decoding is exact under greedy decoding: byte-identical to plain decoding
// (families, both KV layouts, KV types, sliding-window rings, eviction, chat turns,
// cancellation), refused drafts leave no trace in either cache, verification rows are the
// logits of single steps, and a draft with another vocabulary is refused. Sampling, the
// controller and the command line: speculative_control_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/chat_template.h"
#include "kiln/error.h"
#include "speculative_fixture.h"

using namespace kiln;
using namespace kiln::test;

namespace {

// Greedy: the same tokens, and both verification outcomes (kept and refused drafts) seen.
void expect_same_as_plain(const Model& target, const RunSetup& run, const DraftSource& draft, int32_t n,
                          const std::vector<std::vector<int32_t>>& prompts, bool expect_refusals = true) {
  int32_t drafted = 0, accepted = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    const Output plain = generate(target, run, prompt, n, nullptr);
    const Output spec = generate(target, run, prompt, n, &draft);
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.text, plain.text);
    EXPECT_EQ(spec.stats.stop, plain.stats.stop);
    EXPECT_EQ(spec.stats.n_generated, plain.stats.n_generated);
    drafted += spec.stats.spec.n_drafted;
    accepted += spec.stats.spec.n_accepted;
  }
  EXPECT_GT(accepted, 0);
  if (expect_refusals) EXPECT_LT(accepted, drafted);
}


// ------------------------------------------------------------------ greedy, stories260K

// What greedy exactness rests on: a verification's rows are bit for bit the logits that
// decoding its tokens one at a time gives (batch-invariant kernels), at every batch size
// and offset.
TEST(Verification, RowsAreTheLogitsOfSingleSteps) {
  for (const char* type : {"F32", "Q8_0", "Q4_0"}) {
    SCOPED_TRACE(type);
    const std::vector<int32_t>& t = long_tokens();
    Session single(stories(type), session_params(512)), batched(stories(type), session_params(512));
    const size_t n_vocab = size_t(stories().config().n_vocab);
    std::vector<std::vector<float>> steps;
    for (size_t i = 0; i < 160; ++i) {
      const std::span<const float> l = single.decode(std::span(t.data() + i, 1));
      steps.emplace_back(l.begin(), l.end());
    }
    batched.decode(std::span(t.data(), 5));
    size_t pos = 5, k = 1;
    while (pos < steps.size()) {
      const size_t n = std::min(k, steps.size() - pos);
      const std::span<const float> rows = batched.decode(std::span(t.data() + pos, n), /*all_logits=*/true);
      for (size_t j = 0; j < n; ++j)
        ASSERT_TRUE(std::equal(steps[pos + j].begin(), steps[pos + j].end(), rows.begin() + ptrdiff_t(j * n_vocab)))
            << "position " << pos + j << " in a batch of " << n;
      pos += n;
      k = k % 17 + 1;
    }
  }
}

struct LayoutCase {
  KvLayout layout;
  TensorType kv;
  const char* drafter;  // "Q4_0", "Q8_0" (draft model files), "ngram"
};

class GreedySpec : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(GreedySpec, SameTokensAsPlainDecoding) {
  const LayoutCase& c = GetParam();
  RunSetup run;
  run.session = session_params(512, c.layout, c.kv);
  run.spec = fixed_length(6);
  DraftSource draft;
  if (std::string(c.drafter) != "ngram") draft.model = &stories(c.drafter);
  expect_same_as_plain(stories(), run, draft, 160, story_prompts());
}

INSTANTIATE_TEST_SUITE_P(
    LayoutsAndCaches, GreedySpec,
    ::testing::Values(LayoutCase{KvLayout::contiguous, TensorType::F16, "Q4_0"},
                      LayoutCase{KvLayout::paged, TensorType::F16, "Q4_0"},
                      LayoutCase{KvLayout::contiguous, TensorType::F32, "Q8_0"},
                      LayoutCase{KvLayout::paged, TensorType::BF16, "Q8_0"},
                      LayoutCase{KvLayout::contiguous, TensorType::BF16, "ngram"},
                      LayoutCase{KvLayout::paged, TensorType::F32, "Q4_0"},
                      LayoutCase{KvLayout::contiguous, TensorType::Q8_0, "Q4_0"},
                      LayoutCase{KvLayout::paged, TensorType::Q4_0, "Q4_0"},
                      LayoutCase{KvLayout::contiguous, TensorType::F16, "ngram"},
                      LayoutCase{KvLayout::paged, TensorType::Q8_0, "ngram"}),
    [](const auto& info) {
      const LayoutCase& c = info.param;
      return std::string(c.layout == KvLayout::paged ? "paged" : "contiguous") + "_" + type_name(c.kv) + "_" +
             c.drafter;
    });

TEST(GreedySpec, EveryDraftLengthFromOneTo16) {
  for (int32_t k : {1, 2, 3, 5, 8, 13, 16}) {
    SCOPED_TRACE("draft_max " + std::to_string(k));
    RunSetup run;
    run.spec = fixed_length(k);
    DraftSource draft{&stories("Q4_0")};
    expect_same_as_plain(stories(), run, draft, 100, {story_prompts()[0]});
  }
}

TEST(GreedySpec, TheTargetAsItsOwnDraftKeepsEveryDraft) {
  RunSetup run;
  run.spec = fixed_length(8);
  DraftSource draft{&stories()};
  const Output spec = generate(stories(), run, story_prompts()[1], 120, &draft);
  EXPECT_EQ(spec.tokens, generate(stories(), run, story_prompts()[1], 120, nullptr).tokens);
  EXPECT_EQ(spec.stats.spec.n_accepted, spec.stats.spec.n_drafted);
  // Each pass emits its drafts and one token of its own: 9 tokens per pass.
  EXPECT_LE(spec.stats.spec.n_verify, 120 / 9 + 1);
}

// A greedy generator over stories260K, its Q4_0 copy as the draft when `speculative`.
struct SpecRig {
  Session session, draft_session;
  Sampler sampler{greedy(), int32_t(stories().config().n_vocab)};
  Generator generator{session, stories().tokenizer(), sampler};
  std::unique_ptr<Drafter> drafter;
  SpecRig(int32_t n_ctx, bool speculative, int32_t draft_max)
      : session(stories(), session_params(n_ctx)), draft_session(stories("Q4_0"), session_params(n_ctx)) {
    drafter = make_model_drafter(draft_session, greedy(), 0.0f);
    if (speculative) generator.set_speculative(drafter.get(), fixed_length(draft_max));
  }
};

// After a drafted generation both caches hold exactly the conversation (its last token
// undecoded in the target's, as after plain decoding): the next step's logits are bit for
// bit those of caches that never saw a refused draft.
TEST(GreedySpec, RefusedDraftsLeaveNoTraceInEitherCache) {
  const std::vector<int32_t> prompt = story_prompts()[2];
  SpecRig rig(512, true, 6);
  Session &target = rig.session, &draft = rig.draft_session;
  const GenerationStats st = rig.generator.generate(prompt, 150, [](std::string_view) {});
  ASSERT_LT(st.spec.n_accepted, st.spec.n_drafted);  // some drafts were refused
  const std::vector<int32_t>& history = rig.generator.history();
  ASSERT_EQ(size_t(target.n_past()), history.size() - 1);
  const std::vector<int32_t> next = {history.back()};
  const std::span<const float> got = target.decode(next);
  Session fresh(stories(), session_params(512));
  fresh.decode(std::span(history.data(), history.size() - 1));
  EXPECT_TRUE(std::ranges::equal(got, fresh.decode(next)));
  // The draft's cache holds a prefix of the conversation; continuing it from there gives
  // what a draft cache that only ever saw the conversation gives.
  const size_t held = size_t(draft.n_past());
  ASSERT_LE(held, history.size());
  const std::span<const float> draft_got = draft.decode(std::span(history.data() + held, history.size() - held));
  const std::vector<float> draft_copy(draft_got.begin(), draft_got.end());
  Session draft_fresh(stories("Q4_0"), session_params(512));
  EXPECT_TRUE(std::ranges::equal(draft_copy, draft_fresh.decode(history)));
}

TEST(GreedySpec, ContextShiftAndSinkEvictionAsPlain) {
  for (KvEviction policy : {KvEviction::shift, KvEviction::sink, KvEviction::h2o}) {
    SCOPED_TRACE(kv_eviction_name(policy));
    RunSetup run;
    run.session = session_params(96);
    run.eviction.policy = policy;
    run.eviction.n_keep = policy == KvEviction::shift || policy == KvEviction::h2o ? 4 : 0;
    run.spec = fixed_length(5);
    DraftSource draft{&stories("Q4_0")};
    for (const std::vector<int32_t>& prompt : story_prompts()) {
      const Output plain = generate(stories(), run, prompt, 300, nullptr);
      const Output spec = generate(stories(), run, prompt, 300, &draft);
      EXPECT_EQ(spec.tokens, plain.tokens);
      EXPECT_GT(plain.stats.n_discarded, 0);
      EXPECT_EQ(spec.stats.n_discarded, plain.stats.n_discarded);
      // H2O's scores would count refused queries: it decodes plainly.
      if (policy == KvEviction::h2o) EXPECT_EQ(spec.stats.spec.n_verify, 0);
      else EXPECT_GT(spec.stats.spec.n_verify, 0);
    }
  }
}

TEST(GreedySpec, ChatTurnsAsPlain) {
  const std::vector<std::string> turns = {"Hi! Tell me a story.", "What did the cat do next?", "And then?"};
  const auto converse = [&](bool speculative) {
    SpecRig rig(1024, speculative, 4);
    Chat chat(rig.generator, stories().tokenizer(), ChatTemplate(builtin_chat_template("chatml")));
    std::vector<std::string> replies;
    int32_t verified = 0;
    for (const std::string& t : turns) {
      std::string reply;
      const ChatTurn turn = chat.send(t, 60, [&](std::string_view s) { reply += s; });
      verified += turn.stats.spec.n_verify;
      replies.push_back(reply);
    }
    // A regenerated turn starts from a truncated history the draft has gone past.
    chat.clear();
    std::string reply;
    chat.send(turns[0], 60, [&](std::string_view s) { reply += s; });
    replies.push_back(reply);
    if (speculative) EXPECT_GT(verified, 0);
    return replies;
  };
  EXPECT_EQ(converse(true), converse(false));
}

TEST(GreedySpec, CancelledMidwayLeavesAConsistentConversation) {
  // Cancel after 30 tokens, then go on: the continuation equals an uncancelled plain run.
  const std::vector<int32_t> prompt = story_prompts()[2];
  const auto two_calls = [&](bool speculative) {
    SpecRig rig(512, speculative, 6);
    Generator& generator = rig.generator;
    std::atomic<bool> cancel{false};
    std::string text;
    int32_t pieces = 0;
    const GenerationStats first = generator.generate(prompt, 200, [&](std::string_view s) {
      text += s;
      if (++pieces == 30) cancel.store(true);
    }, &cancel);
    EXPECT_EQ(first.stop, StopReason::cancelled);
    // The generator asks for at least one token: the next user input.
    const std::vector<int32_t> more = stories().tokenizer().encode(" Then", false);
    generator.generate(more, 80, [&](std::string_view s) { text += s; });
    return text;
  };
  // Cancellation lands at the same token either way only when checked per token: compare
  // each with a plain run that stopped where it did, through the whole history.
  const std::string spec = two_calls(true), plain = two_calls(false);
  EXPECT_EQ(spec, plain);
}

// ------------------------------------------------------------------ families

class FamilySpec : public ::testing::TestWithParam<const char*> {};

TEST_P(FamilySpec, SameTokensAsPlainDecoding) {
  const FamilyPair& f = family(GetParam());
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& s : kPrompts) prompts.push_back(encode(*f.target, s));
  const std::vector<uint32_t>& windows = f.target->config().swa_window;
  const bool sliding = std::any_of(windows.begin(), windows.end(), [](uint32_t w) { return w > 0; });
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
    if (sliding && layout == KvLayout::paged) continue;  // refused at startup: rings are contiguous only
    SCOPED_TRACE(layout == KvLayout::paged ? "paged" : "contiguous");
    RunSetup run;
    run.session = session_params(256, layout);
    // Batches of 4: a verification of 7 tokens is split, and a sliding-window ring
    // (gemma2, mistral) holds window + 3 positions, less than a refused draft reaches
    // back, so truncation forgets the window and the generator runs it again.
    run.session.n_batch = 4;
    run.spec = fixed_length(6);
    DraftSource draft{f.draft.get()};
    expect_same_as_plain(*f.target, run, draft, 80, prompts, /*expect_refusals=*/false);
    DraftSource ngram;
    expect_same_as_plain(*f.target, run, ngram, 80, prompts, /*expect_refusals=*/false);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, FamilySpec,
                         ::testing::Values("mistral-tiny", "qwen2-tiny", "qwen3-tiny", "gemma-tiny", "gemma2-tiny",
                                           "gemma3-tiny", "phi3-tiny", "mpt-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A draft of another architecture with the same vocabulary is fine.
TEST(DraftVocabulary, AnotherArchitectureWithTheSameVocabularyDrafts) {
  const FamilyPair& gemma = family("gemma2-tiny");
  EXPECT_NO_THROW(check_draft_vocabulary(stories().tokenizer(), "stories.gguf", gemma.target->tokenizer(), "gemma2.gguf"));
  RunSetup run;
  run.spec = fixed_length(4);
  DraftSource draft{gemma.target.get()};
  const std::vector<int32_t> prompt = story_prompts()[0];
  EXPECT_EQ(generate(stories(), run, prompt, 60, &draft).tokens, generate(stories(), run, prompt, 60, nullptr).tokens);
}

TEST(DraftVocabulary, AnotherVocabularyIsRefusedNamingBothFiles) {
  const std::unique_ptr<Tokenizer> spm = Tokenizer::from_gguf(*gguf::File::open(shared_path("vocab/ggml-vocab-llama-spm.gguf")));
  try {
    check_draft_vocabulary(stories().tokenizer(), "target.gguf", *spm, "draft.gguf");
    FAIL() << "a 32000-token draft for a 512-token target was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("draft.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("target.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("token"), std::string::npos) << m;
  }
}

}  // namespace
