// Speculative decoding is exact: greedy output byte-identical to plain decoding (families,
// both KV layouts, KV types, sliding-window rings, eviction, chat turns, cancellation),
// sampled output distributed as the target's (chi-square, against the exact distribution
// and two-sample end to end), a draft with another vocabulary refused, and a useless
// draft switched off by the controller.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/chat_template.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/speculative.h"
#include "model_gen/generate_model.h"
#include "stories_fixture.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::test;

namespace {

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

SessionParams session_params(int32_t n_ctx, KvLayout layout = KvLayout::contiguous, TensorType kv = TensorType::F16) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  p.kv_layout = layout;
  p.kv_type_k = p.kv_type_v = kv;
  if (kv == TensorType::Q8_0 || kv == TensorType::Q4_0) p.flash_attn = FlashAttention::on;
  return p;
}

// A drafter as a test names it: a draft model (in its own session) or n-gram lookup.
struct DraftSource {
  const Model* model = nullptr;  // null: n-grams
  SamplerParams sampling = greedy();
};

struct Output {
  std::string text;
  std::vector<int32_t> tokens;
  GenerationStats stats;
};

struct RunSetup {
  SessionParams session = session_params(512);
  SamplerParams sampling = greedy();
  KvEvictionParams eviction;
  SpeculativeParams spec;
};

// Plain decoding when `draft` is null.
Output generate(const Model& target, const RunSetup& r, const std::vector<int32_t>& prompt, int32_t n,
                const DraftSource* draft) {
  Session session(target, r.session);
  Sampler sampler(r.sampling, target.config().n_vocab);
  Generator generator(session, target.tokenizer(), sampler);
  generator.set_kv_eviction(r.eviction);
  std::unique_ptr<Session> draft_session;
  std::unique_ptr<Drafter> drafter;
  if (draft) {
    if (draft->model) {
      SessionParams dp = session_params(r.session.n_ctx);
      draft_session = std::make_unique<Session>(*draft->model, dp);
      drafter = make_model_drafter(*draft_session, draft->sampling, 0.0f);
    } else {
      drafter = make_ngram_drafter(r.spec.ngram_n);
    }
    generator.set_speculative(drafter.get(), r.spec);
  }
  Output out;
  out.stats = generator.generate(prompt, n, [&](std::string_view t) { out.text += t; });
  out.tokens = generator.history();
  return out;
}

std::vector<int32_t> encode(const Model& m, const std::string& text) { return m.tokenizer().encode(text, true); }

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog was happy because",
                                           "Lily and Tom went to the park. They saw a big"};

SpeculativeParams fixed_length(int32_t k) {
  SpeculativeParams p;
  p.draft_max = k;
  p.adaptive = false;  // every step drafts: the verification path runs all the time
  return p;
}

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

std::vector<std::vector<int32_t>> story_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (const std::string& s : kPrompts) p.push_back(encode(stories(), s));
  return p;
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
    Session session(stories(), session_params(1024));
    Sampler sampler(greedy(), stories().config().n_vocab);
    Generator generator(session, stories().tokenizer(), sampler);
    Session draft_session(stories("Q4_0"), session_params(1024));
    const std::unique_ptr<Drafter> drafter = make_model_drafter(draft_session, greedy(), 0.0f);
    if (speculative) generator.set_speculative(drafter.get(), fixed_length(4));
    Chat chat(generator, stories().tokenizer(), ChatTemplate(builtin_chat_template("chatml")));
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
    Session session(stories(), session_params(512));
    Sampler sampler(greedy(), stories().config().n_vocab);
    Generator generator(session, stories().tokenizer(), sampler);
    Session draft_session(stories("Q4_0"), session_params(512));
    const std::unique_ptr<Drafter> drafter = make_model_drafter(draft_session, greedy(), 0.0f);
    if (speculative) generator.set_speculative(drafter.get(), fixed_length(6));
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

// Tiny random-weight files of other families on stories260K's 512-token vocabulary: the
// F32 target and its Q4_0 copy as the draft (they disagree now and then).
struct FamilyPair {
  std::unique_ptr<Model> target, draft;
};
const FamilyPair& family(const std::string& shape) {
  static std::map<std::string, FamilyPair> pairs;
  FamilyPair& p = pairs[shape];
  if (p.target) return p;
  gen::GenerateOptions o;
  o.shape = *gen::find_shape(shape);
  o.type = TensorType::F32;
  o.seed = 11;
  o.weight_std = 0.1;
  o.norm_jitter = 0.3;
  o.tie_output = true;
  const std::unique_ptr<gguf::File> vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
  const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
  const std::string f32 = temp_dir() + "/" + shape + ".gguf", q4 = temp_dir() + "/" + shape + "-q4_0.gguf";
  write_file(f32, std::string(bytes.begin(), bytes.end()));
  const CommandResult r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32) + " " + shell_quote(q4) + " Q4_0");
  if (r.exit_code != 0) throw std::runtime_error("kiln quantize failed: " + r.err);
  p.target = Model::load(f32);
  p.draft = Model::load(q4);
  return p;
}

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

