#pragma once
// The timed runs behind kiln bench's rows (cmd_bench.cpp builds the rows and prints them).
// Each returns nanoseconds of the timed part.
#include <cstdint>
#include <random>
#include <vector>

#include "cli/common.h"
#include "cli/speculation.h"
#include "kiln/model.h"
#include "kiln/session.h"

namespace kiln::cli {

// n random tokens of the model's vocabulary, BOS first when the model adds one.
std::vector<int32_t> random_tokens(const Model& model, size_t n, std::mt19937& rng);

// A prompt of n_prompt tokens in batches, then n_gen single-token steps, after `depth`
// untimed tokens put in the cache. Without the KV cache every generated token recomputes
// the whole sequence.
double run_once(Session& session, const Model& model, int32_t n_prompt, int32_t n_gen, bool kv_cache, std::mt19937& rng,
                int32_t depth = 0);

// -np: `prefix` tokens (at least one) decoded once into sequence 0 (untimed), n_seq - 1
// forks sharing them, then n_gen timed steps of one token per sequence as one batch; kv
// gets the KV memory of the last step.
double run_parallel_once(Session& session, const Model& model, int32_t prefix, int32_t n_gen, int32_t n_seq,
                         std::mt19937& rng, KvMemory& kv);

// A speculative row: n_gen tokens of greedy generation (end of text ignored) after an
// untimed prompt of depth + kSpeculativePrompt random tokens (the draft and the target
// have something to agree or disagree on), drafting up to n_draft tokens a step (0: none);
// the generation's own clock (the prompt and the draft's catching up with it excluded).
// sum adds the drafting counts.
constexpr int32_t kSpeculativePrompt = 16;
double run_speculative_once(Session& session, const Model& model, const Model* draft_model,
                            const SpeculativeOptions& spec_opts, int32_t n_draft, const ModelOptions& mo, int32_t depth,
                            int32_t n_gen, std::mt19937& rng, SpeculativeStats& sum);

}  // namespace kiln::cli
