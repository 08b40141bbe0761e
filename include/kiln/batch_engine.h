#pragma once
// Continuous batching: many completion requests over one paged Session, for `kiln serve`.
//
// One engine thread owns the Session. Each step it builds one batch from
//   - one token of every running request (decode), and
//   - a chunk of the oldest waiting prompt (chunked prefill), so a long prompt is fed over
//     several steps and never stalls the running ones;
// runs it (Session::decode_batch), samples each request's next token with its own
// Sampler, and hands the new text to the request's stream. Requests join and leave between
// steps; at most Params::n_parallel run at once, and past Params::max_queue waiting ones
// submit() refuses at once (the server's 503) instead of queueing without bound.
//
// Speculative decoding (Params::spec_type): a decoding request's part of the batch is its
// pending token and up to --draft-max drafted ones, verified in the same forward pass as
// everyone else's tokens (row by row, Sampler::verify), its rejected drafts then
// truncated from its sequence; each request has its own drafter (a sequence of the
// shared draft session, or n-gram lookup) and SpecController. Greedy output is the same
// as without drafting.
//
// Contract for callers (the HTTP layer): submit() and everything on a CompletionStream are
// thread-safe; events arrive in order; the last event of every stream has done = true
// (also for a cancelled request and after shutdown()), so a reader never waits forever.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/error.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "kiln/speculative.h"
#include "kiln/tokenizer.h"

namespace kiln {

struct CompletionRequest {
  std::vector<int32_t> prompt;  // tokens, BOS included when the caller wants one; not empty
  int32_t max_tokens = -1;      // < 0: until end of generation or a full context
  SamplerParams sampling;
  // The text ends right before the first occurrence of any of these (not included); text
  // that could still become one is held back until it cannot.
  std::vector<std::string> stop;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the token's logit before sampling
  bool ignore_eos = false;
  // Drafting for this request (llama-server's speculative.n_max/n_min/p_min); unset: the
  // engine's Params::spec. draft_max 0: none.
  std::optional<SpeculativeParams> speculative;
};

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct CompletionEvent {
  std::string text;               // new text since the previous event (may be empty)
  std::vector<int32_t> tokens;    // the tokens behind it
  bool done = false;              // the last event of the stream
  FinishReason finish = FinishReason::none;  // set when done
  std::string error;              // FinishReason::error: what went wrong, one line
  int32_t prompt_tokens = 0;      // set when done (and on the first event)
  int32_t cached_tokens = 0;      // prompt tokens whose KV came from the prefix cache
  int32_t completion_tokens = 0;  // generated so far
  uint64_t seed = 0;              // the sampler's seed (the drawn one for a random seed)
};

class CompletionStream {
 public:
  virtual ~CompletionStream() = default;
  // Waits up to `timeout` for the next event; false if none came in time.
  virtual bool next(CompletionEvent& event, std::chrono::milliseconds timeout) = 0;
  // Stops the request within one engine step (a client that went away); the stream then
  // ends with FinishReason::cancelled. Idempotent.
  virtual void cancel() = 0;
};

// submit() when the queue is full: the server answers 503 with Retry-After.
class QueueFullError : public Error {
 public:
  using Error::Error;
};

struct BatchEngineMetrics {
  uint64_t requests_total = 0, requests_cancelled = 0, requests_rejected = 0;
  uint64_t prompt_tokens_total = 0, cached_tokens_total = 0, completion_tokens_total = 0;
  int32_t running = 0, waiting = 0;
  size_t kv_blocks_used = 0;                      // referenced by a running or cached sequence
  double kv_bytes_used = 0, kv_bytes_allocated = 0;  // allocated: the block pool, free blocks included
  size_t cached_prefixes = 0;  // finished requests' sequences kept for prompts that start the same way
  size_t cached_prefix_tokens = 0;  // the positions they hold (shared blocks counted in each)
  double decode_tokens_per_second = 0;  // over the last steps that decoded
  uint64_t draft_tokens_total = 0, draft_accepted_total = 0;  // speculative decoding
};

class BatchEngine {
 public:
  struct Params {
    int32_t n_parallel = 4;  // running requests at most (-np)
    int32_t max_queue = 64;  // waiting requests at most (--max-queue)
    int32_t prefill_chunk = 0;  // prompt tokens per step at most (0: the session's batch size)
    // Speculative decoding: none, n-grams, or a draft model in draft_session (paged, with
    // the target's vocabulary; the engine's, on its thread, until destruction).
    SpecType spec_type = SpecType::none;
    SpeculativeParams spec;
    Session* draft_session = nullptr;
  };
  // The session must use the paged KV layout; it is the engine's until destruction.
  BatchEngine(Session& session, const Tokenizer& tokenizer, const Params& params);
  ~BatchEngine();  // shutdown(false)
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request. Throws UsageError (the caller's 400) for an empty prompt, a prompt
  // that does not fit the context with room for one token, a token outside the vocabulary
  // or invalid sampling settings; QueueFullError past max_queue; Error after shutdown.
  std::shared_ptr<CompletionStream> submit(CompletionRequest request);

  // Stops taking requests; running and waiting ones finish (finish_running) or are
  // cancelled; returns when the engine thread has stopped.
  void shutdown(bool finish_running);

  BatchEngineMetrics metrics() const;
  const Params& params() const { return params_; }

 private:
  struct Impl;
  Params params_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
