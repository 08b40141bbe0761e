#include "kiln/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kiln/error.h"

namespace kiln {

void validate(const SpeculativeParams& p) {
  if (p.draft_max < 1 || p.draft_max > 64)
    throw UsageError("draft_max (--draft-max) must be in [1, 64], got " + std::to_string(p.draft_max));
  if (p.draft_min < 0 || p.draft_min > p.draft_max)
    throw UsageError("draft_min (--draft-min) must be in [0, --draft-max], got " + std::to_string(p.draft_min));
  if (!(p.draft_p_min >= 0.0f && p.draft_p_min <= 1.0f))
    throw UsageError("draft_p_min (--draft-p-min) must be in [0, 1], got " + std::to_string(p.draft_p_min));
  if (p.ngram_n < 1 || p.ngram_n > 64)
    throw UsageError("ngram_n (--spec-ngram-n) must be in [1, 64], got " + std::to_string(p.ngram_n));
}

namespace {

// ------------------------------------------------------------------ n-gram lookup

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(int32_t n) : n_(n) {}
  void draft(std::span<const int32_t> history, int32_t max_tokens, bool, Draft& out) override {
    out.clear();
    const size_t len = history.size();
    for (size_t n = std::min<size_t>(size_t(n_), len > 0 ? len - 1 : 0); n >= 1; --n) {
      const std::span<const int32_t> tail = history.subspan(len - n);
      // The latest earlier occurrence: what the text did most recently after this n-gram.
      for (size_t start = len - n; start-- > 0;) {
        if (!std::equal(tail.begin(), tail.end(), history.begin() + ptrdiff_t(start))) continue;
        for (size_t i = start + n; i < len && out.tokens.size() < size_t(max_tokens); ++i) out.tokens.push_back(history[i]);
        return;
      }
    }
  }

 private:
  int32_t n_;
};

// ------------------------------------------------------------------ draft model

SamplerParams draft_sampling(SamplerParams p) {
  // q only has to be what the draft drew from; penalties would need the draft's own
  // history kept in step, for little gain in agreement.
  p.repeat_penalty = 1.0f;
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.0f;
  // Its own stream: the target's acceptance draws must not repeat the draft's.
  if (p.seed != SamplerParams::kRandomSeed) p.seed = p.seed * 0x9E3779B97F4A7C15ull + 1;
  return p;
}

float top_probability(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - double(max));
  return float(1.0 / sum);
}

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(Session& s, const SamplerParams& p, float p_min, bool own_sequence)
      : session_(s),
        sampler_(draft_sampling(p), s.model().config().n_vocab),
        p_min_(p_min),
        seq_(own_sequence ? s.add_sequence() : 0),
        own_(own_sequence) {}
  ~ModelDrafter() override {
    if (own_) session_.free_sequence(seq_);
  }

  void prepare(std::span<const int32_t> history) override {
    if (history.empty() || int64_t(history.size()) >= session_.n_ctx()) return;
    catch_up(history, /*redo_last=*/false);
  }

  void draft(std::span<const int32_t> history, int32_t max_tokens, bool sample, Draft& out) override {
    out.clear();
    if (history.empty() || int64_t(history.size()) + max_tokens > session_.n_ctx()) return;
    std::span<const float> logits = catch_up(history, /*redo_last=*/true);
    // A recurrent draft model goes back here when the target refuses some of the drafts
    // (Session::checkpoint), and runs the accepted ones again.
    session_.checkpoint(seq_);
    out.n_steps = 1;
    for (int32_t i = 0; i < max_tokens; ++i) {
      int32_t token;
      float p_top;
      if (sample) {
        token = sampler_.sample(logits, dist_);
        p_top = 0;
        for (const TokenProb& t : dist_) p_top = std::max(p_top, t.p);
      } else {
        token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        p_top = p_min_ > 0 ? top_probability(logits) : 1.0f;
      }
      if (p_top < p_min_) break;
      out.tokens.push_back(token);
      if (sample) out.q.push_back(dist_);
      if (i + 1 == max_tokens) break;
      const int32_t one[1] = {token};
      logits = session_.decode_sequence(seq_, one);
      ++out.n_steps;
      cached_.push_back(token);
    }
  }

 private:
  // Makes the cache hold `history`: keeps what it shares with it and decodes the rest
  // (the forgotten part: refused drafts, or tokens an eviction dropped from the target's
  // history). redo_last: the last token is decoded even when cached, for its logits.
  std::span<const float> catch_up(std::span<const int32_t> history, bool redo_last) {
    size_t common = 0;
    while (common < cached_.size() && common < history.size() && cached_[common] == history[common]) ++common;
    if (redo_last) common = std::min(common, history.size() - 1);
    if (common < cached_.size()) {
      session_.truncate_sequence(seq_, int32_t(common));
      common = size_t(session_.n_past(seq_));  // a sliding-window ring may have forgotten more
      cached_.resize(common);
    }
    std::span<const float> logits;
    if (common < history.size()) logits = session_.decode_sequence(seq_, history.subspan(common));
    cached_.assign(history.begin(), history.end());
    return logits;
  }

  Session& session_;
  Sampler sampler_;
  float p_min_;
  int32_t seq_;
  bool own_;
  std::vector<int32_t> cached_;  // what sequence seq_ holds (n_past(seq_) == size)
  std::vector<TokenProb> dist_;
};

