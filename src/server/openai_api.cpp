#include "server/openai_api.h"

#include <limits>

#include "util/json_number.h"

namespace kiln::server {
namespace {

using ordered_json = nlohmann::ordered_json;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// json_number's helpers throw kiln::Error naming the field; the response wants a 400 with
// the field as param.
template <typename F>
auto field_check(const std::string& field, F&& f) {
  try {
    return f();
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad(field, e.what());
  }
}

bool read_bool(const json& o, const char* key, bool fallback, const std::string& prefix) {
  const json* v = member(o, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(prefix + key, prefix + key + " must be a boolean, got " + v->dump());
  return v->get<bool>();
}

std::string read_string(const json& v, const std::string& field) {
  if (!v.is_string()) bad(field, field + " must be a string, got " + v.dump());
  return v.get<std::string>();
}

float read_real(const json& o, const char* key, float fallback, double lo, double hi, const std::string& prefix) {
  const json* v = member(o, key);
  if (!v) return fallback;
  const std::string field = prefix + key;
  return (float)field_check(field, [&] { return json_real(*v, field, lo, hi); });
}

int64_t read_int(const json& o, const char* key, int64_t fallback, int64_t lo, int64_t hi, const std::string& prefix) {
  const json* v = member(o, key);
  if (!v) return fallback;
  const std::string field = prefix + key;
  return field_check(field, [&] { return json_integer(*v, field, lo, hi); });
}

// OpenAI: {"50256": -100}; llama-server also takes [[50256, -100], ...]. A bias of false
// bans the token, as in llama-server.
std::vector<std::pair<int32_t, float>> read_logit_bias(const json& v, int32_t n_vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const auto add = [&](const json& id, const json& bias, const std::string& field) {
    const int64_t t = field_check(field, [&] { return json_integer(id, field, 0, n_vocab - 1); });
    float b;
    if (bias.is_boolean() && !bias.get<bool>()) b = -std::numeric_limits<float>::infinity();
    else b = (float)field_check(field, [&] { return json_real(bias, field, -100, 100); });
    out.emplace_back((int32_t)t, b);
  };
  if (v.is_object()) {
    for (const auto& [key, bias] : v.items()) {
      const std::string field = "logit_bias[" + key + "]";
      json id;
      try {
        size_t used = 0;
        const long long n = std::stoll(key, &used);
        if (used != key.size()) throw std::invalid_argument(key);
        id = n;
      } catch (const std::exception&) {
        bad(field, "logit_bias keys must be token ids, got \"" + key + "\"");
      }
      add(id, bias, field);
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string field = "logit_bias[" + std::to_string(i) + "]";
      if (!v[i].is_array() || v[i].size() != 2) bad(field, field + " must be a [token id, bias] pair, got " + v[i].dump());
      add(v[i][0], v[i][1], field);
    }
  } else {
    bad("logit_bias", "logit_bias must be an object of token id: bias, got " + v.dump());
  }
  return out;
}

// Fields every OpenAI completion request shares: n, stream, max tokens, sampling.
ParsedRequest read_common(const json& body, const Tokenizer& tokenizer, const Defaults& defaults) {
  ParsedRequest r;
  if (const json* m = member(body, "model")) r.model = read_string(*m, "model");
  if (read_int(body, "n", 1, 1, kInt32Max, "") != 1) bad("n", "n: only 1 choice per request is supported");
  r.stream = read_bool(body, "stream", false, "");
  if (const json* so = member(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "stream_options must be an object, got " + so->dump());
    r.include_usage = read_bool(*so, "include_usage", false, "stream_options.");
  }
  r.request.max_tokens = defaults.max_tokens;
  // max_completion_tokens is the newer name; either may come, the newer one wins.
  r.request.max_tokens = (int32_t)read_int(body, "max_tokens", r.request.max_tokens, 0, kInt32Max, "");
  r.request.max_tokens = (int32_t)read_int(body, "max_completion_tokens", r.request.max_tokens, 0, kInt32Max, "");
  r.request.sampling = defaults.sampling;
  read_sampling(body, r.request);
  // llama-server's per-request draft settings (flat keys with a dot in the name).
  const bool speculative = member(body, "speculative.n_max") || member(body, "speculative.n_min") ||
                           member(body, "speculative.p_min");
  if (speculative) {
    SpeculativeParams sp = defaults.speculative;
    sp.draft_max = (int32_t)read_int(body, "speculative.n_max", sp.draft_max, 0, 64, "");
    sp.draft_min = (int32_t)read_int(body, "speculative.n_min", sp.draft_min, 0, 64, "");
    sp.draft_p_min = read_real(body, "speculative.p_min", sp.draft_p_min, 0, 1, "");
    if (sp.draft_max > 0 && sp.draft_min > sp.draft_max)
      bad("speculative.n_min", "speculative.n_min (" + std::to_string(sp.draft_min) + ") exceeds speculative.n_max (" +
                                   std::to_string(sp.draft_max) + ")");
    r.request.speculative = sp;
  }
  if (const json* s = member(body, "stop")) r.request.stop = read_stop(*s, "stop");
  if (const json* lb = member(body, "logit_bias")) r.request.logit_bias = read_logit_bias(*lb, tokenizer.n_vocab());
  r.request.ignore_eos = read_bool(body, "ignore_eos", false, "");
  return r;
}

}  // namespace

json error_json(int status, const std::string& message, const std::string& type, const std::string& param) {
  return {{"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", status}}}};
}

