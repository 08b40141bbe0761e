#pragma once
// A Session runs the forward pass of one Model over a sequence, keeping the KV cache so
// each call only computes the tokens it is given. Buffers are allocated once here; the
// per-token path allocates nothing.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/model.h"

namespace kiln {

struct SessionParams {
  int32_t n_ctx = 0;      // 0: the model's context_length capped at 4096
  int32_t n_batch = 512;  // tokens per prefill step (matrix x matrix)
  int32_t n_threads = 0;  // 0: physical cores
};

class Session {
 public:
  Session(const Model& model, const SessionParams& params);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends `tokens` at positions n_past().. and runs them through the model (in batches
  // of n_batch). Returns the logits of the last token, or of every token when all_logits
  // (then row i is tokens[i], n_vocab floats each). Throws kiln::Error if the context
  // would overflow (nothing is appended then) or a token id is out of range.
  std::span<const float> decode(std::span<const int32_t> tokens, bool all_logits = false);

  int32_t n_past() const;
  int32_t n_ctx() const;
  int32_t n_threads() const;
  // Forgets positions >= n (the next decode continues from n).
  void truncate(int32_t n);
  void reset() { truncate(0); }

  const Model& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
