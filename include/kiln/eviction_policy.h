#pragma once
// What to forget when the KV cache is full, so generation (and scoring) can go on past
// the context in bounded memory:
//   shift  llama.cpp's context shift: drop the older half after the kept tokens.
//   sink   StreamingLLM (Xiao et al. 2023): keep the first sink_tokens ("attention
//          sinks", which soak up attention whatever they say) and a window of the most
//          recent tokens; the oldest tokens after the sinks go first.
//   h2o    Heavy-Hitter Oracle (Zhang et al. 2023): keep the tokens that have received
//          the most attention so far (accumulated softmax probabilities) and a window of
//          recent ones (half the budget, the paper's split); the lowest-scoring older
//          tokens go first. Scores are summed over layers and heads: kiln's cache shares
//          positions across layers, so one eviction set serves them all (the paper picks
//          per layer and head).
// sink and h2o evict in chunks of budget/32 tokens (at least one): the cache moves once
// per chunk, not once per token. Every kept key is turned back by RoPE by the distance it
// moved (Session::evict), so the cache stays contiguous and positions stay < budget.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/session.h"

namespace kiln {

enum class KvEviction { none, shift, sink, h2o };
const char* kv_eviction_name(KvEviction p);
std::optional<KvEviction> parse_kv_eviction(std::string_view name);  // "none", "shift", "sink", "h2o"

struct KvEvictionParams {
  KvEviction policy = KvEviction::none;
  int32_t n_keep = 0;       // shift, h2o: tokens at the start never dropped (a BOS token always)
  int32_t sink_tokens = 4;  // sink: the attention sinks kept at the start
  int32_t budget = 0;       // cached tokens at most (0: the context size)
};

// H2O's choice: the n_evict lowest scores among positions [n_keep, scores.size() - n_recent)
// (ties: the older first), ascending into out. Fewer when there are fewer candidates.
void select_h2o(std::span<const float> scores, int32_t n_keep, int32_t n_recent, int32_t n_evict,
                std::vector<int32_t>& out);

// Applies a policy to one session and the list of tokens it caches (tokens[i] is cached
// at position i for i < n_past(); later entries are not cached yet and are kept).
class KvEvictor {
 public:
  // Throws kiln::Error for a budget above the context size or one that leaves no room
  // after the tokens the policy always keeps. Turns attention tracking on for h2o (off
  // otherwise).
  KvEvictor(Session& session, const KvEvictionParams& params, int32_t bos);

  const KvEvictionParams& params() const { return p_; }
  KvEviction policy() const { return p_.policy; }
  int32_t budget() const { return budget_; }
  // Tokens at the front that are never dropped (BOS and n_keep, or the sinks).
  int32_t kept(const std::vector<int32_t>& tokens) const;
  // The most new tokens make_room can always make room for (sink, h2o: decoding a long
  // prompt in steps of this size never overflows).
  int32_t max_step() const;
  // Drops cached tokens so that n_new more fit in the budget: nothing if they already
  // fit, or if the policy is none or cannot free that many (shift: not more than the
  // movable ones). Returns how many were dropped (from the cache and from tokens alike).
  int32_t make_room(int32_t n_new, std::vector<int32_t>& tokens);

 private:
  Session* session_;
  KvEvictionParams p_;
  int32_t bos_, budget_, chunk_;
  std::vector<int32_t> victims_;
  std::vector<int32_t> order_;  // h2o's candidates while choosing
};

}  // namespace kiln
