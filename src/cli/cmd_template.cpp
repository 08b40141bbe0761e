// kiln template: renders a conversation with a chat template, from a GGUF's metadata (no
// weights needed), a Jinja file, or one of kiln's built-in templates. Prints exactly the
// rendered text, so its output can be compared byte for byte with Hugging Face's.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "kiln/chat_template.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {
namespace {

struct TemplateOptions {
  std::string model;
  std::string template_file;
  std::string template_name;
  std::string messages_file;
  std::string context_file;
  std::string bos_token, eos_token;
  bool bos_given = false, eos_given = false;
  bool add_generation_prompt = false;
};

std::string builtin_names() {
  std::string names;
  for (const std::string& n : builtin_chat_template_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

nlohmann::ordered_json read_json(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann's text is "[json.exception...] parse error at ...: syntax error while parsing
    // X - DETAIL": keep the position and the detail.
    const std::string what = e.what();
    const size_t detail = what.rfind(" - ");
    throw Error(path + ": not valid JSON at byte " + std::to_string(e.byte) +
                (detail == std::string::npos ? "" : ": " + what.substr(detail + 3)));
  }
}

// The conversation: a JSON array of message objects, each with a string "role".
nlohmann::ordered_json read_messages(const std::string& path) {
  nlohmann::ordered_json messages = read_json(path);
  if (!messages.is_array()) throw Error(path + ": expected a JSON array of messages ({\"role\": ..., \"content\": ...})");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object()) throw Error(path + ": message " + std::to_string(i) + " is not a JSON object");
    if (!m.contains("role") || !m["role"].is_string())
      throw Error(path + ": message " + std::to_string(i) + " has no string \"role\"");
  }
  return messages;
}

// The text of a special token, or "" when the vocabulary has none.
std::string token_text(const Vocab& vocab, int32_t id) {
  return id >= 0 && (size_t)id < vocab.tokens.size() ? vocab.tokens[(size_t)id] : "";
}

int render_template(TemplateOptions& o) {
  if (!o.template_file.empty() && !o.template_name.empty())
    throw UsageError("give either --chat-template-file or --chat-template, not both");
  if (o.model.empty() && o.template_file.empty() && o.template_name.empty())
    throw UsageError("give a model (GGUF), --chat-template-file FILE or --chat-template NAME (" + builtin_names() + ")");

  std::string source;
  if (!o.template_name.empty()) {
    const char* builtin = builtin_chat_template(o.template_name);
    if (!builtin) throw UsageError("unknown chat template '" + o.template_name + "' (built in: " + builtin_names() + ")");
    source = builtin;
  } else if (!o.template_file.empty()) {
    source = read_text_file(o.template_file);
  }

  std::string bos, eos;
  if (!o.model.empty()) {
    auto file = gguf::File::open(o.model);
    if (source.empty()) {
      const gguf::Value* tpl = file->find("tokenizer.chat_template");
      if (!tpl || tpl->type != gguf::ValueType::STRING)
        throw Error(o.model + " has no chat template (tokenizer.chat_template): pick a built-in one with --chat-template NAME (" +
                    builtin_names() + "), e.g. --chat-template chatml, or give a Jinja file with --chat-template-file FILE");
      source = tpl->s;
    }
    if (!o.bos_given || !o.eos_given) {
      const Vocab vocab = Vocab::from_gguf(*file);
      bos = token_text(vocab, vocab.bos_id);
      eos = token_text(vocab, vocab.eos_id);
    }
  }
  if (o.bos_given) bos = o.bos_token;
  if (o.eos_given) eos = o.eos_token;

  const nlohmann::ordered_json messages = read_messages(o.messages_file);
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (!o.context_file.empty()) {
    context = read_json(o.context_file);
    if (!context.is_object()) throw Error(o.context_file + ": expected a JSON object of template variables");
  }
  const ChatTemplate chat_template(std::move(source));
  const std::string text = chat_template.render(messages, o.add_generation_prompt, bos, eos, context);
  write_stdout(text);
  return 0;
}

}  // namespace

void register_template(CLI::App& app, Action& action) {
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* cmd = app.add_subcommand("template", "Render a conversation with a chat template (Jinja2, as Hugging Face does)");
  cmd->add_option("model", o->model, "GGUF whose tokenizer.chat_template (and BOS/EOS) to use; weights are not loaded");
  cmd->add_option("--chat-template-file", o->template_file, "Jinja2 template file");
  cmd->add_option("--chat-template", o->template_name, "Built-in template: " + builtin_names());
  cmd->add_option("--messages", o->messages_file, "Conversation: JSON array of {\"role\", \"content\", ...} ('-' reads stdin)")
      ->required();
  cmd->add_option("--context", o->context_file, "JSON object of extra template variables (tools, enable_thinking...)");
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the header of the assistant's turn");
  CLI::Option* bos = cmd->add_option("--bos-token", o->bos_token, "BOS text (default: the model's, or empty)");
  CLI::Option* eos = cmd->add_option("--eos-token", o->eos_token, "EOS text (default: the model's, or empty)");
  cmd->callback([o, bos, eos, &action] {
    o->bos_given = bos->count() > 0;  // an empty --bos-token '' still overrides the model's
    o->eos_given = eos->count() > 0;
    action = [o] { return render_template(*o); };
  });
}

}  // namespace kiln::cli
