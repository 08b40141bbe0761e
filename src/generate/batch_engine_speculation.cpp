// Speculative decoding inside a continuous batch: each request drafts on its own (a
// sequence of the shared draft session, or n-grams), its part of the step's batch is its
// pending token and the drafts, and its rows are verified as the Generator verifies a
// single sequence's (see kiln/batch_engine.h).
#include <chrono>

#include "generate/batch_engine_impl.h"
#include "kiln/error.h"
#include "util/ms_since.h"

namespace kiln {

void BatchEngine::Impl::start_drafting(Request& r) {
  const SpeculativeParams spec = r.req.speculative.value_or(params.spec);
  if (params.spec_type == SpecType::none || spec.draft_max < 1) return;
  validate(spec);
  if (params.spec_type == SpecType::ngram) r.drafter = make_ngram_drafter(spec.ngram_n);
  else r.drafter = make_model_drafter(*params.draft_session, r.req.sampling, spec.draft_p_min, /*own_sequence=*/true);
  r.controller = std::make_unique<SpecController>(spec);
  r.draft_min = std::max(1, spec.draft_min);
}

// Appends this step's drafts to r.step (at most `room`, what the batch has left); the
// number asked for.
int32_t BatchEngine::Impl::draft(Request& r, int32_t room) {
  room = std::min(room, n_ctx - session.n_past(r.seq) - 1);
  if (r.req.max_tokens >= 0) room = std::min(room, r.req.max_tokens - int32_t(r.generated.size()) - 1);
  r.requested = room > 0 ? r.controller->choose(room) : 0;
  r.draft.clear();
  if (r.requested == 0) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  r.drafter->draft(r.history, r.requested, r.req.sampling.temperature > 0, r.draft);
  r.controller->drafted(r.requested, int32_t(r.draft.tokens.size()), r.draft.n_steps, ms_since(t0));
  if (int32_t(r.draft.tokens.size()) < r.draft_min) r.draft.clear();
  r.step.insert(r.step.end(), r.draft.tokens.begin(), r.draft.tokens.end());
  return r.requested;
}

// Row i of `rows` judges draft i (the last row gives the token after a fully accepted
// draft); the sequence then keeps the pending token and the accepted drafts.
void BatchEngine::Impl::verify(Request& r, std::span<const float> rows, double step_ms) {
  const int32_t m = int32_t(r.draft.tokens.size());
  const int32_t base = session.n_past(r.seq) - (m + 1);
  int32_t accepted = 0;
  bool last_is_draft = false;
  for (int32_t i = 0; i <= m; ++i) {
    const std::span<const float> row = adjusted(r, rows.subspan(size_t(i) * size_t(n_vocab), size_t(n_vocab)));
    const int32_t t = i < m ? r.sampler.verify(row, r.draft.tokens[size_t(i)],
                                               r.draft.q.empty() ? std::span<const TokenProb>() : r.draft.q[size_t(i)])
                            : r.sampler.sample(row);
    const bool go_on = emit(r, t, base + 1 + i);
    if (i < m && t == r.draft.tokens[size_t(i)]) {
      ++accepted;
      if (go_on) continue;
      last_is_draft = true;
    }
    break;
  }
  const int32_t kept = base + 1 + accepted - (last_is_draft ? 1 : 0);
  session.truncate_sequence(r.seq, kept);
  // Recurrent layers went back to the checkpoint taken before this step: the accepted
  // tokens run again after the step (rerun_refused), not now, while `rows` still lives.
  if (session.n_past(r.seq) < kept) r.rerun_to = kept;
  r.controller->verified(m + 1, step_ms, r.requested, accepted);
  std::lock_guard lock(mu);
  counters.draft_tokens_total += uint64_t(m);
  counters.draft_accepted_total += uint64_t(accepted);
}

// One more pass for the requests whose verification sent a recurrent state back to its
// checkpoint: their accepted tokens, all in one batch (no logits needed: each request's
// next token was chosen by the verification).
void BatchEngine::Impl::rerun_refused() {
  std::vector<Session::BatchPart> parts;
  for (const std::unique_ptr<Request>& r : running) {
    if (r->rerun_to < 0) continue;
    const int32_t from = session.n_past(r->seq);
    parts.push_back({r->seq, std::span<const int32_t>(&r->history[size_t(from)], size_t(r->rerun_to - from))});
    r->rerun_to = -1;
  }
  if (!parts.empty()) session.decode_batch(parts);
}

}  // namespace kiln
