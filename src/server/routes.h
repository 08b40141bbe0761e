#pragma once
// What the route files share inside the server: the backend once it is ready, the
// request counters for /metrics, JSON replies and the streaming of a CompletionStream.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "server/http_server.h"

namespace kiln::server {

struct ServerState {
  std::mutex mu;
  Backend* backend = nullptr;  // set once ready
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  std::string id_salt;  // random per process: ids stay unique across restarts
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::map<std::string, uint64_t> responses;  // "route status" -> count, for /metrics (under mu)
  // Responses still sending a stream: stop() lets them send their last chunk.
  std::atomic<int> open_streams{0};

  // The backend, or ApiError 503 while the model loads (or after stop()).
  Backend& ready();
  std::string new_id(const char* prefix);
};

// Wraps a route: every exception becomes one JSON error response (ApiError: its status;
// QueueFullError: 503 with Retry-After; UsageError: 400; any other: 500). `ollama`
// routes answer {"error": "message"} as ollama does.
httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> route,
                                 bool ollama = false);

void reply_json(httplib::Response& res, const json& body, int status = 200);

// The engine, or ApiError 501 (not_supported_error) on a server that only embeds.
BatchEngine& generator(Backend& b);

// Submits, mapping the engine's refusals to 400/503 (501: a server that only embeds).
std::shared_ptr<CompletionStream> submit(Backend& b, CompletionRequest req);

// A whole (non-streaming) response: `body` makes it from the text and the last event once
// the stream ends. httplib 0.11 cannot tell a handler that its client left, so the answer
// is sent chunked and a space (JSON ignores it) goes out every second while it is being
// generated: a write that fails means the client is gone, and the request is cancelled.
// The status is 200 from the start: a stream that ends with FinishReason::error sends an
// error object (`ollama`: ollama's shape) as the body.
void respond_when_done(ServerState& state, httplib::Response& res, std::shared_ptr<CompletionStream> stream,
                       std::function<json(const std::string& text, const CompletionEvent& last)> body, bool ollama = false);

// Streams as a chunked response: `format` turns each event into the bytes to send (the
// done event included: the final chunk and terminator). A client that goes away, or the
// server stopping, cancels the request.
void stream_response(ServerState& state, httplib::Response& res, const char* content_type, std::shared_ptr<CompletionStream> stream,
                     std::function<std::string(const CompletionEvent&)> format);

int64_t unix_now();

void register_completion_routes(httplib::Server& svr, ServerState& state);
void register_ollama_routes(httplib::Server& svr, ServerState& state);
void register_info_routes(httplib::Server& svr, ServerState& state);
void register_embedding_routes(httplib::Server& svr, ServerState& state);

}  // namespace kiln::server