ChatFormatter::ChatFormatter(ChatTemplate tmpl, const Tokenizer& tokenizer)
    : template_(std::move(tmpl)), tokenizer_(tokenizer) {
  const auto text = [&](int32_t id) {
    return id >= 0 && id < tokenizer.n_vocab() ? tokenizer.vocab().tokens[(size_t)id] : std::string();
  };
  bos_text_ = text(tokenizer.bos());
  eos_text_ = text(tokenizer.eos());
}

std::vector<int32_t> ChatFormatter::tokens(const ordered_json& messages) const {
  std::string prompt;
  try {
    prompt = template_.render(messages, /*add_generation_prompt=*/true, bos_text_, eos_text_);
  } catch (const Error& e) {  // raise_exception("System role not supported") and the like
    bad("messages", std::string("messages: the chat template refused them: ") + e.what());
  }
  // As Chat::prompt_tokens: BOS unless the template wrote it, markers as control tokens.
  std::vector<int32_t> out;
  if (tokenizer_.vocab().add_bos && tokenizer_.bos() >= 0 &&
      (bos_text_.empty() || prompt.compare(0, bos_text_.size(), bos_text_) != 0))
    out.push_back(tokenizer_.bos());
  const std::vector<int32_t> text = tokenizer_.encode(prompt, false, true);
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

json parse_body(const std::string& body) {
  size_t offset = 0;
  if (!is_valid_utf8(body, &offset))
    throw ApiError(400, "the request body is not valid UTF-8 (byte " + std::to_string(offset) + ")");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse errors, and numbers beyond a double (out_of_range 406)
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object, got " + std::string(j.type_name()));
  return j;
}

void read_sampling(const json& o, CompletionRequest& req, const std::string& prefix) {
  SamplerParams& s = req.sampling;
  s.temperature = read_real(o, "temperature", s.temperature, 0, 100, prefix);
  s.top_p = read_real(o, "top_p", s.top_p, 0, 1, prefix);
  s.min_p = read_real(o, "min_p", s.min_p, 0, 1, prefix);
  s.top_k = (int32_t)read_int(o, "top_k", s.top_k, 0, kInt32Max, prefix);
  s.presence_penalty = read_real(o, "presence_penalty", s.presence_penalty, -2, 2, prefix);
  s.frequency_penalty = read_real(o, "frequency_penalty", s.frequency_penalty, -2, 2, prefix);
  s.repeat_penalty = read_real(o, "repeat_penalty", s.repeat_penalty, 0, 100, prefix);
  s.penalty_last_n = (int32_t)read_int(o, "repeat_last_n", s.penalty_last_n, -1, kInt32Max, prefix);
  // -1 (or none): a fresh seed per request, reported back.
  const int64_t seed = read_int(o, "seed", -2, -1, std::numeric_limits<int64_t>::max(), prefix);
  if (seed == -1) s.seed = SamplerParams::kRandomSeed;
  else if (seed >= 0) s.seed = (uint64_t)seed;
  try {
    validate(s);
  } catch (const UsageError& e) {
    std::string what = e.what();
    bad(prefix + what.substr(0, what.find(' ')), prefix + what);
  }
}

std::vector<std::string> read_stop(const json& v, const std::string& field) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) out.push_back(read_string(v[i], field + "[" + std::to_string(i) + "]"));
  } else {
    bad(field, field + " must be a string or a list of strings, got " + v.dump());
  }
  std::erase_if(out, [](const std::string& s) { return s.empty(); });  // would stop before the first token
  return out;
}

