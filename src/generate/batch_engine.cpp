#include "kiln/batch_engine.h"

#include <algorithm>
#include <cmath>

#include "generate/batch_engine_impl.h"

namespace kiln {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

namespace {

// The longest suffix of `text` that is a proper beginning of some stop string: it may
// still become a stop string, so it is held back.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t keep = 0;
  for (const std::string& s : stops)
    for (size_t n = std::min(text.size(), s.size() - 1); n > keep; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  return keep;
}

}  // namespace


void BatchEngine::Impl::loop() {
  while (true) {
    {
      std::unique_lock lock(mu);
      wake.wait(lock, [&] { return stopping || !waiting.empty() || !running.empty(); });
      if (stopping && !finish_running) {
        for (auto& r : waiting) {
          CompletionEvent last;
          last.done = true;
          last.finish = FinishReason::cancelled;
          last.prompt_tokens = int32_t(r->req.prompt.size());
          r->stream->push(std::move(last));
          ++counters.requests_cancelled;
        }
        waiting.clear();
      }
      if (stopping && waiting.empty() && (running.empty() || !finish_running)) {
        lock.unlock();
        for (size_t i = running.size(); i-- > 0;) finish(i, FinishReason::cancelled);
        return;
      }
      while (int32_t(running.size()) < params.n_parallel && !waiting.empty()) {
        std::unique_ptr<Request> r = std::move(waiting.front());
        waiting.pop_front();
        lock.unlock();
        admit(std::move(r));
        lock.lock();
      }
      counters.running = int32_t(running.size());
      counters.waiting = int32_t(waiting.size());
    }
    step();
  }
}

// A sequence for the request: a fork of the cached prefix that shares the longest
// beginning with its prompt (leaving at least one prompt token to decode, for its
// logits), or an empty one.
void BatchEngine::Impl::admit(std::unique_ptr<Request> r) {
  const std::vector<int32_t>& prompt = r->req.prompt;
  auto best = cache.end();
  size_t best_len = 0;
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    const size_t limit = std::min(it->tokens.size(), prompt.size() - 1);
    size_t n = 0;
    while (n < limit && it->tokens[n] == prompt[n]) ++n;
    if (n > best_len) best = it, best_len = n;
  }
  try {
    if (best != cache.end()) {
      r->seq = session.fork_sequence(best->seq);
      session.truncate_sequence(r->seq, int32_t(best_len));
      r->n_fed = r->cached = session.n_past(r->seq);  // less than best_len where a state cannot go back
      cache.splice(cache.begin(), cache, best);
    } else {
      r->seq = session.add_sequence();
    }
  } catch (const std::exception& e) {
    running.push_back(std::move(r));
    finish(running.size() - 1, FinishReason::error, e.what());
    return;
  }
  for (int32_t t : prompt) r->sampler.accept(t);
  r->history = prompt;
  try {
    start_drafting(*r);
  } catch (const std::exception& e) {
    running.push_back(std::move(r));
    finish(running.size() - 1, FinishReason::error, e.what());
    return;
  }
  running.push_back(std::move(r));
  if (running.back()->req.max_tokens == 0) finish(running.size() - 1, FinishReason::length);
}

