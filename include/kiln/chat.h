#pragma once
// A conversation with a chat model. Every turn renders the whole conversation with the
// model's chat template (as Hugging Face does), compares the text with what the KV cache
// already holds, and evaluates only the difference: a normal turn costs just its new
// tokens, while an edit the template makes to earlier text (a new system prompt, a
// reasoning block it strips from past answers) re-runs exactly from the first change.
#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/chat_template.h"
#include "kiln/generator.h"
#include "kiln/tokenizer.h"

namespace kiln {

struct ChatTurn {
  std::string reply;       // the assistant's text, as streamed
  GenerationStats stats;   // stats.n_prompt: tokens evaluated before the reply
  int32_t n_reused = 0;    // tokens of the conversation the cache already held
};

class Chat {
 public:
  // The template gets the vocabulary's BOS/EOS texts as bos_token/eos_token.
  Chat(Generator& generator, const Tokenizer& tokenizer, ChatTemplate chat_template);

  // Sends a user message and streams the reply. A template that raises, a context that
  // cannot hold the turn, or any other error throws and leaves the conversation as it
  // was. A reply stopped by `cancel` or a length limit is kept as the assistant's answer.
  ChatTurn send(const std::string& user_text, int32_t n_predict,
                const std::function<void(std::string_view)>& on_text,
                const std::atomic<bool>* cancel = nullptr);

  // "" removes it. Takes effect at the next turn (which then re-evaluates from the start).
  // Takes effect from the start of the conversation (re-evaluated); after a context shift
  // (shifted()), only from the next clear().
  void set_system(std::string text) { system_ = std::move(text); }
  bool shifted() const { return shifted_; }
  const std::string& system() const { return system_; }
  // A new conversation; the system prompt stays.
  void clear();

  // The conversation as the template sees it (system message first when set).
  nlohmann::ordered_json messages() const;
  const ChatTemplate& chat_template() const { return template_; }
  // The text the template renders for the conversation so far.
  std::string rendered() const;
  // The tokens send(user_text) would evaluate from an empty cache (BOS included), without
  // sending it: a prompt for other loops (kiln run --parallel N --chat).
  std::vector<int32_t> prompt_tokens(const std::string& user_text) const;
  // How many tokens the conversation holds (cached or about to be).
  size_t n_tokens() const { return generator_.history().size(); }

  // Everything but the tokens needed to resume: messages, system prompt, and which text
  // each run of tokens stands for. restore() takes it back after the generator's history
  // and cache were restored (a session file); a malformed state throws kiln::Error.
  nlohmann::ordered_json state() const;
  void restore(const nlohmann::ordered_json& state);

  // The template for models that have none: the text simply continues, one user line per
  // turn (completion models such as stories260K).
  static const char* plain_template();

 private:
  // A run of consecutive tokens in the history and the rendered text it stands for. The
  // BOS that the vocabulary adds (when the template does not write it) has empty text.
  struct Segment {
    int32_t n_tokens = 0;
    std::string text;
  };
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  bool needs_bos(const std::string& prompt) const;  // the vocabulary adds a BOS the template did not write
  ChatTurn send_appended(const nlohmann::ordered_json& conversation, const std::string& prompt,
                         const std::string& user_text, int32_t n_predict,
                         const std::function<void(std::string_view)>& on_text, const std::atomic<bool>* cancel);

  Generator& generator_;
  const Tokenizer& tokenizer_;
  ChatTemplate template_;
  std::string bos_text_, eos_text_;
  std::string system_;
  nlohmann::ordered_json turns_ = nlohmann::ordered_json::array();  // user/assistant messages
  std::vector<Segment> segments_;  // cover generator_.history() exactly
  // A context shift dropped tokens from the cache: it no longer holds a rendering of the
  // conversation, so later turns append the text the template adds for them (as
  // llama.cpp's chat does) until clear().
  bool shifted_ = false;
};

}  // namespace kiln
