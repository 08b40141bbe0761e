#pragma once
// The stages of the sampling chain as free functions over a candidate array, so
// Sampler::sample (member buffers) and Sampler::candidates (local buffers) share them.
// Semantics follow llama.cpp's samplers of the same names.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/sampler.h"

namespace kiln::sampling {

// A prefix of a TokenProb buffer. `sorted` means data[0..size) is in chain order
// (descending logit, ties by ascending id), which lets later stages skip work.
struct CandidateSet {
  TokenProb* data = nullptr;
  size_t size = 0;
  bool sorted = false;
};

// Strict total order used everywhere: higher logit first, lower id on ties, so every
// result is deterministic regardless of std::sort/nth_element internals.
inline bool better(const TokenProb& a, const TokenProb& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

bool penalties_active(const SamplerParams& p);

// One token's logit after repeat/frequency/presence penalties for `count` occurrences.
inline float penalize(float logit, int32_t count, const SamplerParams& p) {
  // Repeat penalty must push toward "less likely" on both signs, hence the split.
  logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
  return logit - static_cast<float>(count) * p.frequency_penalty -
         static_cast<float>(count > 0) * p.presence_penalty;
}

// Argmax of the penalized logits, lowest id on ties. `window` holds the penalty
// window's tokens sorted by id (empty when penalties are off).
int32_t greedy(std::span<const float> logits, std::span<const int32_t> window,
               const SamplerParams& p);

// Fills `buf` with the penalized candidates. With 0 < top_k < n it keeps only the
// top_k best (sorted) in one pass without materializing the whole vocabulary.
CandidateSet fill_candidates(std::span<const float> logits, std::span<const int32_t> window,
                             const SamplerParams& p, std::vector<TokenProb>& buf);

void top_p(CandidateSet& c, float p);
void min_p(CandidateSet& c, float p);
void temperature(CandidateSet& c, float t);
// Sets data[i].p to the normalized softmax of the current logits.
void softmax(CandidateSet& c);
// Index into c (whose p are set) drawn with probability p; u is uniform in [0, 1).
size_t draw(const CandidateSet& c, double u);

}  // namespace kiln::sampling
