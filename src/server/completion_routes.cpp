// POST /v1/completions and /v1/chat/completions: whole responses, or SSE streams
// (`data: {...}\n\n` chunks, then `data: [DONE]\n\n`).
#include "server/routes.h"

namespace kiln::server {
namespace {

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

Usage usage_of(const CompletionEvent& ev) { return {ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens}; }

// A stream's error ends it with an error object, as llama-server does: the status line is
// long gone.
std::string sse_error(const CompletionEvent& ev) {
  return sse(error_json(500, ev.error, "server_error")) + "data: [DONE]\n\n";
}

void completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  generator(b);  // 501 before the body is looked at on a server that only embeds
  ParsedRequest p = parse_completion(parse_body(req.body), b.tokenizer, b.defaults);
  check_fits(p.request, b.n_ctx, "prompt");
  auto stream = submit(b, std::move(p.request));
  const std::string id = state.new_id("cmpl-"), model = b.info.name;
  const int64_t created = unix_now();
  if (!p.stream) {
    respond_when_done(state, res, stream, [=](const std::string& text, const CompletionEvent& last) {
      const Usage u = usage_of(last);
      return completion_json(id, created, model, text, openai_finish(last.finish), &u);
    });
    return;
  }
  stream_response(state, res, "text/event-stream", stream, [=, include_usage = p.include_usage](const CompletionEvent& ev) {
    if (ev.done && ev.finish == FinishReason::error) return sse_error(ev);
    std::string out;
    if (!ev.text.empty()) out += sse(completion_chunk(id, created, model, ev.text, nullptr));
    if (ev.done) {
      out += sse(completion_chunk(id, created, model, "", openai_finish(ev.finish)));
      if (include_usage) out += sse(usage_chunk(id, created, model, "text_completion", usage_of(ev)));
      out += "data: [DONE]\n\n";
    }
    return out;
  });
}

void chat_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  generator(b);  // 501 before the body is looked at on a server that only embeds
  ParsedRequest p = parse_chat(parse_body(req.body), b.tokenizer, b.chat, b.defaults);
  check_fits(p.request, b.n_ctx, "messages");
  auto stream = submit(b, std::move(p.request));
  const std::string id = state.new_id("chatcmpl-"), model = b.info.name;
  const int64_t created = unix_now();
  if (!p.stream) {
    respond_when_done(state, res, stream, [=](const std::string& text, const CompletionEvent& last) {
      return chat_json(id, created, model, text, openai_finish(last.finish), usage_of(last));
    });
    return;
  }
  auto first = std::make_shared<bool>(true);
  stream_response(state, res, "text/event-stream", stream, [=, include_usage = p.include_usage](const CompletionEvent& ev) {
    if (ev.done && ev.finish == FinishReason::error) return sse_error(ev);
    std::string out;
    if (*first) {  // OpenAI's first chunk names the role
      out += sse(chat_chunk(id, created, model, {{"role", "assistant"}, {"content", ""}}, nullptr));
      *first = false;
    }
    if (!ev.text.empty()) out += sse(chat_chunk(id, created, model, {{"content", ev.text}}, nullptr));
    if (ev.done) {
      out += sse(chat_chunk(id, created, model, json::object(), openai_finish(ev.finish)));
      if (include_usage) out += sse(usage_chunk(id, created, model, "chat.completion.chunk", usage_of(ev)));
      out += "data: [DONE]\n\n";
    }
    return out;
  });
}

}  // namespace

void register_completion_routes(httplib::Server& svr, ServerState& state) {
  svr.Post("/v1/completions", guarded([&state](const auto& req, auto& res) { completions(state, req, res); }));
  svr.Post("/v1/chat/completions", guarded([&state](const auto& req, auto& res) { chat_completions(state, req, res); }));
  // llama-server's older names for the same.
  svr.Post("/completions", guarded([&state](const auto& req, auto& res) { completions(state, req, res); }));
  svr.Post("/chat/completions", guarded([&state](const auto& req, auto& res) { chat_completions(state, req, res); }));
}

}  // namespace kiln::server
