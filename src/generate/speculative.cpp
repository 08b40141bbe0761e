#include "kiln/speculative.h"

#include <algorithm>
#include <cmath>

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
  ModelDrafter(Session& s, const SamplerParams& p, float p_min)
      : session_(s), sampler_(draft_sampling(p), s.model().config().n_vocab), p_min_(p_min) {}

  void prepare(std::span<const int32_t> history) override {
    if (history.empty() || int64_t(history.size()) >= session_.n_ctx()) return;
    catch_up(history, /*redo_last=*/false);
  }

  void draft(std::span<const int32_t> history, int32_t max_tokens, bool sample, Draft& out) override {
    out.clear();
    if (history.empty() || int64_t(history.size()) + max_tokens > session_.n_ctx()) return;
    std::span<const float> logits = catch_up(history, /*redo_last=*/true);
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
      logits = session_.decode(one);
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
      session_.truncate(int32_t(common));
      common = size_t(session_.n_past());  // a sliding-window ring may have forgotten more
      cached_.resize(common);
    }
    std::span<const float> logits;
    if (common < history.size()) logits = session_.decode(history.subspan(common));
    cached_.assign(history.begin(), history.end());
    return logits;
  }

  Session& session_;
  Sampler sampler_;
  float p_min_;
  std::vector<int32_t> cached_;  // what session_ holds (n_past() == size)
  std::vector<TokenProb> dist_;
};

bool is_special(const Vocab& v, size_t id) {
  if (id >= v.types.size()) return false;
  const TokenType t = v.types[id];
  return t == TokenType::control || t == TokenType::unused || t == TokenType::undefined;
}

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(int32_t ngram_n) { return std::make_unique<NgramDrafter>(ngram_n); }

std::unique_ptr<Drafter> make_model_drafter(Session& draft_session, const SamplerParams& sampling, float p_min) {
  return std::make_unique<ModelDrafter>(draft_session, sampling, p_min);
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
}  // namespace

void SpecController::plain_step(double ms) {
  average(plain_ms_, ms);
  ++plain_since_probe_;
}

void SpecController::drafted(int32_t n_tokens, double ms) {
  if (n_tokens > 0) average(draft_ms_, ms / n_tokens);
}

void SpecController::verified(int32_t n_tokens, double ms, int32_t drafted, int32_t accepted) {
  if (n_tokens < 1 || size_t(n_tokens) >= verify_ms_.size()) return;
  double& v = verify_ms_[size_t(n_tokens)];
  v = v <= 0 ? ms : 0.8 * v + 0.2 * ms;
  // Each drafted token up to the first refusal was a trial; later ones were not tried.
  const double decay = 0.9;
  accepted_ = accepted_ * decay + accepted;
  refused_ = refused_ * decay + (accepted < drafted ? 1 : 0);
  plain_since_probe_ = 0;
}

double SpecController::acceptance() const { return accepted_ / (accepted_ + refused_); }

double SpecController::verify_ms(int32_t n) const {
  if (verify_ms_[size_t(n)] > 0) return verify_ms_[size_t(n)];
  // Linear between the nearest measured sizes (a plain step is a verification of 1);
  // beyond the largest measured size, flat: the cost grows slowly on memory-bound models,
  // and a probe at that size measures it.
  int32_t lo = 0, hi = 0;
  double lo_ms = -1, hi_ms = -1;
  if (plain_ms_ > 0) lo = 1, lo_ms = plain_ms_;
  for (int32_t m = 2; m < n; ++m)
    if (verify_ms_[size_t(m)] > 0) lo = m, lo_ms = verify_ms_[size_t(m)];
  for (int32_t m = n + 1; size_t(m) < verify_ms_.size(); ++m)
    if (verify_ms_[size_t(m)] > 0) {
      hi = m, hi_ms = verify_ms_[size_t(m)];
      break;
    }
  if (lo_ms > 0 && hi_ms > 0) return lo_ms + (hi_ms - lo_ms) * double(n - lo) / double(hi - lo);
  return lo_ms > 0 ? lo_ms : hi_ms;
}

int32_t SpecController::choose(int32_t room) {
  const int32_t k_max = std::min(params_.draft_max, room);
  if (k_max < std::max(1, params_.draft_min)) return 0;
  if (!params_.adaptive) return k_max;
  // Measure before judging: a plain step first, then a verification at the longest draft.
  if (plain_ms_ < 0) return 0;
  if (verify_ms_[size_t(k_max) + 1] <= 0 && verify_ms(k_max + 1) < 0) return k_max;
  const double alpha = acceptance();
  const double draft_ms = std::max(draft_ms_, 0.0);
  int32_t best_k = 0;
  double best_rate = 1.0 / plain_ms_;
  for (int32_t k = std::max(1, params_.draft_min); k <= k_max; ++k) {
    const double cost = verify_ms(k + 1);
    if (cost <= 0) continue;
    const double expected = alpha >= 1.0 ? k + 1 : (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
    const double rate = expected / (k * draft_ms + cost);
    if (rate > best_rate) best_rate = rate, best_k = k;
  }
  if (best_k == 0 && plain_since_probe_ >= kProbeEvery) return std::max(1, params_.draft_min);
  return best_k;
}

}  // namespace kiln
