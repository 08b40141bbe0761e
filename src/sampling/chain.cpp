#include "sampling/chain.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::sampling {
namespace {

// Calls f(id, penalized logit) for every token in id order. `window` is sorted by id,
// so one cursor walks it alongside the vocabulary: penalties cost O(window), not a
// lookup per token.
template <class F>
void for_each_penalized(std::span<const float> logits, std::span<const int32_t> window,
                        const SamplerParams& p, F&& f) {
  const size_t n = logits.size();
  size_t j = 0;
  size_t next = window.empty() ? n : static_cast<size_t>(window[0]);
  for (size_t i = 0; i < n; ++i) {
    float v = logits[i];
    if (i == next) {
      int32_t count = 0;
      while (j < window.size() && static_cast<size_t>(window[j]) == i) ++j, ++count;
      v = penalize(v, count, p);
      next = j < window.size() ? static_cast<size_t>(window[j]) : n;
    }
    f(i, v);
  }
}

// Float rounding in softmax can leave a mathematically exact boundary (e.g. 0.5 + 0.3
// against p = 0.8) a few ulps short, which would keep one extra token at random-looking
// thresholds. The slack is far below any meaningful probability difference.
constexpr double kTopPSlack = 1e-6;

// Width of each widening step of top-p's candidate band (a factor e^3 ~ 20 in p).
constexpr float kBandNats = 3.0f;

// Above this k, a heap pass costs more than materializing and nth_element.
constexpr size_t kHeapTopKMax = 128;

}  // namespace

