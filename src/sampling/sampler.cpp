#include "kiln/sampler.h"

#include <algorithm>
#include <string>

#include "kiln/error.h"
#include "sampling/chain.h"

namespace kiln {
namespace {

constexpr uint64_t kRandomSeed = 0xFFFFFFFF;

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

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), seed_(params.seed) {
  if (n_vocab <= 0) throw Error("sampler: n_vocab must be positive, got " + std::to_string(n_vocab));
  set_params(params);
}

void Sampler::set_params(const SamplerParams& params) {
  if (params.penalty_last_n < -1)
    throw UsageError("penalty_last_n must be >= -1, got " + std::to_string(params.penalty_last_n));
  if (!(params.repeat_penalty > 0.0f))
    throw UsageError("repeat_penalty must be > 0, got " + std::to_string(params.repeat_penalty));
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
