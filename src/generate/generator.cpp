#include "kiln/generator.h"

#include <chrono>
#include <cmath>

#include "kiln/error.h"
#include "util/ms_since.h"

namespace kiln {
const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::none: return "none";
    case StopReason::end_of_generation: return "end of generation";
    case StopReason::length: return "length limit";
    case StopReason::context_full: return "context full";
    case StopReason::cancelled: return "cancelled";
  }
  return "?";
}

Generator::Generator(Session& session, const Tokenizer& tokenizer, Sampler& sampler)
    : session_(session), tokenizer_(tokenizer), sampler_(sampler), evictor_(session, {}, tokenizer.bos()) {}

void Generator::set_ignore_eos(bool ignore) {
  masked_ids_.clear();
  if (!ignore) return;
  for (int32_t id = 0; id < tokenizer_.n_vocab(); ++id)
    if (tokenizer_.is_eog(id)) masked_ids_.push_back(id);
}

void Generator::set_context_shift(bool enabled, int32_t n_keep) {
  KvEvictionParams p;
  p.policy = enabled ? KvEviction::shift : KvEviction::none;
  p.n_keep = n_keep;
  set_kv_eviction(p);
}

void Generator::set_speculative(Drafter* drafter, const SpeculativeParams& params) {
  if (drafter) validate(params);
  drafter_ = drafter;
  spec_params_ = params;
  spec_ = drafter ? std::make_unique<SpecController>(params) : nullptr;
}

void Generator::set_kv_eviction(const KvEvictionParams& params) {
  evictor_ = KvEvictor(session_, params, tokenizer_.bos());
}

std::span<const float> Generator::decode_streaming(GenerationStats& stats) {
  std::span<const float> logits;
  const int32_t step = evictor_.max_step();
  while (size_t(session_.n_past()) < history_.size()) {
    const int32_t n = (int32_t)std::min<size_t>(size_t(step), history_.size() - size_t(session_.n_past()));
    stats.n_discarded += evictor_.make_room(n, history_);
    logits = session_.decode(std::span<const int32_t>(&history_[size_t(session_.n_past())], size_t(n)));
  }
  return logits;
}

void Generator::reset() {
  history_.clear();
  session_.reset();
  sampler_.reset();
}

void Generator::truncate(size_t n) {
  if (n >= history_.size()) return;
  history_.resize(n);
  if ((size_t)session_.n_past() > n) session_.truncate((int32_t)n);
  resync_sampler();
}

void Generator::set_history(std::vector<int32_t> tokens) {
  if ((size_t)session_.n_past() > tokens.size())
    throw Error("conversation of " + std::to_string(tokens.size()) + " tokens, but the cache holds " +
                std::to_string(session_.n_past()));
  history_ = std::move(tokens);
  resync_sampler();
}

void Generator::resync_sampler() {
  sampler_.reset();
  for (int32_t t : history_) sampler_.accept(t);
}

