#pragma once
// BatchEngine's insides, shared by batch_engine.cpp (admission, steps, sampling, the
// prefix cache) and batch_engine_speculation.cpp (drafting and verification). Only the
// engine thread touches Impl but for the members guarded by `mu`.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "kiln/batch_engine.h"

namespace kiln {
namespace batch_engine_detail {

// The reader's side of a request: events queued by the engine thread, taken by the HTTP
// thread that waits on them.
class Stream final : public CompletionStream {
 public:
  bool next(CompletionEvent& event, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    event = std::move(events_.front());
    events_.pop_front();
    return true;
  }
  void cancel() override { cancelled_.store(true); }

  bool cancelled() const { return cancelled_.load(); }
  void push(CompletionEvent event) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CompletionEvent> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace batch_engine_detail

struct BatchEngine::Impl {
  struct Request {
    CompletionRequest req;
    std::shared_ptr<batch_engine_detail::Stream> stream;
    Sampler sampler;
    Detokenizer detok;
    int32_t seq = -1;
    size_t n_fed = 0;    // prompt tokens in the KV cache
    int32_t cached = 0;  // of those, taken from the prefix cache
    std::vector<int32_t> generated;
    int32_t next_token = -1;  // sampled, to be decoded next step
    std::string pending;      // text not yet sent (held back while it may become a stop string)
    std::vector<int32_t> unsent_tokens;
    FinishReason done = FinishReason::none;
    // Speculative decoding (null drafter: none). history: prompt and generated tokens,
    // the last one sampled and not decoded yet; step: next_token and this step's drafts.
    std::unique_ptr<Drafter> drafter;
    std::unique_ptr<SpecController> controller;
    int32_t draft_min = 1;
    std::vector<int32_t> history;
    Draft draft;
    std::vector<int32_t> step;
    int32_t requested = 0;  // draft tokens asked for this step
    int32_t rerun_to = -1;  // recurrent layers: history up to here runs again (rerun_refused)

    Request(CompletionRequest r, std::shared_ptr<batch_engine_detail::Stream> s, int32_t n_vocab, const Tokenizer& tok)
        : req(std::move(r)), stream(std::move(s)), sampler(req.sampling, n_vocab), detok(tok) {}
    bool prefilling() const { return n_fed < req.prompt.size(); }
  };
  // A finished request's sequence, kept for later prompts that start the same way.
  struct CachedPrefix {
    int32_t seq;
    std::vector<int32_t> tokens;  // what its KV holds
  };

  Session& session;
  const Tokenizer& tokenizer;
  const Params params;
  const int32_t n_vocab, n_ctx;
  std::vector<int32_t> eog_ids;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Request>> waiting;   // guarded by mu
  bool stopping = false, finish_running = false;  // guarded by mu
  BatchEngineMetrics counters;                    // guarded by mu

  std::vector<std::unique_ptr<Request>> running;  // engine thread only
  std::list<CachedPrefix> cache;                  // engine thread only, most recent first
  std::vector<float> biased;                      // engine thread only
  std::thread thread;

  Impl(Session& s, const Tokenizer& t, const Params& p)
      : session(s), tokenizer(t), params(p), n_vocab(s.model().config().n_vocab), n_ctx(s.n_ctx()) {
    for (int32_t id = 0; id < tokenizer.n_vocab(); ++id)
      if (tokenizer.is_eog(id)) eog_ids.push_back(id);
  }

  int32_t chunk() const { return params.prefill_chunk > 0 ? std::min(params.prefill_chunk, session.n_batch()) : session.n_batch(); }
  size_t cache_capacity() const { return size_t(std::max(2 * params.n_parallel, 4)); }

  void loop();
  void admit(std::unique_ptr<Request> r);
  void step();
  std::span<const float> adjusted(const Request& r, std::span<const float> logits);
  void sample(Request& r, std::span<const float> logits);
  bool emit(Request& r, int32_t token, int32_t position);
  int32_t draft(Request& r, int32_t room);
  void verify(Request& r, std::span<const float> rows, double step_ms);
  void start_drafting(Request& r);
  void rerun_refused();
  void send(Request& r, bool last);
  void finish(size_t i, FinishReason why, const std::string& error = {});
  void refresh_kv_counters();
};

}  // namespace kiln
