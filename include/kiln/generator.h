#pragma once
// The generation loop: feed tokens, sample, stream text, stop. It owns the token history
// of one conversation so later turns only process their new tokens (the Session's KV
// cache already holds the rest).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "kiln/eviction_policy.h"
#include "kiln/sampler.h"
#include "kiln/session.h"
#include "kiln/speculative.h"
#include "kiln/tokenizer.h"

namespace kiln {

enum class StopReason { none, end_of_generation, length, context_full, cancelled };
const char* stop_reason_name(StopReason r);

struct GenerationStats {
  int32_t n_prompt = 0;     // tokens run through the model before the first sample
  int32_t n_generated = 0;  // tokens sampled
  double prompt_ms = 0;
  double generate_ms = 0;   // sampling + decoding of generated tokens
  StopReason stop = StopReason::none;
  int32_t n_discarded = 0;  // tokens the context shift or eviction dropped during this call
  SpeculativeStats spec;    // with a drafter (set_speculative)
};

class Generator {
 public:
  Generator(Session& session, const Tokenizer& tokenizer, Sampler& sampler);

  // Appends `new_tokens` to the history, runs whatever the cache lacks, then samples up to
  // n_predict tokens (< 0: until end of generation or a full context), calling on_text with
  // each piece of complete UTF-8 text. `cancel` (optional) stops between tokens.
  // If the new tokens cannot fit in the context, throws kiln::Error and the history and
  // cache are left as before the call (but for a context shift that made room).
  GenerationStats generate(const std::vector<int32_t>& new_tokens, int32_t n_predict,
                           const std::function<void(std::string_view)>& on_text,
                           const std::atomic<bool>* cancel = nullptr);

  const std::vector<int32_t>& history() const { return history_; }
  // Keep generating through end-of-generation tokens (they are never sampled).
  void set_ignore_eos(bool ignore);
  // Forgets everything (a new conversation).
  void reset();
  // Forgets the tokens from index n on (the cache too); n >= history().size() does nothing.
  void truncate(size_t n);
  // Takes over a conversation whose first session.n_past() tokens are already cached
  // (restored from a session file); the rest, at most one token, is decoded with the next
  // turn. Throws kiln::Error if the cache holds more than `tokens`.
  void set_history(std::vector<int32_t> tokens);
  // Re-feeds the history to the sampler's penalty window (after its settings changed).
  void resync_sampler();
  // Context shift (llama.cpp's --context-shift): when the context is full, keep the first
  // n_keep tokens of the history (the BOS token always), drop half of the rest and go on
  // (Session::shift_context). Off by default: a full context stops generation. A prompt
  // that does not fit makes room the same way, if it fits once the history is dropped.
  // The same as set_kv_eviction({enabled ? shift : none, n_keep}).
  void set_context_shift(bool enabled, int32_t n_keep = 0);
  // KV-cache eviction (kiln/eviction_policy.h): shift as above, but at params.budget; sink and
  // h2o evict a few tokens whenever the cache reaches the budget and never stop for a full
  // context: a prompt longer than the budget is decoded in steps with eviction between
  // them (if one step fails, the conversation keeps what was decoded before it). Dropped
  // tokens leave history() too and count in GenerationStats::n_discarded. Throws
  // kiln::Error for a budget the policy cannot work with (see KvEvictor).
  void set_kv_eviction(const KvEvictionParams& params);
  const KvEvictor& kv_evictor() const { return evictor_; }
  // Speculative decoding (kiln/speculative.h): each step `drafter` proposes up to
  // params.draft_max tokens (as many as the controller finds worth it) and one batched
  // pass of the session verifies them; the output is what plain decoding gives (greedy:
  // the same bytes; sampling: the same distribution). nullptr turns it off. The drafter
  // is the caller's and must outlive its use here. Throws UsageError for bad params.
  void set_speculative(Drafter* drafter, const SpeculativeParams& params = {});

 private:
  Session& session_;
  const Tokenizer& tokenizer_;
  Sampler& sampler_;
  std::vector<int32_t> masked_ids_;  // end-of-generation ids, when they are ignored
  std::vector<float> masked_logits_;
  std::vector<int32_t> history_;  // every token of the conversation; the last may not be cached yet
  KvEvictor evictor_;
  Drafter* drafter_ = nullptr;
  SpeculativeParams spec_params_;
  std::unique_ptr<SpecController> spec_;
  Draft draft_;
  std::vector<int32_t> verify_batch_;

  // Decodes history_ from the cache's end on in steps that fit the budget (sink, h2o).
  std::span<const float> decode_streaming(GenerationStats& stats);
};

}  // namespace kiln
