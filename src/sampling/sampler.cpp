#include "kiln/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/error.h"
#include "sampling/chain.h"

namespace kiln {
namespace {

constexpr uint64_t kRandomSeed = SamplerParams::kRandomSeed;

std::string number(double v) {
  std::string s = std::to_string(v);
  if (s.find('.') != std::string::npos) s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

[[noreturn]] void out_of_range(const char* name, const char* flag, const char* range, double v) {
  throw UsageError(std::string(name) + " (" + flag + ") must be " + range + ", got " + number(v));
}

// 53 random bits -> [0, 1). Spelled out instead of std::uniform_real_distribution so a
// seed gives the same tokens with every standard library.
double uniform01(std::mt19937& rng) {
  const uint32_t a = rng() >> 5, b = rng() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

// Everything after the penalties up to (and including) softmax; greedy never gets here.
sampling::CandidateSet run_chain(const SamplerParams& p, std::span<const float> logits,
                                 std::span<const int32_t> window, std::vector<TokenProb>& buf) {
  sampling::CandidateSet c = sampling::fill_candidates(logits, window, p, buf);  // + top-k
  sampling::top_p(c, p.top_p);
  sampling::min_p(c, p.min_p);
  sampling::temperature(c, p.temperature);
  sampling::softmax(c);
  return c;
}

}  // namespace

void validate(const SamplerParams& p) {
  // Written so that NaN fails every check.
  if (!(p.temperature >= 0.0f && std::isfinite(p.temperature)))
    out_of_range("temperature", "--temp", ">= 0 (0: greedy)", p.temperature);
  if (p.top_k < 0) out_of_range("top_k", "--top-k", ">= 0 (0: off)", p.top_k);
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) out_of_range("top_p", "--top-p", "in [0, 1] (1: off)", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) out_of_range("min_p", "--min-p", "in [0, 1] (0: off)", p.min_p);
  if (!(p.repeat_penalty > 0.0f && std::isfinite(p.repeat_penalty)))
    out_of_range("repeat_penalty", "--repeat-penalty", "> 0 (1: off)", p.repeat_penalty);
  if (!std::isfinite(p.presence_penalty))
    out_of_range("presence_penalty", "--presence-penalty", "a finite number (0: off)", p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty))
    out_of_range("frequency_penalty", "--frequency-penalty", "a finite number (0: off)", p.frequency_penalty);
  if (p.penalty_last_n < -1)
    out_of_range("penalty_last_n", "--repeat-last-n", ">= -1 (-1: the context)", p.penalty_last_n);
}

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), seed_(params.seed) {
  if (n_vocab <= 0) throw Error("sampler: n_vocab must be positive, got " + std::to_string(n_vocab));
  set_params(params);
}

void Sampler::set_params(const SamplerParams& params) {
  validate(params);
  params_ = params;
  if (params.penalty_last_n > 0) {
    history_.reserve(static_cast<size_t>(params.penalty_last_n));
    window_.reserve(static_cast<size_t>(params.penalty_last_n));
  }
  reset();
}

void Sampler::reseed() {
  seed_ = params_.seed;
  if (seed_ == kRandomSeed) {
    std::random_device rd;
    // Never report the sentinel itself: feeding seed() back must reproduce the run.
    do seed_ = rd(); while (seed_ == kRandomSeed);
  }
  if (seed_ <= 0xFFFFFFFFu) {
    // Same seeding as llama.cpp's std::mt19937(seed) for 32-bit seeds.
    rng_.seed(static_cast<uint32_t>(seed_));
  } else {
    std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    rng_.seed(seq);
  }
}

void Sampler::check_logits(std::span<const float> logits) const {
  if (logits.size() != static_cast<size_t>(n_vocab_))
    throw Error("sampler: got " + std::to_string(logits.size()) + " logits, expected n_vocab " +
                std::to_string(n_vocab_));
}

void Sampler::sorted_window(std::vector<int32_t>& out) const {
  out.clear();
  if (!sampling::penalties_active(params_)) return;
  out.assign(history_.begin(), history_.end());
  std::sort(out.begin(), out.end());
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_)
    throw Error("sampler: token " + std::to_string(token) + " outside vocabulary of " +
                std::to_string(n_vocab_));
  const int32_t cap = params_.penalty_last_n;
  if (cap == 0) return;  // no penalty window, nothing to remember
  if (cap < 0 || history_.size() < static_cast<size_t>(cap)) {
    history_.push_back(token);
    return;
  }
  history_[history_head_] = token;  // overwrite the oldest
  history_head_ = (history_head_ + 1) % static_cast<size_t>(cap);
}