// ------------------------------------------------------------------ sampling

TEST(SpecSampling, VerifyDrawsFromTheTargetDistributionWhateverTheDraft) {
  // Logits over 12 tokens; q a different distribution over an overlapping set (some of
  // p's tokens have q = 0, some of q's have p = 0 after top-k): the output must follow p.
  const int32_t n_vocab = 12;
  std::vector<float> logits(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) logits[size_t(i)] = float(std::sin(1.7 * i) * 2.0);
  SamplerParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 8;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = 5;
  Sampler target(sp, n_vocab);
  std::vector<double> p(n_vocab, 0.0);
  for (const TokenProb& t : target.candidates(logits)) p[size_t(t.id)] = t.p;
  std::vector<TokenProb> q;
  const double q_raw[n_vocab] = {0.3, 0, 0.05, 0.2, 0, 0.1, 0.02, 0.13, 0, 0.1, 0.05, 0.05};
  for (int32_t i = 0; i < n_vocab; ++i)
    if (q_raw[i] > 0) q.push_back(TokenProb{i, 0.0f, float(q_raw[i])});
  std::mt19937_64 draft_rng(9);
  std::discrete_distribution<int32_t> draw_q(std::begin(q_raw), std::end(q_raw));
  const int n = 200000;
  std::vector<double> observed(n_vocab, 0.0), expected(n_vocab, 0.0);
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t proposed = draw_q(draft_rng);
    const int32_t out = target.verify(logits, proposed, q);
    kept += out == proposed;
    observed[size_t(out)] += 1;
  }
  for (int32_t i = 0; i < n_vocab; ++i) expected[size_t(i)] = p[size_t(i)] * n;
  int df = 0;
  const double stat = chi_square(observed, expected, df);
  EXPECT_LT(stat, chi_square_critical(df)) << "df " << df;
  // Acceptance is sum_x min(p, q): check it too (the overlap of the two).
  double overlap = 0;
  for (int32_t i = 0; i < n_vocab; ++i) overlap += std::min(p[size_t(i)], q_raw[i]);
  EXPECT_NEAR(double(kept) / n, overlap, 0.01);
}

TEST(SpecSampling, PointMassDraftsKeepTheTargetDistribution) {
  // n-gram drafts carry no q: a point mass, kept with probability p(token).
  const int32_t n_vocab = 6;
  const std::vector<float> logits = {1.0f, 0.5f, -0.2f, 2.0f, 0.0f, -1.0f};
  SamplerParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = 3;
  Sampler target(sp, n_vocab);
  std::vector<double> expected(n_vocab, 0.0), observed(n_vocab, 0.0);
  const int n = 100000;
  for (const TokenProb& t : target.candidates(logits)) expected[size_t(t.id)] = t.p * n;
  for (int i = 0; i < n; ++i) observed[size_t(target.verify(logits, 3, {}))] += 1;
  int df = 0;
  const double stat = chi_square(observed, expected, df);
  EXPECT_LT(stat, chi_square_critical(df)) << "df " << df;
}

TEST(SpecSampling, ContinuationsDistributedAsWithoutADraft) {
  // Thousands of three-token continuations sampled with and without a draft that samples
  // from another distribution (Q4_0 weights at a higher temperature): the two samples
  // come from one distribution (two-sample chi-square over the continuations).
  const std::vector<int32_t> prompt = encode(stories(), "Once upon a time, there was a");
  SamplerParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 6;
  sp.top_p = 0.95f;
  sp.min_p = 0.05f;
  sp.repeat_penalty = 1.1f;  // the chain, penalties included, is what verification uses
  SamplerParams draft_sp = sp;
  draft_sp.temperature = 1.3f;
  draft_sp.top_k = 10;
  draft_sp.seed = 77;
  const int n = kSanitized ? 600 : 3000;
  std::map<std::vector<int32_t>, std::pair<double, double>> counts;
  int32_t drafted = 0, accepted = 0;
  for (bool speculative : {false, true}) {
    Session session(stories(), session_params(64));
    Session draft_session(stories("Q4_0"), session_params(64));
    const std::unique_ptr<Drafter> drafter = make_model_drafter(draft_session, draft_sp, 0.0f);
    for (int i = 0; i < n; ++i) {
      sp.seed = uint64_t(1000 + i) + (speculative ? 500000 : 0);
      Sampler sampler(sp, stories().config().n_vocab);
      Generator generator(session, stories().tokenizer(), sampler);
      if (speculative) generator.set_speculative(drafter.get(), fixed_length(2));
      generator.reset();
      const GenerationStats st = generator.generate(prompt, 3, [](std::string_view) {});
      drafted += st.spec.n_drafted;
      accepted += st.spec.n_accepted;
      const std::vector<int32_t>& h = generator.history();
      const std::vector<int32_t> tail(h.end() - 3, h.end());
      (speculative ? counts[tail].second : counts[tail].first) += 1;
    }
  }
  ASSERT_GE(drafted, n);  // one draft per continuation at least (room for one before the length limit)
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  std::vector<std::pair<double, double>> cells;
  for (const auto& [seq, c] : counts) cells.push_back(c);
  int df = 0;
  const double stat = chi_square_two_samples(cells, df);
  EXPECT_LT(stat, chi_square_critical(df)) << counts.size() << " continuations";
}