void BatchEngine::Impl::step() {
  for (size_t i = running.size(); i-- > 0;)
    if (running[i]->stream->cancelled()) finish(i, FinishReason::cancelled);
  if (running.empty()) return;

  // Decoding requests first, one token each; then prompt chunks, oldest request first,
  // in what is left of the batch.
  std::vector<Session::BatchPart> parts;
  std::vector<size_t> owner, fed;
  int32_t budget = chunk();
  for (size_t i = 0; i < running.size() && budget > 0; ++i)
    if (!running[i]->prefilling()) {
      Request& r = *running[i];
      r.step.assign(1, r.next_token);
      if (r.drafter) draft(r, budget - 1);
      parts.push_back({r.seq, r.step, r.step.size() > 1});
      owner.push_back(i);
      fed.push_back(0);
      budget -= int32_t(r.step.size());
    }
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    Request& r = *running[i];
    if (!r.prefilling()) continue;
    const size_t n = std::min<size_t>(size_t(budget), r.req.prompt.size() - r.n_fed);
    parts.push_back({r.seq, std::span<const int32_t>(&r.req.prompt[r.n_fed], n)});
    owner.push_back(i);
    fed.push_back(n);
    budget -= int32_t(n);
  }

  // Recurrent layers: a verification that refuses drafts goes back to the state before it.
  for (const Session::BatchPart& part : parts)
    if (part.all_logits) session.checkpoint(part.seq);
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits;
  try {
    logits = session.decode_batch(parts);
  } catch (const std::exception& e) {
    for (size_t i = running.size(); i-- > 0;) finish(i, FinishReason::error, e.what());
    return;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t n_decoded = 0, row = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    Request& r = *running[owner[p]];
    const size_t n_rows = parts[p].all_logits ? parts[p].tokens.size() : 1;
    const std::span<const float> rows = logits.subspan(row * size_t(n_vocab), n_rows * size_t(n_vocab));
    row += n_rows;
    if (fed[p] > 0) {
      r.n_fed += fed[p];
      if (r.prefilling()) continue;  // more of the prompt next step
      session.checkpoint(r.seq);  // recurrent layers: a later request extending this prompt goes back here
      sample(r, rows);
      if (r.drafter && r.done == FinishReason::none) r.drafter->prepare(r.req.prompt);
      continue;
    }
    ++n_decoded;
    if (n_rows > 1) {
      verify(r, rows, seconds * 1e3);
    } else {
      if (r.controller) r.controller->plain_step(seconds * 1e3);
      sample(r, rows);
    }
  }
  try {
    rerun_refused();
  } catch (const std::exception& e) {
    for (size_t i = running.size(); i-- > 0;) finish(i, FinishReason::error, e.what());
    return;
  }
  if (n_decoded > 0 && seconds > 0) {
    std::lock_guard lock(mu);
    counters.decode_tokens_per_second = double(n_decoded) / seconds;
  }
  for (size_t i = running.size(); i-- > 0;)
    if (running[i]->done != FinishReason::none) finish(i, running[i]->done);
  refresh_kv_counters();
}

// The request's next token. Ends it (Request::done) on end of generation, a stop string,
// max_tokens or a full context; otherwise the token is decoded next step.
void BatchEngine::Impl::sample(Request& r, std::span<const float> logits) {
  emit(r, r.sampler.sample(adjusted(r, logits)), session.n_past(r.seq));
}

// The request's logit bias and end-of-generation ban applied to one row of logits.
std::span<const float> BatchEngine::Impl::adjusted(const Request& r, std::span<const float> logits) {
  if (r.req.logit_bias.empty() && !r.req.ignore_eos) return logits;
  biased.assign(logits.begin(), logits.end());
  for (auto [id, bias] : r.req.logit_bias) biased[size_t(id)] += bias;
  if (r.req.ignore_eos)
    for (int32_t id : eog_ids) biased[size_t(id)] = -INFINITY;
  return biased;
}

// Records a chosen token that would be decoded at `position`; false when it ends the
// request (Request::done set).
bool BatchEngine::Impl::emit(Request& r, int32_t token, int32_t position) {
  r.sampler.accept(token);
  r.next_token = -1;
  if (tokenizer.is_eog(token)) {
    r.pending += r.detok.flush();
    r.done = FinishReason::stop;
    return false;
  }
  r.generated.push_back(token);
  r.history.push_back(token);
  r.unsent_tokens.push_back(token);
  r.pending += r.detok.push(token);
  for (const std::string& s : r.req.stop) {
    const size_t at = s.empty() ? std::string::npos : r.pending.find(s);
    if (at != std::string::npos) {
      r.pending.resize(at);
      r.done = FinishReason::stop;
      return false;
    }
  }
  const bool at_max = r.req.max_tokens >= 0 && int32_t(r.generated.size()) >= r.req.max_tokens;
  if (at_max || position + 1 > n_ctx) {
    r.pending += r.detok.flush();
    r.done = FinishReason::length;
    return false;
  }
  send(r, false);
  r.next_token = token;
  return true;
}

// Sends the text that can no longer become a stop string (all of it when last).
void BatchEngine::Impl::send(Request& r, bool last) {
  const size_t n = last ? r.pending.size() : r.pending.size() - held_back(r.pending, r.req.stop);
  if (n == 0 && r.unsent_tokens.empty() && !last) return;
  CompletionEvent e;
  e.text = r.pending.substr(0, n);
  r.pending.erase(0, n);
  e.tokens = std::move(r.unsent_tokens);
  r.unsent_tokens.clear();
  e.prompt_tokens = int32_t(r.req.prompt.size());
  e.cached_tokens = r.cached;
  e.completion_tokens = int32_t(r.generated.size());
  e.seed = r.sampler.seed();
  r.stream->push(std::move(e));
}

