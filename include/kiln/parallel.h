#pragma once
// N samples of one prompt at once (kiln run --parallel N): the prompt is decoded once into
// sequence 0 of a paged session, N - 1 forks share its blocks, and every step decodes one
// token of each unfinished sequence as one batch (Session::decode_parallel), so the
// weights stream once per step for all of them. Sequence i samples with seed + i.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/generator.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "kiln/tokenizer.h"

namespace kiln {

struct ParallelParams {
  int32_t n_seq = 1;
  int32_t n_predict = -1;  // tokens per sequence; < 0: until end of generation or a full context
  SamplerParams sampling;  // the random seed (0xFFFFFFFF) is drawn once, then seed + i
  bool ignore_eos = false;
};

struct ParallelSequence {
  std::string text;
  std::vector<int32_t> tokens;  // generated
  uint64_t seed = 0;
  StopReason stop = StopReason::none;
};

struct ParallelResult {
  std::vector<ParallelSequence> seqs;
  int32_t n_prompt = 0;
  int32_t n_generated = 0;  // all sequences together
  double prompt_ms = 0, generate_ms = 0;
  // The most the paged cache held at once, and the most the same sequences would have
  // held without sharing (each field's own maximum over the steps).
  KvMemory peak;
};

// Starts from an empty sequence 0 (the session is reset); forks are freed as their
// sequences end. n_seq > 1 needs a paged session. Throws kiln::Error when the prompt
// leaves no room to generate in the context.
ParallelResult generate_parallel(Session& session, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                                 const ParallelParams& params);

}  // namespace kiln