// ------------------------------------------------------------------ adaptive

TEST(SpecAdaptive, AUselessDraftIsSwitchedOff) {
  // Another family's random weights as the draft: it agrees with stories260K almost
  // never and costs a decode per token. After a short draft or two the controller stops
  // drafting, but for probes ever further apart.
  const FamilyPair& other = family("qwen2-tiny");
  RunSetup run;
  run.spec.draft_max = 8;  // adaptive
  run.spec.draft_p_min = 0;
  DraftSource draft{other.target.get()};
  const std::vector<int32_t> prompt = story_prompts()[0];
  const Output spec = generate(stories(), run, prompt, 400, &draft);
  EXPECT_EQ(spec.tokens, generate(stories(), run, prompt, 400, nullptr).tokens);
  EXPECT_LE(spec.stats.spec.n_verify, 3 + SpecController::kProbes);
  EXPECT_LE(spec.stats.spec.n_drafted, 3 * 8 + SpecController::kProbes);
}

// Drives a controller through n steps of a drafter that keeps each requested slot with
// probability `alpha` (deterministic: every slot kept while the running sum allows) at the
// given costs; returns the draft lengths chosen.
std::vector<int32_t> drive(SpecController& c, int steps, double alpha, double plain_ms, double draft_step_ms,
                           double verify_base_ms, double verify_per_token_ms) {
  std::vector<int32_t> chosen;
  double credit = 0;
  for (int i = 0; i < steps; ++i) {
    const int32_t k = c.choose(100);
    chosen.push_back(k);
    if (k == 0) {
      c.plain_step(plain_ms);
      continue;
    }
    int32_t accepted = 0;
    while (accepted < k && (credit += alpha) >= 1.0) credit -= 1.0, ++accepted;
    c.drafted(k, k, k, k * draft_step_ms);
    c.verified(k + 1, verify_base_ms + verify_per_token_ms * (k + 1), k, accepted);
  }
  return chosen;
}

TEST(SpecAdaptive, ControllerFollowsTheMeasuredCosts) {
  SpeculativeParams p;
  p.draft_max = 8;
  // Cheap drafts that are always right: lengths grow from 2 (2, 4, 8) to the longest.
  SpecController good(p);
  EXPECT_EQ(good.choose(100), 0);  // a plain step is measured first
  good.plain_step(10.0);
  const std::vector<int32_t> ks = drive(good, 20, 1.0, 10.0, 1.0, 10.0, 0.5);
  EXPECT_EQ(ks[0], 2);
  EXPECT_LE(ks[1], 4);
  EXPECT_EQ(ks.back(), 8);
  EXPECT_EQ(good.choose(3), 3);  // never past the room left
  EXPECT_GT(good.acceptance(), 0.9);

  // Drafts that are always refused: none after the first, but for probes at 16, 32,
  // 64 and 128 plain steps, and none after kProbes failed ones.
  SpecController bad(p);
  bad.plain_step(10.0);
  const std::vector<int32_t> bad_ks = drive(bad, 1000, 0.0, 10.0, 5.0, 10.0, 0.5);
  const int drafted_steps = int(std::count_if(bad_ks.begin(), bad_ks.end(), [](int32_t k) { return k > 0; }));
  EXPECT_EQ(drafted_steps, 1 + SpecController::kProbes);
  EXPECT_TRUE(std::all_of(bad_ks.begin() + 400, bad_ks.end(), [](int32_t k) { return k == 0; }));

  // Right half the time, but a draft token costs as much as a target step: off.
  SpecController costly(p);
  costly.plain_step(10.0);
  const std::vector<int32_t> costly_ks = drive(costly, 40, 0.5, 10.0, 10.0, 10.0, 0.2);
  // The first short draft, then probes only (after 16 and 32 plain steps).
  EXPECT_LE(std::count_if(costly_ks.begin(), costly_ks.end(), [](int32_t k) { return k > 0; }), 3);

  // Free n-gram drafts right 70% of the time, verification nearly flat: a middle length
  // (1 + a + ... + a^k saturates while the verification keeps costing).
  SpecController ngram(p);
  ngram.plain_step(10.0);
  const std::vector<int32_t> ngram_ks = drive(ngram, 60, 0.7, 10.0, 0.01, 10.0, 0.6);
  EXPECT_GE(ngram_ks.back(), 2);
  EXPECT_LE(ngram_ks.back(), 8);

  // A draft cut short by --draft-p-min (nothing proposed) is a refusal: drafting stops.
  SpecController unsure(p);
  unsure.plain_step(10.0);
  for (int i = 0; i < 10; ++i) {
    const int32_t k = unsure.choose(100);
    if (k == 0) {
      unsure.plain_step(10.0);
      continue;
    }
    unsure.drafted(k, 0, 1, 4.0);
    unsure.plain_step(10.0);
  }
  EXPECT_LT(unsure.acceptance(), 0.5);  // below the prior's even odds
  EXPECT_EQ(unsure.choose(100), 0);
}