GenerationStats Generator::generate(const std::vector<int32_t>& new_tokens, int32_t n_predict,
                                    const std::function<void(std::string_view)>& on_text,
                                    const std::atomic<bool>* cancel) {
  GenerationStats stats;
  const size_t n_ctx = (size_t)session_.n_ctx();
  const KvEviction policy = evictor_.policy();
  const bool streaming = policy == KvEviction::sink || policy == KvEviction::h2o;
  if (policy == KvEviction::shift)  // room for the prompt, if it fits once the history is dropped
    stats.n_discarded += evictor_.make_room(int32_t(history_.size() + new_tokens.size()) - session_.n_past(), history_);
  const size_t cached = (size_t)session_.n_past();
  const size_t history_before = history_.size();
  if (!streaming && history_before + new_tokens.size() > n_ctx)
    throw Error("prompt does not fit: " + std::to_string(history_before) + " tokens of history + " +
                std::to_string(new_tokens.size()) + " new exceed the context size " +
                std::to_string(session_.n_ctx()) + " (use -c to raise it)");
  if (history_before + new_tokens.size() == cached)
    throw Error("nothing to process: give at least one token");

  history_.insert(history_.end(), new_tokens.begin(), new_tokens.end());
  for (int32_t t : new_tokens) sampler_.accept(t);
  std::vector<int32_t> pending(history_.begin() + (ptrdiff_t)cached, history_.end());

  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits;
  try {
    logits = streaming ? decode_streaming(stats) : session_.decode(pending);
    session_.checkpoint();  // recurrent layers: where a later turn re-rendering the reply goes back to
  } catch (...) {  // leave the conversation as it was (after an eviction: as far as it got)
    if (stats.n_discarded == 0 || !streaming) {
      history_.resize(history_before);
      session_.truncate((int32_t)cached);
    } else {
      history_.resize(size_t(session_.n_past()));
    }
    throw;
  }
  if (drafter_ && policy != KvEviction::h2o) drafter_->prepare(history_);
  stats.n_prompt = (int32_t)pending.size();
  stats.prompt_ms = ms_since(t0);

  Detokenizer detok(tokenizer_);
  t0 = std::chrono::steady_clock::now();
  const bool sampling = sampler_.params().temperature > 0.0f;
  const size_t n_vocab = size_t(session_.model().config().n_vocab);
  const auto masked = [&](std::span<const float> row) -> std::span<const float> {
    if (masked_ids_.empty()) return row;
    masked_logits_.assign(row.begin(), row.end());
    for (int32_t id : masked_ids_) masked_logits_[size_t(id)] = -INFINITY;
    return masked_logits_;
  };
  // Records a sampled token and streams its text; false when generation ends with it.
  const auto emit = [&](int32_t token) {
    sampler_.accept(token);
    history_.push_back(token);
    ++stats.n_generated;
    if (tokenizer_.is_eog(token)) {
      stats.stop = StopReason::end_of_generation;
      return false;
    }
    const std::string text = detok.push(token);
    if (!text.empty()) on_text(text);
    if (n_predict >= 0 && stats.n_generated >= n_predict) {
      stats.stop = StopReason::length;
      return false;
    }
    return true;
  };
  int32_t token = -1;     // sampled and emitted, not yet decoded
  bool undecoded = false;  // a verification left `token` to decode next (its correction or bonus)
  while (true) {
    if (!undecoded && n_predict >= 0 && stats.n_generated >= n_predict) { stats.stop = StopReason::length; break; }
    if (cancel && cancel->load()) { stats.stop = StopReason::cancelled; break; }
    if (!undecoded) {
      token = sampler_.sample(masked(logits));
      if (!emit(token)) break;
    }
    undecoded = false;
    const int32_t limit = std::min(session_.n_ctx(), evictor_.budget());
    if (session_.n_past() >= limit) {
      // A shift needs two movable tokens (it drops half of them); the others one.
      const int32_t movable = session_.n_past() - evictor_.kept(history_);
      const int32_t dropped = policy == KvEviction::shift && movable < 2 ? 0 : evictor_.make_room(1, history_);
      if (dropped == 0) { stats.stop = StopReason::context_full; break; }
      stats.n_discarded += dropped;
    }
    // Drafts fit before the limit: eviction happens only on plain steps.
    // H2O's scores would count the refused drafts' queries: plain steps only.
    // Drafts past the length limit could never be emitted: the last token comes from the
    // verification's own row.
    int32_t room = limit - session_.n_past() - 1;
    if (n_predict >= 0) room = std::min(room, n_predict - stats.n_generated - 1);
    const int32_t k = spec_ && policy != KvEviction::h2o && room > 0 ? spec_->choose(room) : 0;
    draft_.clear();
    if (k > 0) {
      const auto td = std::chrono::steady_clock::now();
      drafter_->draft(history_, k, sampling, draft_);
      spec_->drafted(k, int32_t(draft_.tokens.size()), draft_.n_steps, ms_since(td));
      if (int32_t(draft_.tokens.size()) < std::max(1, spec_params_.draft_min)) draft_.clear();
    }
    if (draft_.tokens.empty()) {
      const auto tp = std::chrono::steady_clock::now();
      const int32_t one[1] = {token};
      logits = session_.decode(one);
      if (spec_) spec_->plain_step(ms_since(tp));
      continue;
    }
    // Verification: the pending token and the drafts in one pass; row i of the logits
    // judges draft i, the last row gives the token after a fully accepted draft.
    const int32_t m = int32_t(draft_.tokens.size());
    verify_batch_.assign(1, token);
    verify_batch_.insert(verify_batch_.end(), draft_.tokens.begin(), draft_.tokens.end());
    const int32_t base = session_.n_past();
    session_.checkpoint();  // recurrent layers go back here and re-run the accepted tokens
    const auto tv = std::chrono::steady_clock::now();
    const std::span<const float> rows = session_.decode(verify_batch_, /*all_logits=*/true);
    const double verify_ms = ms_since(tv);
    int32_t accepted = 0;
    bool stopped = false, last_is_draft = false;
    for (int32_t i = 0; i <= m; ++i) {
      if (cancel && cancel->load()) { stats.stop = StopReason::cancelled; stopped = true; break; }
      const std::span<const float> row = masked(rows.subspan(size_t(i) * n_vocab, n_vocab));
      const int32_t t = i < m ? sampler_.verify(row, draft_.tokens[size_t(i)],
                                                draft_.q.empty() ? std::span<const TokenProb>() : draft_.q[size_t(i)])
                              : sampler_.sample(row);
      const bool go_on = emit(t);
      if (i < m && t == draft_.tokens[size_t(i)]) {
        ++accepted;
        if (!go_on) { stopped = true; last_is_draft = true; break; }
        continue;
      }
      token = t;  // the correction (or the bonus token): decoded next
      undecoded = go_on;
      stopped = !go_on;
      break;
    }
    // The cache keeps the pending token and the accepted drafts, but not the last emitted
    // token when generation ended on it (as a plain step leaves it undecoded).
    const int32_t kept = base + 1 + accepted - (last_is_draft ? 1 : 0);
    session_.truncate(kept);
    // A sliding-window ring may have forgotten more than the refused drafts (a batch
    // larger than -b), and recurrent layers go back to the checkpoint before the
    // verification: run again what was lost, as Session::truncate asks.
    if (session_.n_past() < kept)
      session_.decode(std::span<const int32_t>(&history_[size_t(session_.n_past())], size_t(kept - session_.n_past())));
    spec_->verified(m + 1, verify_ms, k, accepted);
    stats.spec.n_drafted += m;
    stats.spec.n_accepted += accepted;
    ++stats.spec.n_verify;
    if (stopped) break;
  }
  const std::string rest = detok.flush();
  if (!rest.empty()) on_text(rest);
  stats.generate_ms = ms_since(t0);
  return stats;
}

}  // namespace kiln
