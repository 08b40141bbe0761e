#pragma once
// Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a drafter proposes the
// next few tokens cheaply, the target model runs the last sampled token and the draft
// in one batched forward pass (memory-bound: k + 1 tokens cost little more than one), and
// Sampler::verify keeps the longest prefix the target agrees with, so the output is the
// target's: byte for byte under greedy decoding, the same distribution when sampling.
//
// Drafters: a smaller model with the same vocabulary (its own Session, kept in step with
// the conversation by its common prefix), or n-gram lookup in the text so far (prompt
// lookup decoding: no second model). SpecController picks how many tokens to draft each
// step from the measured acceptance rate and the measured costs of a draft token, of a
// verification of n tokens and of a plain decode step, down to none: a useless draft
// costs little more than its probes.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/sampler.h"
#include "kiln/session.h"
#include "kiln/tokenizer.h"

namespace kiln {

enum class SpecType { none, draft, ngram };

struct SpeculativeParams {
  SpecType type = SpecType::none;
  int32_t draft_max = 8;      // --draft-max: tokens drafted per step at most (1..64)
  int32_t draft_min = 0;      // --draft-min: a shorter draft is not verified (a plain step instead)
  float draft_p_min = 0.0f;   // --draft-p-min: the draft model stops when its top probability is below (llama.cpp: 0)
  int32_t ngram_n = 3;        // --spec-ngram-n: the longest n-gram looked up (shorter ones after it)
  bool adaptive = true;       // false: always draft_max (tests, and measuring a fixed k)
};
// Throws UsageError naming the flag for a value out of range.
void validate(const SpeculativeParams& params);

// One step's proposal. q[i] is the distribution tokens[i] was drawn from (for sampling);
// empty q: every token a point mass (greedy drafts, n-grams).
// n_steps: the draft model's forward passes it took (catching up counts one); 0 for n-grams.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenProb>> q;
  int32_t n_steps = 0;
  void clear() {
    tokens.clear();
    q.clear();
    n_steps = 0;
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_tokens tokens that may follow `history` (the whole conversation, its last
  // token sampled but not yet decoded by the target). `sample`: the target samples
  // (temperature > 0) and wants q; otherwise drafts are greedy.
  virtual void draft(std::span<const int32_t> history, int32_t max_tokens, bool sample, Draft& out) = 0;
  // Catches up with a new prompt before generation starts (a draft model's prefill), so
  // the per-step draft cost measured later is the drafting alone.
  virtual void prepare(std::span<const int32_t> history) {}
};

// Prompt lookup: the tokens that followed the latest earlier occurrence of the history's
// last n tokens (n = ngram_n down to 1, the first that occurs).
std::unique_ptr<Drafter> make_ngram_drafter(int32_t ngram_n);
// A draft model through its own session: sequence 0, or with own_sequence a sequence it
// adds and frees (a paged session shared by the drafters of many requests, as the
// server's). `sampling` is the target's (the draft samples with it, penalties off),
// stopping early when its top probability falls below p_min. The session must outlive
// the drafter.
std::unique_ptr<Drafter> make_model_drafter(Session& draft_session, const SamplerParams& sampling, float p_min,
                                            bool own_sequence = false);

// Throws kiln::Error naming both files when the draft's vocabulary differs from the
// target's in a token the draft can emit: a different size beyond special tokens, or
// a token with other text.
void check_draft_vocabulary(const Tokenizer& target, const std::string& target_path, const Tokenizer& draft,
                            const std::string& draft_path);

// Chooses each step's draft length. Costs are measured here (exponential averages of the
// caller's timings), not assumed: a plain decode step, a draft-model step, and the cost
// of verifying n tokens as a line a + b n fitted (least squares, recent passes weighing
// most) to the verifications measured, which every eighth drafting step keeps spread by
// trying one token more or less than the best length. alpha, the chance
// that a requested draft slot ends up accepted (a draft cut short by --draft-p-min counts
// as refused there), is a decayed count. Expected tokens per verification of k drafts:
// (1 - alpha^(k+1)) / (1 - alpha); the k with the best tokens per millisecond wins,
// k = 0 (no draft) included. Lengths grow from 2 by at most doubling the largest
// verification measured, so a useless draft costs a few short steps. While drafting is
// off, a probe drafts one token after kProbeEvery plain steps, then after twice as many
// each time one fails, never after kProbes failures in a row, and only while the time
// drafting has wasted so far (drafts that gained nothing) is within kWasteBudget of the
// whole: a model draft's probe pays for catching up with the whole gap.
class SpecController {
 public:
  explicit SpecController(const SpeculativeParams& params);
  // Draft length for the next step, at most `room` (what the context can still take).
  int32_t choose(int32_t room);
  void plain_step(double ms);
  // A draft call for `requested` tokens proposed `proposed` of them in `steps` draft-model
  // passes taking ms. Fewer than the caller verifies (draft_min, at least 1): no
  // verification follows, and the step counts as refused.
  void drafted(int32_t requested, int32_t proposed, int32_t steps, double ms);
  // A verification of n_tokens (the pending token and the drafts) in ms, of which
  // `accepted` drafts were kept, `requested` having been asked for.
  void verified(int32_t n_tokens, double ms, int32_t requested, int32_t accepted);
  double acceptance() const;

  static constexpr int32_t kProbeEvery = 16;
  static constexpr int32_t kProbes = 4;
  static constexpr double kWasteBudget = 0.03;

 private:
  double verify_ms(int32_t n) const;  // from the fitted line; <0: nothing measured yet
  void outcome(bool useful);          // a probe's result
  SpeculativeParams params_;
  double plain_ms_ = -1, draft_step_ms_ = -1;
  double total_ms_ = 0, wasted_ms_ = 0, last_draft_ms_ = 0;
  // Decayed sums for the least-squares line of verification ms over n tokens.
  double fit_w_ = 0, fit_n_ = 0, fit_nn_ = 0, fit_v_ = 0, fit_nv_ = 0;
  int32_t largest_verified_ = 0;       // tokens in the longest verification so far
  double accepted_ = 1, refused_ = 1;  // decayed counts (a uniform prior)
  int32_t plain_since_probe_ = 0, probe_every_ = kProbeEvery, failed_probes_ = 0, n_drafting_ = 0;
  bool probing_ = false, explored_ = false;
};

// What a generation with speculation did (GenerationStats carries it).
struct SpeculativeStats {
  int32_t n_drafted = 0;   // draft tokens proposed and verified
  int32_t n_accepted = 0;  // of those, kept
  int32_t n_verify = 0;    // batched verification passes
  double acceptance() const { return n_drafted > 0 ? double(n_accepted) / n_drafted : 0.0; }
  // Tokens each verification emitted beyond the pending one: accepted drafts per pass.
  double mean_accepted() const { return n_verify > 0 ? double(n_accepted) / n_verify : 0.0; }
};

}  // namespace kiln