TEST(SpecParams, OutOfRangeNamesTheFlag) {
  SpeculativeParams p;
  p.draft_max = 0;
  try {
    validate(p);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--draft-max"), std::string::npos);
  }
  p.draft_max = 4;
  p.draft_min = 5;
  EXPECT_THROW(validate(p), UsageError);
  p.draft_min = 0;
  p.draft_p_min = 1.5f;
  EXPECT_THROW(validate(p), UsageError);
}

// ------------------------------------------------------------------ the command line

std::string kiln_cmd(const std::string& args) { return shell_quote(kiln_binary()) + " " + args; }

TEST(SpecCli, RunWithADraftPrintsThePlainAnswerAndItsStats) {
  const std::string model = shell_quote(stories_path("F32")), draft = shell_quote(stories_path("Q4_0"));
  const std::string common = "run " + model + " 'Once upon a time' -n 80 --temp 0 -t 2";
  const CommandResult plain = run_command(kiln_cmd(common));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (const std::string& extra : {" -md " + draft, " --model-draft " + draft + " --draft-max 4 --draft-min 1",
                                   std::string(" --spec-type ngram --spec-ngram-n 2")}) {
    SCOPED_TRACE(extra);
    const CommandResult spec = run_command(kiln_cmd(common + extra));
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out);
    EXPECT_NE(spec.err.find("speculative: drafted"), std::string::npos) << spec.err;
    EXPECT_NE(spec.err.find("(accept "), std::string::npos) << spec.err;
    EXPECT_NE(spec.err.find("mean accepted length"), std::string::npos) << spec.err;
  }
}

TEST(SpecCli, BadDraftsAndFlagsAreOneLineErrors) {
  const std::string model = shell_quote(stories_path("F32"));
  const std::string spm = shared_path("vocab/ggml-vocab-llama-spm.gguf");
  // ggml-vocab-llama-spm.gguf has a vocabulary and no weights: the vocabulary check is
  // what must answer, so write a tiny model with it.
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("tiny");
  o.type = TensorType::F32;
  const std::vector<uint8_t> bytes = gen::build_model(o, *gguf::File::open(spm)).to_bytes();
  const std::string other = temp_dir() + "/other-vocab.gguf";
  write_file(other, std::string(bytes.begin(), bytes.end()));
  expect_one_line_error(run_command(kiln_cmd("run " + model + " hi -n 4 -md " + shell_quote(other))), 1, "other-vocab.gguf");
  const CommandResult r = run_command(kiln_cmd("run " + model + " hi -n 4 -md " + shell_quote(other)));
  EXPECT_NE(r.err.find("stories260K"), std::string::npos) << r.err;
  expect_one_line_error(run_command(kiln_cmd("run " + model + " hi -n 4 --spec-type ngram --draft-max 0")), 2,
                        "--draft-max");
  expect_one_line_error(run_command(kiln_cmd("run " + model + " hi -n 4 --spec-type draft")), 2, "--model-draft");
  expect_one_line_error(run_command(kiln_cmd("run " + model + " hi -n 4 --spec-type ngram --parallel 2")), 2,
                        "--parallel");
  expect_one_line_error(run_command(kiln_cmd("run " + model + " hi -n 4 -md /nonexistent/draft.gguf")), 1,
                        "/nonexistent/draft.gguf");
}

}  // namespace
