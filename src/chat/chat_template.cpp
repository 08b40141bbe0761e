#include "kiln/chat_template.h"

#include "chat/jinja/evaluator.h"
#include "chat/jinja/parser.h"

namespace kiln {

namespace {

std::string template_error_text(const std::string& message, int line) {
  return line > 0 ? "chat template, line " + std::to_string(line) + ": " + message : "chat template: " + message;
}

// Anything but kiln's own errors (std::out_of_range from a number too big for stoll,
// bad_alloc...) still reaches the caller as a TemplateError.
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw TemplateError(e.what());
  }
}

}  // namespace

TemplateError::TemplateError(std::string message, int line)
    : Error(template_error_text(message, line)), message_(std::move(message)), line_(line) {}

nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
    if (m.extra.is_object())
      for (const auto& [k, v] : m.extra.items()) j[k] = v;
    out.push_back(std::move(j));
  }
  return out;
}

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  program_ = guarded([&] { return jinja::parse(source_); });
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::ordered_json& extra_context) const {
  if (!extra_context.is_null() && !extra_context.is_object())
    throw Error("chat template: the extra context must be a JSON object");
  return guarded([&] {
    std::vector<std::pair<std::string, jinja::Value>> vars = {
        {"messages", jinja::Value::from_json(messages)},
        {"add_generation_prompt", jinja::Value(add_generation_prompt)},
        {"bos_token", jinja::Value(bos_token)},
        {"eos_token", jinja::Value(eos_token)},
    };
    if (extra_context.is_object())
      for (const auto& [k, v] : extra_context.items()) vars.emplace_back(k, jinja::Value::from_json(v));
    return jinja::render(*program_, vars);
  });
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token) const {
  return render(to_json(messages), add_generation_prompt, bos_token, eos_token);
}

}  // namespace kiln