// Sends the last event and takes the request out of `running`; its sequence becomes a
// cached prefix (the least recently used one beyond capacity is freed) unless it failed.
void BatchEngine::Impl::finish(size_t i, FinishReason why, const std::string& error) {
  std::unique_ptr<Request> r = std::move(running[i]);
  running.erase(running.begin() + ptrdiff_t(i));
  CompletionEvent e;
  e.text = std::move(r->pending);
  e.tokens = std::move(r->unsent_tokens);
  e.done = true;
  e.finish = why;
  e.error = error;
  e.prompt_tokens = int32_t(r->req.prompt.size());
  e.cached_tokens = r->cached;
  e.completion_tokens = int32_t(r->generated.size());
  e.seed = r->sampler.seed();
  {
    std::lock_guard lock(mu);
    counters.prompt_tokens_total += r->req.prompt.size();
    counters.cached_tokens_total += uint64_t(r->cached);
    counters.completion_tokens_total += r->generated.size();
    if (why == FinishReason::cancelled) ++counters.requests_cancelled;
    counters.running = int32_t(running.size());
  }
  if (r->seq >= 0) {
    if (why == FinishReason::error) {
      session.free_sequence(r->seq);
    } else {
      std::vector<int32_t> held = r->req.prompt;
      held.insert(held.end(), r->generated.begin(), r->generated.end());
      held.resize(size_t(session.n_past(r->seq)));
      cache.push_front({r->seq, std::move(held)});
      while (cache.size() > cache_capacity()) {
        session.free_sequence(cache.back().seq);
        cache.pop_back();
      }
    }
  }
  r->stream->push(std::move(e));
}

void BatchEngine::Impl::refresh_kv_counters() {
  const KvMemory m = session.kv_memory();
  std::lock_guard lock(mu);
  counters.kv_blocks_used = size_t(m.blocks_used);
  counters.kv_bytes_used = m.bytes_used;
  counters.kv_bytes_allocated = m.bytes_allocated;
  counters.cached_prefixes = cache.size();
  counters.cached_prefix_tokens = 0;
  for (const CachedPrefix& c : cache) counters.cached_prefix_tokens += c.tokens.size();
}

BatchEngine::BatchEngine(Session& session, const Tokenizer& tokenizer, const Params& params)
    : params_(params), impl_(std::make_unique<Impl>(session, tokenizer, params)) {
  if (session.kv_layout() != KvLayout::paged) throw Error("the batch engine needs the paged KV layout");
  if (params.n_parallel < 1) throw UsageError("-np must be at least 1, got " + std::to_string(params.n_parallel));
  if (params.max_queue < 0) throw UsageError("--max-queue must be at least 0, got " + std::to_string(params.max_queue));
  if (params.spec_type == SpecType::draft && (!params.draft_session || params.draft_session->kv_layout() != KvLayout::paged))
    throw Error("the batch engine's draft model needs a paged session");
  if (session.n_batch() < params.n_parallel)
    throw UsageError("the batch size (-b " + std::to_string(session.n_batch()) + ") must be at least -np (" +
                     std::to_string(params.n_parallel) + ")");
  impl_->thread = std::thread([this] { impl_->loop(); });
}

BatchEngine::~BatchEngine() { shutdown(false); }

std::shared_ptr<CompletionStream> BatchEngine::submit(CompletionRequest request) {
  Impl& s = *impl_;
  if (request.prompt.empty()) throw UsageError("prompt: empty (give at least one token)");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= s.n_vocab)
      throw UsageError("prompt: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                       std::to_string(s.n_vocab - 1) + ")");
  if (int64_t(request.prompt.size()) >= s.n_ctx)
    throw UsageError("prompt: " + std::to_string(request.prompt.size()) + " tokens leave no room in the context of " +
                     std::to_string(s.n_ctx) + " tokens");
  for (auto [id, bias] : request.logit_bias)
    if (id < 0 || id >= s.n_vocab)
      throw UsageError("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary");
  validate(request.sampling);
  auto stream = std::make_shared<batch_engine_detail::Stream>();
  auto r = std::make_unique<Impl::Request>(std::move(request), stream, s.n_vocab, s.tokenizer);
  {
    std::lock_guard lock(s.mu);
    if (s.stopping) throw Error("the server is shutting down");
    if (int32_t(s.waiting.size()) >= params_.max_queue) {
      ++s.counters.requests_rejected;
      throw QueueFullError("the queue is full (" + std::to_string(params_.max_queue) + " requests waiting)");
    }
    ++s.counters.requests_total;
    s.waiting.push_back(std::move(r));
    s.counters.waiting = int32_t(s.waiting.size());
  }
  s.wake.notify_all();
  return stream;
}

void BatchEngine::shutdown(bool finish_running) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (!s.stopping) s.finish_running = finish_running;
    s.stopping = true;
  }
  s.wake.notify_all();
  if (s.thread.joinable()) s.thread.join();
}

BatchEngineMetrics BatchEngine::metrics() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counters;
}

}  // namespace kiln