void Sampler::reset() {
  history_.clear();
  history_head_ = 0;
  reseed();
}

int32_t Sampler::sample(std::span<const float> logits) {
  check_logits(logits);
  sorted_window(window_);
  if (params_.temperature <= 0.0f) return sampling::greedy(logits, window_, params_);
  sampling::CandidateSet c = run_chain(params_, logits, window_, buf_);
  return c.data[sampling::draw(c, uniform01(rng_))].id;
}

int32_t Sampler::sample(std::span<const float> logits, std::vector<TokenProb>& distribution) {
  check_logits(logits);
  sorted_window(window_);
  if (params_.temperature <= 0.0f) {
    const int32_t id = sampling::greedy(logits, window_, params_);
    distribution.assign(1, TokenProb{id, logits[size_t(id)], 1.0f});
    return id;
  }
  sampling::CandidateSet c = run_chain(params_, logits, window_, buf_);
  distribution.assign(c.data, c.data + c.size);
  return c.data[sampling::draw(c, uniform01(rng_))].id;
}

int32_t Sampler::verify(std::span<const float> logits, int32_t token, std::span<const TokenProb> q) {
  check_logits(logits);
  sorted_window(window_);
  if (params_.temperature <= 0.0f) return sampling::greedy(logits, window_, params_);
  sampling::CandidateSet c = run_chain(params_, logits, window_, buf_);
  // q by token id, in a vocabulary-sized scratch row cleared again on the way out.
  q_dense_.resize(size_t(n_vocab_), 0.0f);
  const TokenProb point{token, 0.0f, 1.0f};
  const std::span<const TokenProb> q_set = q.empty() ? std::span<const TokenProb>(&point, 1) : q;
  for (const TokenProb& t : q_set)
    if (t.id >= 0 && t.id < n_vocab_) q_dense_[size_t(t.id)] = t.p;
  struct Clear {
    std::vector<float>& row;
    std::span<const TokenProb> set;
    ~Clear() {
      for (const TokenProb& t : set)
        if (t.id >= 0 && size_t(t.id) < row.size()) row[size_t(t.id)] = 0.0f;
    }
  } clear{q_dense_, q_set};
  const auto residual = [&](const TokenProb& t) { return std::max(0.0, double(t.p) - double(q_dense_[size_t(t.id)])); };

  double p_token = 0;
  for (size_t i = 0; i < c.size; ++i)
    if (c.data[i].id == token) p_token = c.data[i].p;
  const double q_token = token >= 0 && token < n_vocab_ ? q_dense_[size_t(token)] : 0.0;
  // Keep with probability min(1, p/q): u * q < p. A token the draft could not have drawn
  // (q = 0) is never kept.
  if (q_token > 0 && uniform01(rng_) * q_token < p_token) return token;
  // The replacement from the residual max(0, p - q) over the candidates (outside them p
  // is 0, and so is the residual), by inverse CDF. An empty residual means p <= q
  // everywhere, so p = q and the token was only refused for a q of 0: draw from p.
  double total = 0;
  for (size_t i = 0; i < c.size; ++i) total += residual(c.data[i]);
  if (!(total > 0)) return c.data[sampling::draw(c, uniform01(rng_))].id;
  double u = uniform01(rng_) * total;
  size_t last = 0;
  for (size_t i = 0; i < c.size; ++i) {
    const double r = residual(c.data[i]);
    if (r <= 0) continue;
    if (u < r) return c.data[i].id;
    u -= r;
    last = i;
  }
  return c.data[last].id;  // rounding left u just past the end
}

std::vector<TokenProb> Sampler::candidates(std::span<const float> logits) const {
  check_logits(logits);
  std::vector<int32_t> window;
  sorted_window(window);
  if (params_.temperature <= 0.0f) {
    const int32_t id = sampling::greedy(logits, window, params_);
    const auto [lo, hi] = std::equal_range(window.begin(), window.end(), id);
    const int32_t count = static_cast<int32_t>(hi - lo);
    const float logit = count > 0 ? sampling::penalize(logits[id], count, params_) : logits[id];
    return {TokenProb{id, logit, 1.0f}};
  }
  std::vector<TokenProb> buf;
  sampling::CandidateSet c = run_chain(params_, logits, window, buf);
  if (!c.sorted) std::sort(c.data, c.data + c.size, sampling::better);
  return std::vector<TokenProb>(c.data, c.data + c.size);
}

}  // namespace kiln
