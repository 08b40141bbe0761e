// kiln serve [MODEL]: an HTTP server with the OpenAI and ollama APIs over a BatchEngine
// (continuous batching on one paged Session). Listens first, so /health can say 503 while
// the model loads; prints `listening on http://HOST:PORT` on stderr once it serves.
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
  Session session(*model, session_params(o.model, *model));
  // The draft model's session: paged like the target's, one sequence per running request.
  const std::unique_ptr<Model> draft_model = load_draft_model(o.spec, *model, path, o.model.repack);
  std::unique_ptr<Session> draft_session;
  if (draft_model) {
    SessionParams dp = session_params(o.model, *draft_model);
    dp.n_ctx = session.n_ctx();
    draft_session = std::make_unique<Session>(*draft_model, dp);
  }
  server::ChatFormatter chat(select_chat_template(*model, o.chat_template), tok);
  BatchEngine::Params ep;
  ep.n_parallel = o.n_parallel;
  ep.max_queue = o.max_queue;
  ep.spec_type = spec_type(o.spec);
  ep.spec = o.spec.params;
  ep.draft_session = draft_session.get();
  BatchEngine engine(session, tok, ep);
  server::Backend backend{engine, tok, chat, model_info(*model, path), session.n_ctx(),
                          {o.gen.sampling, o.gen.n_predict, o.spec.params}};
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
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] {
    if (o->log.quiet) o->http.access_log = false;
    action = [o] { return serve(*o); };
  });
}

}  // namespace kiln::cli
