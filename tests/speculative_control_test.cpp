// Speculative sampling keeps the target's distribution (chi-square against the exact
// distribution and two-sample end to end), the controller follows the measured costs and
// switches a useless draft off, parameters are range-checked, and the command line (run,
// chat with -md or --spec-type ngram) answers as without drafting, with one-line errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/error.h"
#include "speculative_fixture.h"

using namespace kiln;
using namespace kiln::test;

namespace {

// ------------------------------------------------------------------ sampling

// Temperature and top-k only (top-p and min-p off), seeded.
SamplerParams plain_sampling(float temperature, int32_t top_k, uint64_t seed) {
  SamplerParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = seed;
  return sp;
}

TEST(SpecSampling, VerifyDrawsFromTheTargetDistributionWhateverTheDraft) {
  // Logits over 12 tokens; q a different distribution over an overlapping set (some of
  // p's tokens have q = 0, some of q's have p = 0 after top-k): the output must follow p.
  const int32_t n_vocab = 12;
  std::vector<float> logits(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) logits[size_t(i)] = float(std::sin(1.7 * i) * 2.0);
  Sampler target(plain_sampling(0.9f, 8, 5), n_vocab);
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
  Sampler target(plain_sampling(1.0f, 0, 3), n_vocab);
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

// A drafter that is always wrong (it proposes BOS, which stories260K never generates) and
// slow (2 ms a call, ~40 decode steps of the model): whatever the machine's load, drafting
// with it loses by far, so the outcome does not hang on timing noise.
class UselessDrafter final : public Drafter {
 public:
  int32_t calls = 0;
  void draft(std::span<const int32_t>, int32_t max_tokens, bool, Draft& out) override {
    out.clear();
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    out.tokens.assign(size_t(max_tokens), stories().tokenizer().bos());
    out.n_steps = max_tokens;
  }
};

TEST(SpecAdaptive, AUselessDraftIsSwitchedOff) {
  // After the first short draft the controller stops drafting; probes are allowed only
  // within the waste budget, which a 2 ms draft against 400 fast steps leaves no room for.
  const std::vector<int32_t> prompt = story_prompts()[0];
  Session session(stories(), session_params(512));
  Sampler sampler(greedy(), stories().config().n_vocab);
  Generator generator(session, stories().tokenizer(), sampler);
  UselessDrafter drafter;
  SpeculativeParams p;
  p.draft_max = 8;  // adaptive
  generator.set_speculative(&drafter, p);
  const GenerationStats st = generator.generate(prompt, 400, [](std::string_view) {});
  EXPECT_EQ(generator.history(), generate(stories(), RunSetup{}, prompt, 400, nullptr).tokens);
  EXPECT_EQ(st.spec.n_accepted, 0);
  EXPECT_GE(drafter.calls, 1);
  EXPECT_LE(drafter.calls, 1 + SpecController::kProbes);
  EXPECT_LE(st.spec.n_drafted, 2 + SpecController::kProbes);  // the first draft is 2 long, probes 1
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

TEST(SpecCli, ChatWithADraftAnswersAsWithout) {
  const std::string model = shell_quote(stories_path("F32")), draft = shell_quote(stories_path("Q4_0"));
  const std::string input = "Once upon a time\nThe dog ran\n/bye\n";
  const std::string common = "chat " + model + " --temp 0 -n 60 -t 2 --chat-template chatml";
  const CommandResult plain = run_command(kiln_cmd(common), input);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const CommandResult spec = run_command(kiln_cmd(common + " -md " + draft + " --draft-max 5 --verbose"), input);
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out);
  EXPECT_NE(spec.err.find("speculative: drafted"), std::string::npos) << spec.err;
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
