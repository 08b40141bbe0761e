#pragma once
// Picks the next token from logits through a chain in llama.cpp's order:
// penalties -> top-k -> top-p -> min-p -> temperature -> random draw (greedy if temp <= 0).
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kiln {

struct SamplerParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax after penalties)
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // window of recent tokens the penalties look at; -1: context
  uint64_t seed = 0xFFFFFFFF;   // 0xFFFFFFFF: random seed
};

struct TokenProb {
  int32_t id;
  float logit;
  float p;
};

class Sampler {
 public:
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // Chooses a token from one row of logits (n_vocab floats). Does not record it.
  int32_t sample(std::span<const float> logits);
  // Records a token in the penalty history (prompt tokens and generated ones).
  void accept(int32_t token);
  void reset();  // clears the history and reseeds

  const SamplerParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

  // The candidate list after the whole chain but before the draw (for tests and
  // --verbose): sorted by descending probability, probabilities normalized.
  std::vector<TokenProb> candidates(std::span<const float> logits) const;

 private:
  SamplerParams params_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  std::vector<int32_t> history_;
};

}  // namespace kiln
