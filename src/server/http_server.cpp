#include "server/http_server.h"

#include <spdlog/spdlog.h>

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "server/routes.h"
#include "util/ms_since.h"

namespace kiln::server {

using namespace std::chrono_literals;

Backend& ServerState::ready() {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) throw ApiError(503, "the server is shutting down", "unavailable_error");
  if (!backend) throw ApiError(503, "the model is loading", "unavailable_error");
  return *backend;
}

std::string ServerState::new_id(const char* prefix) {
  return std::string(prefix) + id_salt + std::to_string(next_id++);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void reply_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  // Replacement characters, not an exception, for a token piece cut inside a character.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

namespace {

void reply_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                 const std::string& param, bool ollama) {
  if (ollama) reply_json(res, json{{"error", message}}, status);
  else reply_json(res, error_json(status, message, type, param), status);
}

}  // namespace

httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> route, bool ollama) {
  return [route = std::move(route), ollama](const httplib::Request& req, httplib::Response& res) {
    try {
      route(req, res);
    } catch (const ApiError& e) {
      reply_error(res, e.status(), e.what(), e.type(), e.param(), ollama);
    } catch (const QueueFullError& e) {
      res.set_header("Retry-After", "1");
      reply_error(res, 503, e.what(), "unavailable_error", "", ollama);
    } catch (const UsageError& e) {
      reply_error(res, 400, e.what(), "invalid_request_error", "", ollama);
    } catch (const std::exception& e) {
      reply_error(res, 500, e.what(), "server_error", "", ollama);
    }
  };
}

BatchEngine& generator(Backend& b) {
  if (!b.engine)
    throw ApiError(501, "this server does not generate text: " + b.no_generation_reason +
                            "; it serves POST /v1/embeddings and /api/embed", "not_supported_error");
  return *b.engine;
}

std::shared_ptr<CompletionStream> submit(Backend& b, CompletionRequest req) {
  try {
    return generator(b).submit(std::move(req));
  } catch (const QueueFullError&) {
    throw;
  } catch (const UsageError& e) {
    throw ApiError(400, e.what());
  } catch (const Error& e) {  // after shutdown
    throw ApiError(503, e.what(), "unavailable_error");
  }
}

void respond_when_done(ServerState& state, httplib::Response& res, std::shared_ptr<CompletionStream> stream,
                       std::function<json(const std::string& text, const CompletionEvent& last)> body, bool ollama) {
  struct State {
    std::string text;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    bool finished = false;
  };
  auto st = std::make_shared<State>();
  ++state.open_streams;
  res.set_chunked_content_provider(
      "application/json",
      [stream, body = std::move(body), st, ollama](size_t, httplib::DataSink& sink) {
        const auto now = std::chrono::steady_clock::now();
        if (now - st->last_write >= 1s) {
          if (!sink.write(" ", 1)) return false;  // the client went away
          st->last_write = now;
        }
        CompletionEvent ev;
        if (!stream->next(ev, 100ms)) return true;
        st->text += ev.text;
        if (!ev.done) return true;
        json j;
        if (ev.finish == FinishReason::error) j = ollama ? json{{"error", ev.error}} : error_json(500, ev.error, "server_error");
        else j = body(st->text, ev);
        const std::string out = j.dump(-1, ' ', false, json::error_handler_t::replace);
        st->finished = true;
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      },
      [stream, st, &state](bool) {
        if (!st->finished) stream->cancel();
        --state.open_streams;
      });
}

void stream_response(ServerState& state, httplib::Response& res, const char* content_type, std::shared_ptr<CompletionStream> stream,
                     std::function<std::string(const CompletionEvent&)> format) {
  auto finished = std::make_shared<bool>(false);
  ++state.open_streams;
  res.set_chunked_content_provider(
      content_type,
      [stream, format = std::move(format), finished](size_t, httplib::DataSink& sink) {
        CompletionEvent ev;
        // Back to httplib every 100 ms so it can notice the server stopping.
        if (!stream->next(ev, 100ms)) return true;
        const std::string out = format(ev);
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;  // the client went away
        if (ev.done) {
          *finished = true;
          sink.done();
        }
        return true;
      },
      [stream, finished, &state](bool) {
        if (!*finished) stream->cancel();
        --state.open_streams;
      });
}

struct HttpServer::Impl {
  ServerOptions options;
  ServerState state;    // before svr: its handlers and responses refer to it
  httplib::Server svr;
  std::thread thread;
  int port = -1;
  int listen_socket = -1;  // seen by the socket options callback before bind
};

namespace {

thread_local std::chrono::steady_clock::time_point request_start;

// The route a request matched, for the metrics' labels: the path of a known route, else "other".
std::string route_label(const std::string& path) {
  static const char* known[] = {"/", "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
                                "/tokenize", "/detokenize", "/api/generate", "/api/chat", "/api/tags", "/api/show",
                                "/api/version", "/v1/embeddings", "/api/embed"};
  for (const char* k : known)
    if (path == k) return path;
  return "other";
}

}  // namespace

