// GET /health, /v1/models, /metrics, / and POST /tokenize, /detokenize.
#include <cmath>
#include <sstream>

#include "server/routes.h"
#include "server/web_ui.h"
#include "util/json_number.h"

namespace kiln::server {
namespace {

void health(ServerState& state, httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.backend && !state.stopping) reply_json(res, {{"status", "ok"}});
  else reply_json(res, error_json(503, state.stopping ? "shutting down" : "loading model", "unavailable_error"), 503);
}

void models(ServerState& state, httplib::Response& res) {
  const ModelInfo& m = state.ready().info;
  reply_json(res, {{"object", "list"},
                   {"data", json::array({{{"id", m.name},
                                          {"object", "model"},
                                          {"created", m.modified},
                                          {"owned_by", "kiln"},
                                          {"meta",
                                           {{"n_ctx_train", m.n_ctx_train},
                                            {"n_params", m.n_params},
                                            {"size", m.file_bytes},
                                            {"arch", m.arch}}}}})}});
}

void tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  const json body = parse_body(req.body);
  const auto it = body.find("content");
  if (it == body.end()) throw ApiError(400, "content is missing", "invalid_request_error", "content");
  if (!it->is_string()) throw ApiError(400, "content must be a string, got " + it->dump(), "invalid_request_error", "content");
  const auto flag = [&](const char* key) {
    const auto f = body.find(key);
    if (f == body.end() || f->is_null()) return false;
    if (!f->is_boolean()) throw ApiError(400, std::string(key) + " must be a boolean, got " + f->dump(), "invalid_request_error", key);
    return f->get<bool>();
  };
  // llama-server's defaults: no BOS, special-token text stays text.
  const bool add_special = flag("add_special"), parse_special = flag("parse_special"), with_pieces = flag("with_pieces");
  const std::vector<int32_t> ids = b.tokenizer.encode(it->get<std::string>(), add_special, parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces) tokens.push_back({{"id", id}, {"piece", b.tokenizer.token_to_piece(id, true)}});
    else tokens.push_back(id);
  }
  reply_json(res, {{"tokens", tokens}});
}

void detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  const json body = parse_body(req.body);
  const auto it = body.find("tokens");
  if (it == body.end()) throw ApiError(400, "tokens is missing", "invalid_request_error", "tokens");
  if (!it->is_array()) throw ApiError(400, "tokens must be a list of token ids, got " + it->dump(), "invalid_request_error", "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string field = "tokens[" + std::to_string(i) + "]";
    try {
      ids.push_back((int32_t)json_integer((*it)[i], field, 0, b.tokenizer.n_vocab() - 1));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "invalid_request_error", field);
    }
  }
  reply_json(res, {{"content", b.tokenizer.decode(ids)}});
}

// Prometheus text format, llama-server's metric names where it has them.
void metrics(ServerState& state, httplib::Response& res) {
  std::ostringstream out;
  const auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
  };
  std::map<std::string, uint64_t> responses;
  Backend* b;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    responses = state.responses;
    b = state.backend;
  }
  metric("kiln:ready", "gauge", "1 once the model is loaded.", b ? 1 : 0);
  metric("kiln:uptime_seconds", "gauge", "Seconds since the server started.",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - state.started).count());
  if (b && b->engine) {
    const BatchEngineMetrics m = b->engine->metrics();
    metric("kiln:requests_total", "counter", "Completion requests accepted.", double(m.requests_total));
    metric("kiln:requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).", double(m.requests_cancelled));
    metric("kiln:requests_rejected_total", "counter", "Requests refused with a full queue (503).", double(m.requests_rejected));
    metric("kiln:prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", double(m.prompt_tokens_total));
    metric("kiln:prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.", double(m.cached_tokens_total));
    metric("kiln:tokens_predicted_total", "counter", "Generated tokens.", double(m.completion_tokens_total));
    metric("kiln:requests_processing", "gauge", "Requests running now.", m.running);
    metric("kiln:requests_deferred", "gauge", "Requests waiting for a slot.", m.waiting);
    metric("kiln:kv_blocks_used", "gauge", "KV blocks held by running requests and cached prefixes.", double(m.kv_blocks_used));
    metric("kiln:kv_cache_bytes_used", "gauge", "Bytes of the KV blocks in use.", m.kv_bytes_used);
    metric("kiln:kv_cache_bytes_allocated", "gauge", "Bytes of the KV block pool, free blocks included.", m.kv_bytes_allocated);
    metric("kiln:cached_prefixes", "gauge", "Finished requests' sequences kept for prompts that start the same way.",
           double(m.cached_prefixes));
    metric("kiln:cached_prefix_tokens", "gauge", "Positions those cached sequences hold (shared blocks counted in each).",
           double(m.cached_prefix_tokens));
    metric("kiln:predicted_tokens_seconds", "gauge", "Decode throughput over the last steps (tokens/s).",
           m.decode_tokens_per_second);
    metric("kiln:draft_tokens_total", "counter", "Speculative decoding: draft tokens verified.", double(m.draft_tokens_total));
    metric("kiln:draft_tokens_accepted_total", "counter", "Speculative decoding: draft tokens accepted.",
           double(m.draft_accepted_total));
  }
  out << "# HELP kiln:http_responses_total HTTP responses by route and status.\n# TYPE kiln:http_responses_total counter\n";
  for (const auto& [key, count] : responses) {
    const size_t space = key.rfind(' ');
    out << "kiln:http_responses_total{route=\"" << key.substr(0, space) << "\",status=\"" << key.substr(space + 1) << "\"} "
        << count << '\n';
  }
  res.set_content(out.str(), "text/plain; version=0.0.4");
}

}  // namespace

void register_info_routes(httplib::Server& svr, ServerState& state) {
  svr.Get("/health", guarded([&state](const auto&, auto& res) { health(state, res); }));
  svr.Get("/v1/health", guarded([&state](const auto&, auto& res) { health(state, res); }));
  svr.Get("/v1/models", guarded([&state](const auto&, auto& res) { models(state, res); }));
  svr.Get("/models", guarded([&state](const auto&, auto& res) { models(state, res); }));
  svr.Post("/tokenize", guarded([&state](const auto& req, auto& res) { tokenize(state, req, res); }));
  svr.Post("/detokenize", guarded([&state](const auto& req, auto& res) { detokenize(state, req, res); }));
  svr.Get("/metrics", guarded([&state](const auto&, auto& res) { metrics(state, res); }));
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(web_ui_html(), "text/html; charset=utf-8"); });
}

}  // namespace kiln::server