bool is_special(const Vocab& v, size_t id) {
  if (id >= v.types.size()) return false;
  const TokenType t = v.types[id];
  return t == TokenType::control || t == TokenType::unused || t == TokenType::undefined;
}

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(int32_t ngram_n) { return std::make_unique<NgramDrafter>(ngram_n); }

std::unique_ptr<Drafter> make_model_drafter(Session& draft_session, const SamplerParams& sampling, float p_min,
                                            bool own_sequence) {
  return std::make_unique<ModelDrafter>(draft_session, sampling, p_min, own_sequence);
}

void check_draft_vocabulary(const Tokenizer& target, const std::string& target_path, const Tokenizer& draft,
                            const std::string& draft_path) {
  const Vocab& t = target.vocab();
  const Vocab& d = draft.vocab();
  const auto refuse = [&](const std::string& what) {
    throw Error("draft model " + draft_path + " does not share the vocabulary of " + target_path + ": " + what);
  };
  if (t.model != d.model) refuse("tokenizer " + d.model + " vs " + t.model);
  const size_t common = std::min(t.size(), d.size());
  for (size_t id = 0; id < common; ++id)
    if (t.tokens[id] != d.tokens[id] && !(is_special(t, id) && is_special(d, id)))
      refuse("token " + std::to_string(id) + " is '" + d.tokens[id] + "' in the draft, '" + t.tokens[id] + "' in the target");
  // Extra tokens at the end: fine when they are special ones (padding, added control
  // tokens) that a draft never emits in text.
  const Vocab& longer = t.size() > d.size() ? t : d;
  for (size_t id = common; id < longer.size(); ++id)
    if (!is_special(longer, id))
      refuse(std::to_string(d.size()) + " tokens in the draft, " + std::to_string(t.size()) + " in the target, and token " +
             std::to_string(id) + " ('" + longer.tokens[id] + "') is not a special token");
}

// ------------------------------------------------------------------ controller

SpecController::SpecController(const SpeculativeParams& params) : params_(params) {}

namespace {
void average(double& avg, double x) { avg = avg < 0 ? x : 0.8 * avg + 0.2 * x; }
constexpr double kDecay = 0.9;  // of the acceptance counts, per draft step
}  // namespace

void SpecController::plain_step(double ms) {
  average(plain_ms_, ms);
  total_ms_ += ms;
  ++plain_since_probe_;
}

void SpecController::drafted(int32_t requested, int32_t proposed, int32_t steps, double ms) {
  average(draft_step_ms_, ms / std::max(steps, 1));
  explored_ = true;
  total_ms_ += ms;
  last_draft_ms_ = ms;
  if (proposed >= std::max(1, params_.draft_min)) return;
  wasted_ms_ += ms;
  accepted_ *= kDecay;
  refused_ = refused_ * kDecay + 1;
  outcome(false);
}