HttpServer::HttpServer(ServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  std::random_device rd;
  char salt[16];
  std::snprintf(salt, sizeof salt, "%08x", rd());
  impl_->state.id_salt = std::string(salt) + "-";

  httplib::Server& svr = impl_->svr;
  ServerState& state = impl_->state;
  const ServerOptions& opts = impl_->options;
  svr.set_payload_max_length(opts.max_body);
  if (opts.threads > 0) {
    const size_t n = size_t(opts.threads);
    svr.new_task_queue = [n] { return new httplib::ThreadPool(n); };
  }
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);

  svr.set_pre_routing_handler([&opts](const httplib::Request& req, httplib::Response& res) {
    request_start = std::chrono::steady_clock::now();
    // The page and the health check are open: a browser loads the page before it knows the key.
    if (opts.api_key.empty() || req.path == "/" || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opts.api_key) return httplib::Server::HandlerResponse::Unhandled;
    const bool ollama = req.path.rfind("/api/", 0) == 0;
    const std::string message = req.has_header("Authorization") ? "invalid API key" : "missing API key (Authorization: Bearer KEY)";
    if (ollama) reply_json(res, json{{"error", message}}, 401);
    else reply_json(res, error_json(401, message, "authentication_error"), 401);
    res.set_header("WWW-Authenticate", "Bearer");
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (no route, body too large, bad request line) come with no body.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = "error";
    if (res.status == 404) message = "no route for " + req.method + " " + req.path;
    else if (res.status == 413) message = "the request body is larger than the server's --max-body";
    else if (res.status == 400) message = "malformed HTTP request";
    reply_json(res, error_json(res.status, message, res.status == 404 ? "not_found_error" : "invalid_request_error"),
               res.status);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_logger([&opts, &state](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(state.mu);
      ++state.responses[route_label(req.path) + " " + std::to_string(res.status)];
    }
    if (!opts.access_log) return;
    spdlog::info("{} {} {} {} {:.1f} ms", req.remote_addr, req.method, req.path, res.status, ms_since(request_start));
  });

  register_info_routes(svr, state);
  register_completion_routes(svr, state);
  register_ollama_routes(svr, state);
  register_embedding_routes(svr, state);
}

HttpServer::~HttpServer() {
  stop();
  wait();
}

// Debian's httplib is a compiled library that listens with a backlog of 5: a burst of
// clients connecting at once (eight load-test clients did) overflows it, and each dropped
// SYN costs its client a 1-s retransmission before its first token. Linux lets listen()
// on a listening socket set a new backlog, so the socket is noted when httplib creates it
// and listened on again once bound.
constexpr int kListenBacklog = 1024;

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  impl_->svr.set_socket_options([impl = impl_.get()](socket_t sock) {
    httplib::default_socket_options(sock);
    impl->listen_socket = sock;
  });
  impl_->port = o.port == 0 ? impl_->svr.bind_to_any_port(o.host) : (impl_->svr.bind_to_port(o.host, o.port) ? o.port : -1);
  if (impl_->port < 0)
    throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (address in use, or not this machine's)");
  if (impl_->listen_socket >= 0 && ::listen(impl_->listen_socket, kListenBacklog) != 0)
    spdlog::warn("kiln serve: could not raise the listen backlog: {}", std::strerror(errno));
  return impl_->port;
}

void HttpServer::start() {
  impl_->thread = std::thread([this] { impl_->svr.listen_after_bind(); });
  // httplib's stop() does nothing until the loop runs: a SIGTERM right after start()
  // would be lost.
  for (int i = 0; i < 5000 && !impl_->svr.is_running(); ++i) std::this_thread::sleep_for(1ms);
}

void HttpServer::set_backend(Backend* backend) {
  std::lock_guard<std::mutex> lock(impl_->state.mu);
  impl_->state.backend = backend;
}

void HttpServer::stop() {
  Backend* backend = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->state.mu);
    if (impl_->state.stopping) return;
    impl_->state.stopping = true;  // new requests get 503 from here on
    backend = impl_->state.backend;
  }
  // Running requests are cancelled first, while their connections still write: each
  // stream ends with its last chunk (and [DONE]) rather than being cut, and the HTTP
  // threads waiting on them finish. Then the listening loop stops.
  if (backend && backend->engine) backend->engine->shutdown(/*finish_running=*/false);
  for (int i = 0; i < 500 && impl_->state.open_streams > 0; ++i) std::this_thread::sleep_for(10ms);
  impl_->svr.stop();
}

void HttpServer::wait() {
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace kiln::server