ordered_json parse_messages(const json& messages, const std::string& field) {
  if (!messages.is_array()) bad(field, field + " must be a list of messages, got " + messages.dump());
  if (messages.empty()) bad(field, field + " must not be empty");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(at, at + " must be an object, got " + m.dump());
    const json* role = member(m, "role");
    if (!role) bad(at + ".role", at + ".role is missing");
    const std::string r = read_string(*role, at + ".role");
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      bad(at + ".role", at + ".role: unknown role '" + r + "' (expected system, developer, user, assistant or tool)");
    std::string content;
    const auto it = m.find("content");
    if (it == m.end()) {
      if (r != "assistant") bad(at + ".content", at + ".content is missing");
    } else if (it->is_string()) {
      content = it->get<std::string>();
    } else if (it->is_array()) {
      for (size_t k = 0; k < it->size(); ++k) {
        const json& part = (*it)[k];
        const std::string pf = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type")) bad(pf, pf + " must be a content part object with a type");
        if (part["type"] != "text") bad(pf + ".type", pf + ".type: only text parts are supported, got " + part["type"].dump());
        if (!part.contains("text")) bad(pf + ".text", pf + ".text is missing");
        content += read_string(part["text"], pf + ".text");
      }
    } else if (!it->is_null() || r != "assistant") {
      bad(at + ".content", at + ".content must be a string or a list of text parts, got " + it->dump());
    }
    ordered_json msg = {{"role", r == "developer" ? "system" : r}, {"content", content}};
    if (const json* name = member(m, "name")) msg["name"] = read_string(*name, at + ".name");
    out.push_back(std::move(msg));
  }
  return out;
}

ParsedRequest parse_completion(const json& body, const Tokenizer& tokenizer, const Defaults& defaults) {
  ParsedRequest r = read_common(body, tokenizer, defaults);
  const json* p = member(body, "prompt");
  if (!p) bad("prompt", "prompt is missing");
  // A text gets BOS as `kiln run` gives it; token ids are taken as they are.
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) {
    r.request.prompt = tokenizer.encode(p->get<std::string>(), tokenizer.vocab().add_bos);
  } else if (p->is_array() && !p->empty()) {
    for (size_t i = 0; i < p->size(); ++i) {
      const std::string field = "prompt[" + std::to_string(i) + "]";
      r.request.prompt.push_back(
          (int32_t)field_check(field, [&] { return json_integer((*p)[i], field, 0, tokenizer.n_vocab() - 1); }));
    }
  } else {
    bad("prompt", "prompt must be a string, a list of one string or a list of token ids, got " + p->dump());
  }
  if (r.request.prompt.empty()) bad("prompt", "prompt is empty and this model adds no BOS token: nothing to start from");
  return r;
}

ParsedRequest parse_chat(const json& body, const Tokenizer& tokenizer, const ChatFormatter& chat,
                         const Defaults& defaults) {
  ParsedRequest r = read_common(body, tokenizer, defaults);
  const json* m = member(body, "messages");
  if (!m) bad("messages", "messages is missing");
  r.request.prompt = chat.tokens(parse_messages(*m));
  if (r.request.prompt.empty()) bad("messages", "messages render to an empty prompt");
  return r;
}

void check_fits(const CompletionRequest& req, int32_t n_ctx, const std::string& field) {
  if ((int64_t)req.prompt.size() + 1 > n_ctx)
    bad(field, field + " is " + std::to_string(req.prompt.size()) + " tokens: it does not fit the context of " +
                   std::to_string(n_ctx) + " tokens with room for one more (start the server with a larger -c)");
}

const char* openai_finish(FinishReason r) { return r == FinishReason::length ? "length" : "stop"; }

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

static json finish_value(const char* finish) { return finish ? json(finish) : json(nullptr); }

json completion_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                     const char* finish, const Usage* usage) {
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_value(finish)}}})}};
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

json completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                      const char* finish) {
  return completion_json(id, created, model, text, finish, nullptr);
}

json chat_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
               const char* finish, const Usage& usage) {
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", text}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", finish_value(finish)}}})},
          {"usage", usage_json(usage)}};
}

json chat_chunk(const std::string& id, int64_t created, const std::string& model, const json& delta, const char* finish) {
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish_value(finish)}}})}};
}

json usage_chunk(const std::string& id, int64_t created, const std::string& model, const char* object, const Usage& u) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"choices", json::array()}, {"usage", usage_json(u)}};
}

}  // namespace kiln::server
