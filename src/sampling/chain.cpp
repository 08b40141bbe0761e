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
  if (buf.size() < n) buf.resize(n);
  TokenProb* d = buf.data();

  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    // Heap of the k best so far with the worst on top: most of a 150k vocabulary is
    // rejected by one comparison, and nothing beyond k entries is ever written.
    const size_t k = static_cast<size_t>(p.top_k);
    size_t filled = 0;
    for_each_penalized(logits, window, p, [&](size_t i, float v) {
      const TokenProb t{static_cast<int32_t>(i), v, 0.0f};
      if (filled < k) {
        d[filled++] = t;
        std::push_heap(d, d + filled, better);
      } else if (better(t, d[0])) {
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
  return {d, n, false};
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
  // Sort lazily in growing chunks: the nucleus is usually a few dozen tokens, so a full
  // vocabulary sort (top-k off) would be wasted. Anything past sorted_end is no better
  // than what precedes it, so partial_sort on the tail extends the sorted prefix.
  size_t sorted_end = c.sorted ? c.size : 0;
  const double target = static_cast<double>(p) - kTopPSlack;
  double cum = 0.0;
  for (size_t i = 0; i < c.size; ++i) {
    if (i == sorted_end) {
      const size_t next = std::min(c.size, std::max<size_t>(64, sorted_end * 4));
      std::partial_sort(c.data + sorted_end, c.data + next, c.data + c.size, better);
      sorted_end = next;
    }
    cum += c.data[i].p;
    if (cum >= target) {
      c.size = i + 1;
      break;
    }
  }
  c.sorted = true;  // every kept entry lies in the sorted prefix
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
