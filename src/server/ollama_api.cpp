#include "server/ollama_api.h"

#include <cinttypes>
#include <ctime>

#include "server/routes.h"
#include "util/json_number.h"

namespace kiln::server {
namespace {

using ordered_json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// stream defaults to true in ollama.
bool read_stream(const json& body) {
  const json* s = member(body, "stream");
  if (!s) return true;
  if (!s->is_boolean()) bad("stream", "stream must be a boolean, got " + s->dump());
  return s->get<bool>();
}

// The `options` object: num_predict and the sampling settings, named as ollama names them.
void read_options(const json& body, ParsedRequest& r, const Defaults& defaults) {
  r.request.sampling = defaults.sampling;
  r.request.max_tokens = defaults.max_tokens;
  const json* o = member(body, "options");
  if (!o) return;
  if (!o->is_object()) bad("options", "options must be an object, got " + o->dump());
  if (const json* n = member(*o, "num_predict")) {
    // -1: no limit, -2: fill the context; both run until the end or a full context here.
    int64_t v = -1;
    try {
      v = json_integer(*n, "options.num_predict", -2, std::numeric_limits<int32_t>::max());
    } catch (const Error& e) {
      bad("options.num_predict", e.what());
    }
    r.request.max_tokens = v < 0 ? -1 : (int32_t)v;
  }
  read_sampling(*o, r.request, "options.");
  if (const json* s = member(*o, "stop")) r.request.stop = read_stop(*s, "options.stop");
}

ParsedRequest read_common(const json& body, const Defaults& defaults) {
  ParsedRequest r;
  if (const json* m = member(body, "model")) {
    if (!m->is_string()) bad("model", "model must be a string, got " + m->dump());
    r.model = m->get<std::string>();
  }
  r.stream = read_stream(body);
  read_options(body, r, defaults);
  return r;
}

std::string string_field(const json& body, const char* key) {
  const json* v = member(body, key);
  if (!v) return "";
  if (!v->is_string()) bad(key, std::string(key) + " must be a string, got " + v->dump());
  return v->get<std::string>();
}

}  // namespace

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  const std::time_t secs = std::time_t(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%09" PRId64 "Z", int64_t(ns % 1000000000));
  return buf;
}

ParsedRequest parse_ollama_generate(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                                    const Defaults& defaults) {
  ParsedRequest r = read_common(body, defaults);
  const std::string prompt = string_field(body, "prompt");
  const std::string system = string_field(body, "system");
  bool raw = false;
  if (const json* v = member(body, "raw")) {
    if (!v->is_boolean()) bad("raw", "raw must be a boolean, got " + v->dump());
    raw = v->get<bool>();
  }
  if (prompt.empty()) return r;  // load only
  if (raw) {
    r.request.prompt = tokenizer.encode(prompt, tokenizer.vocab().add_bos);
  } else {
    ordered_json messages = ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    r.request.prompt = chat.tokens(messages);
  }
  if (r.request.prompt.empty()) bad("prompt", "prompt gives no tokens");
  return r;
}

ParsedRequest parse_ollama_chat(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                                const Defaults& defaults) {
  ParsedRequest r = read_common(body, defaults);
  const json* m = member(body, "messages");
  if (!m) bad("messages", "messages is missing");
  r.request.prompt = chat.tokens(parse_messages(*m));
  (void)tokenizer;
  if (r.request.prompt.empty()) bad("messages", "messages render to an empty prompt");
  return r;
}

namespace {

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// The last object's statistics, as ollama reports them (durations in nanoseconds).
struct Timing {
  Clock::time_point start = Clock::now();
  Clock::time_point first = start;  // the first event: the prompt is evaluated
  bool seen = false;
  void event() {
    if (!seen) first = Clock::now(), seen = true;
  }
  void finish(json& j, const CompletionEvent& ev) const {
    const auto end = Clock::now();
    j["done_reason"] = ev.finish == FinishReason::length ? "length" : "stop";
    j["total_duration"] = ns_between(start, end);
    j["load_duration"] = 0;
    j["prompt_eval_count"] = ev.prompt_tokens;
    j["prompt_eval_duration"] = ns_between(start, first);
    j["eval_count"] = ev.completion_tokens;
    j["eval_duration"] = ns_between(first, end);
  }
};

std::string ndjson(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

// One route for both: `chat` wraps text as {"message": {...}}, generate as {"response": ...}.
void generate_or_chat(ServerState& state, const httplib::Request& req, httplib::Response& res, bool chat) {
  Backend& b = state.ready();
  generator(b);  // 501 before the body is looked at on a server that only embeds
  const json body = parse_body(req.body);
  ParsedRequest p = chat ? parse_ollama_chat(body, b.tokenizer, b.chat, b.defaults)
                         : parse_ollama_generate(body, b.tokenizer, b.chat, b.defaults);
  const std::string model = p.model.empty() ? b.info.name : p.model;
  const auto piece = [chat, model](const std::string& text, bool done) {
    json j = {{"model", model}, {"created_at", rfc3339_now()}};
    if (chat) j["message"] = {{"role", "assistant"}, {"content", text}};
    else j["response"] = text;
    j["done"] = done;
    return j;
  };
  if (p.request.prompt.empty()) {  // ollama's "load the model" request
    json j = piece("", true);
    j["done_reason"] = "load";
    reply_json(res, j);
    return;
  }
  check_fits(p.request, b.n_ctx, chat ? "messages" : "prompt");
  auto stream = submit(b, std::move(p.request));
  auto timing = std::make_shared<Timing>();
  if (!p.stream) {
    respond_when_done(
        state, res, stream,
        [=](const std::string& text, const CompletionEvent& last) {
          timing->event();
          json j = piece(text, true);
          timing->finish(j, last);
          return j;
        },
        /*ollama=*/true);
    return;
  }
  stream_response(state, res, "application/x-ndjson", stream, [=](const CompletionEvent& ev) {
    timing->event();
    if (ev.done && ev.finish == FinishReason::error) return ndjson(json{{"error", ev.error}});
    std::string out;
    if (!ev.text.empty()) out += ndjson(piece(ev.text, false));
    if (ev.done) {
      json j = piece("", true);
      timing->finish(j, ev);
      out += ndjson(j);
    }
    return out;
  });
}

// "292.80K", "1.1B": ollama's parameter_size.
std::string parameter_size(uint64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2fK", n / 1e3);
  return buf;
}

json details(const ModelInfo& m) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", m.arch},
          {"families", json::array({m.arch})},
          {"parameter_size", parameter_size(m.n_params)},
          {"quantization_level", m.file_type}};
}

std::string rfc3339(int64_t unix_seconds) {
  const std::time_t t = unix_seconds;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void tags(ServerState& state, httplib::Response& res) {
  const ModelInfo& m = state.ready().info;
  reply_json(res, {{"models", json::array({{{"name", m.name},
                                            {"model", m.name},
                                            {"modified_at", rfc3339(m.modified)},
                                            {"size", m.file_bytes},
                                            {"digest", ""},
                                            {"details", details(m)}}})}});
}

void show(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  const json body = parse_body(req.body);
  const json* name = member(body, "model");
  if (!name) name = member(body, "name");  // the older field
  if (!name) bad("model", "model is missing");
  if (!name->is_string()) bad("model", "model must be a string, got " + name->dump());
  const ModelInfo& m = b.info;
  json capabilities = json::array();
  if (b.engine) capabilities.push_back("completion");
  if (b.embeddings) capabilities.push_back("embedding");
  reply_json(res, {{"modelfile", "FROM " + m.path + "\n"},
                   {"parameters", ""},
                   {"template", b.chat.chat_template().source()},
                   {"details", details(m)},
                   {"model_info",
                    {{"general.architecture", m.arch},
                     {"general.parameter_count", m.n_params},
                     {m.arch + ".context_length", m.n_ctx_train}}},
                   {"capabilities", capabilities},
                   {"modified_at", rfc3339(m.modified)}});
}

}  // namespace

void register_ollama_routes(httplib::Server& svr, ServerState& state) {
  svr.Post("/api/generate", guarded([&state](const auto& req, auto& res) { generate_or_chat(state, req, res, false); }, true));
  svr.Post("/api/chat", guarded([&state](const auto& req, auto& res) { generate_or_chat(state, req, res, true); }, true));
  svr.Get("/api/tags", guarded([&state](const auto&, auto& res) { tags(state, res); }, true));
  svr.Post("/api/show", guarded([&state](const auto& req, auto& res) { show(state, req, res); }, true));
  svr.Get("/api/version", [](const httplib::Request&, httplib::Response& res) { reply_json(res, {{"version", "0.1.0"}}); });
}

}  // namespace kiln::server
