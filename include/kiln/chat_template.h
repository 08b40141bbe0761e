#pragma once
// Chat templates: the Jinja2 source a GGUF keeps in `tokenizer.chat_template`, rendered
// the way Hugging Face transformers renders it (trim_blocks, lstrip_blocks, loop controls,
// tojson without ASCII escaping, raise_exception, strftime_now), byte for byte.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"

namespace kiln {

// A template that does not parse or fails while rendering. what() is
// "chat template, line N: <message>" (without the line part when it is unknown).
class TemplateError : public Error {
 public:
  TemplateError(std::string message, int line = 0);
  const std::string& message() const { return message_; }
  int line() const { return line_; }

 private:
  std::string message_;
  int line_ = 0;
};

// The template called raise_exception(msg): what() is exactly msg, since it is written
// for the user ("System role not supported").
class TemplateRaisedError : public Error {
 public:
  using Error::Error;
};

struct ChatMessage {
  std::string role;
  std::string content;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // tool_calls, name...
};
// The message objects templates see: {"role", "content", ...extra}.
nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages);

namespace jinja { struct Program; }

class ChatTemplate {
 public:
  // Parses the Jinja2 source; a syntax error throws TemplateError with its line.
  explicit ChatTemplate(std::string source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `messages` is a JSON array of message objects (ordered_json keeps the key order that
  // `tojson` shows; a plain nlohmann::json converts implicitly). The template sees
  // messages, add_generation_prompt, bos_token, eos_token, and every key of
  // `extra_context` (an object: tools, date_string, enable_thinking...).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token,
                     const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object()) const;
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::unique_ptr<jinja::Program> program_;
};

// Fallback templates for models whose GGUF has none: "chatml", "llama2", "llama3",
// "mistral", "gemma", "phi3", "zephyr". nullptr for any other name.
const char* builtin_chat_template(std::string_view name);
std::vector<std::string> builtin_chat_template_names();

}  // namespace kiln