void SpecController::verified(int32_t n_tokens, double ms, int32_t requested, int32_t accepted) {
  if (n_tokens < 2) return;
  constexpr double kFitDecay = 0.95;
  const double n = n_tokens;
  fit_w_ = fit_w_ * kFitDecay + 1;
  fit_n_ = fit_n_ * kFitDecay + n;
  fit_nn_ = fit_nn_ * kFitDecay + n * n;
  fit_v_ = fit_v_ * kFitDecay + ms;
  fit_nv_ = fit_nv_ * kFitDecay + n * ms;
  largest_verified_ = std::max(largest_verified_, n_tokens);
  total_ms_ += ms;
  if (accepted == 0) wasted_ms_ += last_draft_ms_ + std::max(0.0, ms - std::max(plain_ms_, 0.0));
  // Each slot up to the first refusal was a trial; later ones were not tried.
  accepted_ = accepted_ * kDecay + accepted;
  refused_ = refused_ * kDecay + (accepted < requested ? 1 : 0);
  outcome(accepted > 0);
}

void SpecController::outcome(bool useful) {
  plain_since_probe_ = 0;
  if (!probing_) return;
  probing_ = false;
  if (useful) {
    probe_every_ = kProbeEvery, failed_probes_ = 0;
  } else {
    probe_every_ *= 2, ++failed_probes_;
  }
}

double SpecController::acceptance() const { return accepted_ / (accepted_ + refused_); }

double SpecController::verify_ms(int32_t n) const {
  if (fit_w_ <= 0) return -1;
  const double mean_n = fit_n_ / fit_w_, mean_v = fit_v_ / fit_w_;
  const double var_n = fit_nn_ / fit_w_ - mean_n * mean_n;
  double slope;
  if (var_n > 0.25) {  // sizes spread enough to fit a line
    slope = (fit_nv_ / fit_w_ - mean_n * mean_v) / var_n;
  } else if (plain_ms_ > 0 && mean_n > 1.5) {  // one size so far: through the plain step
    slope = (mean_v - plain_ms_) / (mean_n - 1);
  } else {
    slope = 0;
  }
  slope = std::max(slope, 0.0);
  return std::max(mean_v + slope * (double(n) - mean_n), 1e-3);
}

int32_t SpecController::choose(int32_t room) {
  const int32_t k_min = std::max(1, params_.draft_min);
  int32_t k_max = std::min(params_.draft_max, room);
  if (k_max < k_min) return 0;
  if (!params_.adaptive) return k_max;
  if (plain_ms_ < 0) return 0;  // a plain step is measured first
  // Slow start: at most twice the longest draft verified so far.
  k_max = std::min(k_max, std::max({2, k_min, 2 * (largest_verified_ - 1)}));
  if (!explored_) return k_max;  // one short draft before judging
  const double alpha = acceptance();
  const double draft_ms = std::max(draft_step_ms_, 0.0);
  int32_t best_k = 0;
  double best_rate = 1.0 / plain_ms_;
  for (int32_t k = k_min; k <= k_max; ++k) {
    const double cost = verify_ms(k + 1);
    if (cost <= 0) continue;
    const double expected = alpha >= 1.0 ? k + 1 : (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
    const double rate = expected / (k * draft_ms + cost);
    if (rate > best_rate) best_rate = rate, best_k = k;
  }
  if (best_k > 0) {
    // Now and then a neighbouring length, so the cost line stays fitted around the best.
    if (++n_drafting_ % 8 == 0) best_k += (n_drafting_ / 8) % 2 ? 1 : -1;
    return std::clamp(best_k, k_min, std::min(params_.draft_max, room));
  }
  if (failed_probes_ < kProbes && plain_since_probe_ >= probe_every_ && wasted_ms_ <= kWasteBudget * total_ms_) {
    probing_ = true;
    return k_min;
  }
  return 0;
}

}  // namespace kiln
