// kiln serve [MODEL]: an HTTP server with the OpenAI and ollama APIs over a BatchEngine
// (continuous batching on one paged Session). Listens first, so /health can say 503 while
// the model loads; prints `listening on http://HOST:PORT` on stderr once it serves.
// Embeddings (/v1/embeddings, /api/embed) come from an Embedder with a session of its own:
// an encoder (no classifier) serves only them, a decoder with --embeddings both.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "cli/common.h"
#include "kiln/batch_engine.h"
#include "kiln/embedding.h"
#include "kiln/error.h"
#include "kiln/tensor_type.h"
#include "cli/speculation.h"
#include "server/http_server.h"

namespace kiln::cli {
namespace {

struct ServeOptions {
  LogOptions log;
  ModelOptions model;
  GenerationOptions gen;
  ChatTemplateOptions chat_template;
  server::ServerOptions http;
  int32_t n_parallel = 4;
  int32_t max_queue = 64;
  SpeculativeOptions spec;
  bool embeddings = false;  // --embedding/--embeddings: a decoder serves embeddings too
  std::string pooling;      // empty: the GGUF's pooling_type (a decoder without one: last)
};

// The type holding most of the weights' bytes: what ollama calls the quantization level.
std::string main_weight_type(const Model& model) {
  std::map<TensorType, uint64_t> bytes;
  for (const gguf::TensorInfo& t : model.file().tensors()) bytes[t.type] += t.n_bytes;
  TensorType best = TensorType::F32;
  uint64_t most = 0;
  for (const auto& [type, n] : bytes)
    if (n > most) most = n, best = type;
  return type_name(best);
}

server::ModelInfo model_info(const Model& model, const std::string& path) {
  server::ModelInfo info;
  info.name = std::filesystem::path(path).stem().string();
  info.path = path;
  info.arch = model.config().arch;
  info.file_type = main_weight_type(model);
  info.file_bytes = model.file().file_size();
  info.n_params = model.n_params();
  info.n_ctx_train = model.config().n_ctx_train;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) info.modified = st.st_mtime;
  return info;
}

int serve(ServeOptions& o) {
  setup_logging(o.log);
  validate(o.gen.sampling);
  if (!o.pooling.empty() && !pooling_from_name(o.pooling))
    throw UsageError("--pooling must be none, mean, cls or last, not '" + o.pooling + "'");
  spec_type(o.spec);
  if (!o.model.kv_layout.empty() && kv_layout(o.model.kv_layout) != KvLayout::paged)
    throw UsageError("kiln serve needs --kv-layout paged (requests share the KV pool and cached prefixes)");
  o.model.kv_layout = "paged";
  const std::string path = resolve_model_path(o.model.model);
  // Every running and waiting request, plus room for the health checks and metrics.
  o.http.threads = std::min(o.n_parallel + o.max_queue + 4, 1024);

  // SIGINT/SIGTERM go to one thread that stops the server; blocked here before any other
  // thread exists, so every thread inherits the mask and none is interrupted mid-call.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::HttpServer http(o.http);
  const int port = http.bind();
  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    const timespec tick{0, 200'000'000};
    while (!done) {
      if (sigtimedwait(&signals, nullptr, &tick) > 0) {
        spdlog::info("kiln serve: stopping");
        http.stop();
        return;
      }
    }
  });
  struct Joiner {
    std::atomic<bool>& done;
    std::thread& t;
    void join() {
      done = true;
      if (t.joinable()) t.join();
    }
    ~Joiner() { join(); }
  } joiner{done, signal_thread};
  http.start();

  auto model = load_model(path, o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  // An encoder (no classifier: BERT, nomic-bert) cannot generate: it serves embeddings only.
  const bool generates = bool(model->output);
  if (!generates && spec_type(o.spec) != SpecType::none)
    spdlog::warn("kiln serve: {} is an encoder: it only embeds, speculative decoding does not apply", path);
  std::unique_ptr<Session> session;
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<Session> draft_session;
  if (generates) {
    session = std::make_unique<Session>(*model, session_params(o.model, *model));
    // The draft model's session: paged like the target's, one sequence per running request.
    draft_model = load_draft_model(o.spec, *model, path, o.model.repack);
    if (draft_model) {
      SessionParams dp = session_params(o.model, *draft_model);
      dp.n_ctx = session->n_ctx();
      draft_session = std::make_unique<Session>(*draft_model, dp);
    }
  }
  // Embeddings: an Embedder with a session of its own beside the engine's, so that
  // neither waits on the other.
  if (generates && !o.embeddings && !o.pooling.empty())
    spdlog::warn("kiln serve: --pooling applies to embeddings, which this decoder serves with --embeddings only");
  std::unique_ptr<Embedder> embedder;
  std::unique_ptr<server::EmbeddingService> embeddings;
  if (!generates || o.embeddings) {
    EmbedParams params;
    params.pooling = pooling_from_name(o.pooling);
    // A decoder whose file names no pooling: its last token, as an embedding decoder is used.
    if (!params.pooling && generates && model->config().pooling == Pooling::none) params.pooling = Pooling::last;
    params.n_ctx = o.model.n_ctx;
    params.n_threads = o.model.n_threads;
    embedder = std::make_unique<Embedder>(*model, params);
    embeddings = std::make_unique<server::EmbeddingService>(*embedder, o.max_queue);
    spdlog::info("kiln serve: embeddings with pooling {}, {} dimensions, at most {} tokens a text",
                 pooling_name(embedder->pooling()), embedder->dim(), embedder->max_tokens());
  }
  server::ChatFormatter chat(select_chat_template(*model, o.chat_template), tok);
  std::unique_ptr<BatchEngine> engine;
  if (generates) {
    BatchEngine::Params ep;
    ep.n_parallel = o.n_parallel;
    ep.max_queue = o.max_queue;
    ep.spec_type = spec_type(o.spec);
    ep.spec = o.spec.params;
    ep.draft_session = draft_session.get();
    engine = std::make_unique<BatchEngine>(*session, tok, ep);
  }
  const int32_t n_ctx = session ? session->n_ctx() : int32_t(embedder->max_tokens());
  server::Backend backend{engine.get(), tok, chat, model_info(*model, path), n_ctx,
                          {o.gen.sampling, o.gen.n_predict, o.spec.params}, embeddings.get(),
                          "the model (" + model->config().arch + ") is an encoder without a classifier"};
  http.set_backend(&backend);
  std::fprintf(stderr, "listening on http://%s:%d\n", o.http.host.c_str(), port);
  std::fflush(stderr);
  http.wait();
  // The signal thread may still be inside http.stop(), shutting the engine down: it
  // must be done before the engine goes.
  joiner.join();
  http.set_backend(nullptr);
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, Action& action) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "HTTP server with the OpenAI and ollama APIs");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("--host", o->http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->http.port, "Port to listen on (0: any free one, printed in the ready line)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--parallel", o->n_parallel, "Requests generated at once (also -np)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--api-key", o->http.api_key, "Require Authorization: Bearer KEY (but on / and /health)");
  cmd->add_option("--max-queue", o->max_queue, "Waiting requests at most; more get 503 with Retry-After")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-body", o->http.max_body, "Request bodies larger than this many bytes get 413")
      ->check(CLI::Range(size_t(1), size_t(1) << 32))
      ->capture_default_str();
  add_chat_template_options(*cmd, o->chat_template);
  add_runtime_options(*cmd, o->model);
  add_kv_layout_options(*cmd, o->model);
  add_sampling_options(*cmd, o->gen);
  add_speculative_options(*cmd, o->spec);
  cmd->add_flag("--embedding,--embeddings", o->embeddings,
                "Serve POST /v1/embeddings and /api/embed with a decoder too (an encoder always serves them, only them)");
  cmd->add_option("--pooling", o->pooling,
                  "Embeddings: none|mean|cls|last (default: the model's pooling_type; a decoder without one: last)");
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] {
    if (o->log.quiet) o->http.access_log = false;
    action = [o] { return serve(*o); };
  });
}

}  // namespace kiln::cli
