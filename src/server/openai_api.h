#pragma once
// The OpenAI (and llama-server) request and response shapes for kiln serve: request JSON
// to a CompletionRequest with every field checked, and the JSON of responses, stream
// chunks and errors. No HTTP here: http_server.cpp moves these objects over the wire.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/batch_engine.h"
#include "kiln/chat_template.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln::server {

using json = nlohmann::json;

// An error the response reports: its HTTP status and the OpenAI error type. Thrown by the
// parsers and the routes, caught once at the HTTP boundary.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error", std::string param = "")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string type_, param_;
};

// The request parsers' two primitives (OpenAI's and ollama's bodies): a 400 naming the
// field, and an object's member where a JSON null counts as absent.
[[noreturn]] inline void bad(const std::string& field, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", field);
}
inline const json* member(const json& o, const char* key) {
  const auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

// {"error": {"message", "type", "param", "code"}}: code is the status as a number, as
// llama-server sends it; param the field at fault (null when none).
json error_json(int status, const std::string& message, const std::string& type, const std::string& param = "");

// The command line's settings: the default of every field a request leaves out.
struct Defaults {
  SamplerParams sampling;
  int32_t max_tokens = -1;
  SpeculativeParams speculative;  // -md/--spec-type and --draft-*: what a request's speculative.* start from
};

// A chat conversation as kiln chat renders it: the model's template (or the one the
// command line picked), the vocabulary's BOS/EOS texts, control-token markers parsed.
class ChatFormatter {
 public:
  ChatFormatter(ChatTemplate tmpl, const Tokenizer& tokenizer);
  // Messages already checked (role, content strings); template errors become 400s.
  std::vector<int32_t> tokens(const nlohmann::ordered_json& messages) const;
  const ChatTemplate& chat_template() const { return template_; }

 private:
  ChatTemplate template_;
  const Tokenizer& tokenizer_;
  std::string bos_text_, eos_text_;
};

// A request body as a JSON object: 400 for invalid UTF-8 (with its offset), malformed JSON
// or anything but an object.
json parse_body(const std::string& body);

// What a completion request asks beyond the engine's CompletionRequest.
struct ParsedRequest {
  CompletionRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;           // echoed back when given
};

// POST /v1/completions: prompt (a string, a list of one string, or token ids).
ParsedRequest parse_completion(const json& body, const Tokenizer& tokenizer, const Defaults& defaults);
// POST /v1/chat/completions: messages rendered through the chat template.
ParsedRequest parse_chat(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                         const Defaults& defaults);

// The checked message list of a chat request (also ollama's /api/chat): roles system,
// developer, user, assistant, tool; content a string, null, or a list of text parts.
nlohmann::ordered_json parse_messages(const json& messages, const std::string& field = "messages");

// The sampling fields shared by OpenAI and ollama requests, read from `o` into `req`
// (range-checked, then kiln::validate'd): 400 naming the field. `prefix` goes before the
// field names in messages ("options." for ollama).
void read_sampling(const json& o, CompletionRequest& req, const std::string& prefix = "");
// stop: a string or a list of strings.
std::vector<std::string> read_stop(const json& v, const std::string& field);

// Checks the prompt against the context before the engine sees it, so the 400 names the
// field and the sizes (the engine refuses it too).
void check_fits(const CompletionRequest& req, int32_t n_ctx, const std::string& field);

// "stop" or "length" for the finish of a stream (a cancelled one reports "stop").
const char* openai_finish(FinishReason r);

struct Usage {
  int32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
json usage_json(const Usage& u);

// Response bodies and stream chunks. `id` is per request, `created` in Unix seconds.
json completion_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                     const char* finish, const Usage* usage);
json completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                      const char* finish);
json chat_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
               const char* finish, const Usage& usage);
// delta: {"role": "assistant", "content": ""} for the first chunk, {"content": text} after,
// {} with the finish reason for the last.
json chat_chunk(const std::string& id, int64_t created, const std::string& model, const json& delta, const char* finish);
// The last stream chunk with include_usage: no choices, the usage.
json usage_chunk(const std::string& id, int64_t created, const std::string& model, const char* object, const Usage& u);

}  // namespace kiln::server
