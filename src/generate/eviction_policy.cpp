#include "kiln/eviction_policy.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "kiln/error.h"

namespace kiln {

const char* kv_eviction_name(KvEviction p) {
  switch (p) {
    case KvEviction::none: return "none";
    case KvEviction::shift: return "shift";
    case KvEviction::sink: return "sink";
    case KvEviction::h2o: return "h2o";
  }
  return "?";
}

std::optional<KvEviction> parse_kv_eviction(std::string_view name) {
  for (KvEviction p : {KvEviction::none, KvEviction::shift, KvEviction::sink, KvEviction::h2o})
    if (name == kv_eviction_name(p)) return p;
  return std::nullopt;
}

namespace {

void select_h2o_into(std::span<const float> scores, int32_t n_keep, int32_t n_recent, int32_t n_evict,
                     std::vector<int32_t>& order, std::vector<int32_t>& out) {
  out.clear();
  const int32_t end = int32_t(scores.size()) - n_recent;
  if (n_keep < 0 || n_recent < 0 || end <= n_keep || n_evict <= 0) return;
  order.resize(size_t(end - n_keep));
  std::iota(order.begin(), order.end(), n_keep);
  const size_t n = std::min(order.size(), size_t(n_evict));
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n), order.end(), [&](int32_t a, int32_t b) {
    return scores[size_t(a)] != scores[size_t(b)] ? scores[size_t(a)] < scores[size_t(b)] : a < b;
  });
  out.assign(order.begin(), order.begin() + ptrdiff_t(n));
  std::sort(out.begin(), out.end());
}

// Removes the entries at `indices` (ascending) from v, keeping the order of the rest.
void erase_indices(std::vector<int32_t>& v, const std::vector<int32_t>& indices) {
  size_t out = size_t(indices.front()), next = 0;
  for (size_t i = out; i < v.size(); ++i) {
    if (next < indices.size() && size_t(indices[next]) == i) { ++next; continue; }
    v[out++] = v[i];
  }
  v.resize(out);
}

}  // namespace

void select_h2o(std::span<const float> scores, int32_t n_keep, int32_t n_recent, int32_t n_evict,
                std::vector<int32_t>& out) {
  std::vector<int32_t> order;
  select_h2o_into(scores, n_keep, n_recent, n_evict, order, out);
}

KvEvictor::KvEvictor(Session& session, const KvEvictionParams& params, int32_t bos)
    : session_(&session), p_(params), bos_(bos) {
  const int32_t n_ctx = session.n_ctx();
  if (p_.budget < 0 || p_.budget > n_ctx)
    throw Error("KV budget " + std::to_string(p_.budget) + " is outside the context size " + std::to_string(n_ctx) +
                " (0: the whole context)");
  if (p_.n_keep < 0) throw Error("--keep must not be negative");
  if (p_.sink_tokens < 0) throw Error("--sink-tokens must not be negative");
  budget_ = p_.budget > 0 ? p_.budget : n_ctx;
  // sink and h2o need room for the kept tokens, a recent window and a chunk to evict.
  const int32_t front = p_.policy == KvEviction::sink ? p_.sink_tokens : std::max(p_.n_keep, 1);
  if ((p_.policy == KvEviction::sink || p_.policy == KvEviction::h2o) && budget_ < front + 4)
    throw Error("KV budget " + std::to_string(budget_) + " leaves no room after the " + std::to_string(front) +
                " tokens kept at the start (" + kv_eviction_name(p_.policy) + " needs at least " +
                std::to_string(front + 4) + ")");
  chunk_ = std::max(1, budget_ / 32);
  victims_.reserve(size_t(n_ctx));  // no allocation when evicting
  order_.reserve(size_t(n_ctx));
  session.track_attention(p_.policy == KvEviction::h2o);
}

int32_t KvEvictor::kept(const std::vector<int32_t>& tokens) const {
  const int32_t n_past = session_->n_past();
  if (p_.policy == KvEviction::sink) return std::min(p_.sink_tokens, n_past);
  const bool bos_first = !tokens.empty() && bos_ >= 0 && tokens[0] == bos_;
  return std::min<int32_t>(std::max<int32_t>(p_.n_keep, bos_first ? 1 : 0), n_past);
}

int32_t KvEvictor::max_step() const {
  const int32_t front = p_.policy == KvEviction::sink ? p_.sink_tokens : std::max(p_.n_keep, 1);
  return std::max(1, (budget_ - front) / 2);
}

int32_t KvEvictor::make_room(int32_t n_new, std::vector<int32_t>& tokens) {
  Session& s = *session_;
  const int32_t n_past = s.n_past();
  const int64_t need = int64_t(n_past) + n_new - budget_;
  if (need <= 0 || p_.policy == KvEviction::none) return 0;
  const int32_t front = kept(tokens), movable = n_past - front;
  if (need > movable) return 0;
  int32_t n = 0;
  switch (p_.policy) {
    case KvEviction::none: return 0;
    case KvEviction::shift:
      // Half of what may go, or all that must if that is more (llama.cpp's rule).
      n = (int32_t)std::max<int64_t>(need, movable / 2);
      s.shift_context(front, n);
      tokens.erase(tokens.begin() + front, tokens.begin() + front + n);
      return n;
    case KvEviction::sink:
      n = (int32_t)std::min<int64_t>(std::max<int64_t>(need, chunk_), movable);
      victims_.resize(size_t(n));
      std::iota(victims_.begin(), victims_.end(), front);  // the oldest after the sinks
      break;
    case KvEviction::h2o: {
      n = (int32_t)std::min<int64_t>(std::max<int64_t>(need, chunk_), movable);
      // The recent window shrinks only when a long step needs more than the older tokens.
      const int32_t recent = std::min(budget_ / 2, movable - n);
      select_h2o_into(s.attention_scores(), front, recent, n, order_, victims_);
      break;
    }
  }
  s.evict(victims_);
  erase_indices(tokens, victims_);
  return n;
}

}  // namespace kiln