bool penalties_active(const SamplerParams& p) {
  return p.penalty_last_n != 0 &&
         (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
}

int32_t greedy(std::span<const float> logits, std::span<const int32_t> window,
               const SamplerParams& p) {
  size_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  // Strict '>' keeps the first (lowest id) of equal maxima.
  for_each_penalized(logits, window, p, [&](size_t i, float v) {
    if (v > best_v) best_v = v, best = i;
  });
  return static_cast<int32_t>(best);
}

CandidateSet fill_candidates(std::span<const float> logits, std::span<const int32_t> window,
                             const SamplerParams& p, std::vector<TokenProb>& buf) {
  const size_t n = logits.size();
  const bool top_k_on = p.top_k > 0 && static_cast<size_t>(p.top_k) < n;
  const size_t k = top_k_on ? static_cast<size_t>(p.top_k) : n;
  const bool use_heap = top_k_on && k <= kHeapTopKMax;
  if (buf.size() < (use_heap ? k : n)) buf.resize(use_heap ? k : n);
  TokenProb* d = buf.data();

  if (use_heap) {
    // Heap of the k best so far with the worst on top: most of a 150k vocabulary is
    // rejected by one comparison, and nothing beyond k entries is ever written. Ids
    // arrive in increasing order, so a tie with the worst never beats it: '>' is exact.
    size_t filled = 0;
    for_each_penalized(logits, window, p, [&](size_t i, float v) {
      const TokenProb t{static_cast<int32_t>(i), v, 0.0f};
      if (filled < k) {
        d[filled++] = t;
        std::push_heap(d, d + filled, better);
      } else if (v > d[0].logit) {
        std::pop_heap(d, d + k, better);
        d[k - 1] = t;
        std::push_heap(d, d + k, better);
      }
    });
    std::sort_heap(d, d + k, better);
    return {d, k, true};
  }

  for_each_penalized(logits, window, p, [&](size_t i, float v) {
    d[i] = TokenProb{static_cast<int32_t>(i), v, 0.0f};
  });
  if (!top_k_on) return {d, n, false};
  std::nth_element(d, d + k - 1, d + n, better);
  std::sort(d, d + k, better);
  return {d, k, true};
}

void softmax(CandidateSet& c) {
  if (c.size == 0) return;
  float max_l = c.data[0].logit;
  if (!c.sorted)
    for (size_t i = 1; i < c.size; ++i) max_l = std::max(max_l, c.data[i].logit);
  // Double accumulation: with 150k terms a float sum drifts visibly.
  double sum = 0.0;
  for (size_t i = 0; i < c.size; ++i) {
    const float e = std::exp(c.data[i].logit - max_l);
    c.data[i].p = e;
    sum += e;
  }
  const double inv = 1.0 / sum;
  for (size_t i = 0; i < c.size; ++i) c.data[i].p = static_cast<float>(c.data[i].p * inv);
}

void top_p(CandidateSet& c, float p) {
  if (p >= 1.0f || c.size <= 1) return;
  softmax(c);
  const double target = static_cast<double>(p) - kTopPSlack;
  size_t front = c.size;  // [0, front) will be sorted and holds at least `target` mass
  if (!c.sorted) {
    // The nucleus is usually a tiny part of the vocabulary (top-k off), so rather than
    // sorting everything, move the tokens within a few nats of the best to the front,
    // widening the band until it carries enough mass. Everything left behind is worse
    // than everything in front, so sorting the front yields a prefix of the full order.
    const float max_l = std::max_element(c.data, c.data + c.size, [](auto& a, auto& b) {
                          return a.logit < b.logit;
                        })->logit;
    front = 0;
    double mass = 0.0;
    for (float delta = kBandNats; front < c.size; delta += kBandNats) {
      // Past ~60 nats the rest weighs < n * e^-60: take it all, -inf logits included.
      const float threshold = delta > 60.0f ? -std::numeric_limits<float>::infinity()
                                            : max_l - delta;
      TokenProb* mid = std::partition(c.data + front, c.data + c.size,
                                      [&](const TokenProb& t) { return t.logit >= threshold; });
      for (TokenProb* t = c.data + front; t < mid; ++t) mass += t->p;
      front = static_cast<size_t>(mid - c.data);
      if (mass >= target) break;
    }
    std::sort(c.data, c.data + front, better);
  }
  // Rounding may let the sorted sum fall a hair short of the band's sum; the whole
  // band is then the answer, which is what the cap at `front` gives.
  double cum = 0.0;
  size_t keep = front;
  for (size_t i = 0; i < front; ++i) {
    cum += c.data[i].p;
    if (cum >= target) {
      keep = i + 1;
      break;
    }
  }
  c.size = keep;
  c.sorted = true;
}

void min_p(CandidateSet& c, float p) {
  if (p <= 0.0f || c.size <= 1) return;
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p): no softmax needed.
  if (c.sorted) {
    const float threshold = c.data[0].logit + std::log(p);
    size_t keep = 1;
    while (keep < c.size && c.data[keep].logit >= threshold) ++keep;
    c.size = keep;
    return;
  }
  const TokenProb* top = std::min_element(c.data, c.data + c.size, better);
  const float threshold = top->logit + std::log(p);
  const TokenProb best = *top;
  // Order-preserving compaction keeps the array in id order, so draws stay reproducible.
  TokenProb* end = std::remove_if(c.data, c.data + c.size,
                                  [&](const TokenProb& t) { return t.logit < threshold; });
  c.size = static_cast<size_t>(end - c.data);
  if (c.size == 0) c.data[c.size++] = best;  // min_p > 1: keep at least the best token
}

void temperature(CandidateSet& c, float t) {
  if (t == 1.0f) return;
  for (size_t i = 0; i < c.size; ++i) c.data[i].logit /= t;
}

size_t draw(const CandidateSet& c, double u) {
  // Scale by the actual sum rather than assuming 1 so rounding never biases the tail.
  double sum = 0.0;
  for (size_t i = 0; i < c.size; ++i) sum += c.data[i].p;
  const double target = u * sum;
  double cum = 0.0;
  for (size_t i = 0; i < c.size; ++i) {
    cum += c.data[i].p;
    if (target < cum) return i;
  }
  return c.size - 1;
}

}  // namespace kiln::sampling
