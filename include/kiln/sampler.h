#pragma once
// Picks the next token from logits through a chain in llama.cpp's order:
// penalties -> top-k -> top-p -> min-p -> temperature -> random draw (greedy if temp <= 0).
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kiln {

struct SamplerParams {
  float temperature = 0.8f;     // 0: greedy (argmax after penalties)
  int32_t top_k = 40;           // 0: off
  float top_p = 0.95f;          // 1: off
  float min_p = 0.05f;          // 0: off
  float repeat_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // window of recent tokens the penalties look at; -1: context
  uint64_t seed = kRandomSeed;  // kRandomSeed: a fresh one per reset, reported by Sampler::seed()

  // llama.cpp's LLAMA_DEFAULT_SEED; `-s -1` on the command line means it too.
  static constexpr uint64_t kRandomSeed = 0xFFFFFFFF;
};

// The valid range of every setting, in one place for the command line, chat's /set and a
// server's request: throws UsageError naming the setting (as `name (--flag)`), its range
// and the value, e.g. "top_p (--top-p) must be in [0, 1], got 7".
void validate(const SamplerParams& params);

struct TokenProb {
  int32_t id;
  float logit;
  float p;
};

class Sampler {
 public:
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // Chooses a token from one row of logits (n_vocab floats). Does not record it.
  // Throws kiln::Error if logits.size() != n_vocab.
  int32_t sample(std::span<const float> logits);
  // The same, and `distribution` gets what the token was drawn from (the candidates after
  // the whole chain, p normalized; greedy: the argmax with p = 1). A draft model's draws
  // keep it for the target's verification.
  int32_t sample(std::span<const float> logits, std::vector<TokenProb>& distribution);
  // Speculative sampling of one drafted token (Leviathan et al. 2023, Chen et al. 2023):
  // with p this sampler's distribution for these logits (the whole chain: penalties on
  // the tokens accepted so far, top-k/p, min-p, temperature) and q the distribution the
  // draft drew `token` from (empty: a point mass, as for an n-gram draft), keeps `token`
  // with probability min(1, p/q) and otherwise draws from max(0, p - q) normalized, so
  // the result is distributed as p whatever the draft. Greedy: the argmax. Returns the
  // token to emit (`token` when kept); does not record it.
  int32_t verify(std::span<const float> logits, int32_t token, std::span<const TokenProb> q);
  // Records a token in the penalty history (prompt tokens and generated ones).
  // Throws kiln::Error for a token outside [0, n_vocab).
  void accept(int32_t token);
  // Clears the history and reseeds: a fixed seed replays the same draws, the random
  // seed (0xFFFFFFFF) picks a fresh one, as llama.cpp's dist sampler does.
  void reset();
  // New settings (a chat's /set): validated like the constructor's, then reset(); the
  // caller re-accepts the tokens the penalties should still see.
  void set_params(const SamplerParams& params);

  const SamplerParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

  // The candidate list after the whole chain but before the draw (for tests and
  // --verbose): sorted by descending probability, probabilities normalized.
  // Greedy (temperature <= 0) yields the single argmax with p = 1.
  std::vector<TokenProb> candidates(std::span<const float> logits) const;

 private:
  void reseed();
  void check_logits(std::span<const float> logits) const;
  // The penalty window's tokens sorted by id into `out` (empty when penalties are off).
  void sorted_window(std::vector<int32_t>& out) const;

  SamplerParams params_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  // Ring buffer of the last penalty_last_n accepted tokens (unbounded for -1); only
  // counts matter, so the order inside it is irrelevant.
  std::vector<int32_t> history_;
  size_t history_head_ = 0;
  // Scratch reused by sample() so a call allocates nothing once warmed up.
  std::vector<TokenProb> buf_;
  std::vector<int32_t> window_;
  std::vector<float> q_dense_;  // verify(): the draft's q by token id, zero between calls
};

}  // namespace kiln
