#pragma once
// kiln serve's HTTP server (cpp-httplib): routes, API key, body limit, access log, and the
// streaming of a CompletionStream as SSE or NDJSON. HTTP threads only parse, validate and
// wait on their request's stream; the BatchEngine's thread owns the model.
//
// The server listens before the model is loaded (GET /health answers 503 meanwhile), and
// serves completions once set_backend() hands it the engine.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kiln/batch_engine.h"
#include "kiln/embedding.h"
#include "kiln/tokenizer.h"
#include "server/openai_api.h"

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port (bind() returns it)
  std::string api_key;          // empty: no Authorization needed
  size_t max_body = 4u << 20;   // larger request bodies get 413
  bool access_log = true;       // one line per request on stderr
  // HTTP threads: each request holds one while it waits on its stream, so fewer than
  // running + queued requests would leave accepted connections waiting unseen behind
  // httplib's own queue. 0: httplib's default (8 or more).
  int threads = 0;
};

// What /v1/models, /api/tags and /api/show say about the model.
struct ModelInfo {
  std::string name;       // the file name without .gguf: the model id in every response
  std::string path;
  std::string arch;
  std::string file_type;  // the weights' main type ("Q8_0", "F32"...)
  uint64_t file_bytes = 0;
  uint64_t n_params = 0;
  int64_t modified = 0;   // Unix seconds
  uint32_t n_ctx_train = 0;
};

// POST /v1/embeddings and /api/embed: one Embedder (a session of its own, apart from the
// BatchEngine's) that runs one request at a time, so that embeddings and generation never
// wait on each other; requests wait their turn, and past `max_waiting` get 503.
class EmbeddingService {
 public:
  EmbeddingService(Embedder& embedder, int max_waiting) : embedder_(embedder), max_waiting_(max_waiting) {}
  const Embedder& embedder() const { return embedder_; }
  // Vectors of the inputs (not normalised), once the embedder is free. QueueFullError when
  // max_waiting requests already wait for it; kiln::Error (the Embedder's) for a bad input.
  std::vector<std::vector<float>> embed(std::span<const std::vector<int32_t>> inputs);

 private:
  Embedder& embedder_;
  std::mutex mu_;
  std::atomic<int> waiting_{0};
  int max_waiting_;
};

// Everything a request needs; owned by the caller, alive until wait() returns.
struct Backend {
  BatchEngine* engine;  // null: the server only embeds (an encoder, which cannot generate)
  const Tokenizer& tokenizer;
  const ChatFormatter& chat;
  ModelInfo info;
  int32_t n_ctx = 0;
  Defaults defaults;
  EmbeddingService* embeddings = nullptr;  // null: no embeddings (a decoder served without --embeddings)
  std::string no_generation_reason;       // why engine is null, for the 501 of the completion routes
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port; throws kiln::Error naming them when it cannot. Returns the port.
  int bind();
  // Serves on a thread of its own, from now until stop().
  void start();
  // Completions are served from now on; /health says ready.
  void set_backend(Backend* backend);
  // Stops accepting connections and cancels running requests (their streams end, so the
  // HTTP threads finish). Callable from any thread, more than once.
  void stop();
  // Until the listening thread has ended (after stop()).
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
