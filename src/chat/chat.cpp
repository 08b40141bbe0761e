#include "kiln/chat.h"

#include "kiln/error.h"
#include "util/json_number.h"

namespace kiln {
namespace {

using nlohmann::ordered_json;

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  return id >= 0 && id < tokenizer.n_vocab() ? tokenizer.vocab().tokens[(size_t)id] : "";
}

}  // namespace

const char* Chat::plain_template() {
  return "{%- for m in messages -%}"
         "{%- if m['role'] == 'assistant' -%}{{ m['content'] }}"
         "{%- else -%}{{ ('' if loop.first else '\\n') + m['content'] }}{%- endif -%}"
         "{%- endfor -%}";
}

Chat::Chat(Generator& generator, const Tokenizer& tokenizer, ChatTemplate chat_template)
    : generator_(generator),
      tokenizer_(tokenizer),
      template_(std::move(chat_template)),
      bos_text_(token_text(tokenizer, tokenizer.bos())),
      eos_text_(token_text(tokenizer, tokenizer.eos())) {}

ordered_json Chat::messages() const {
  ordered_json all = ordered_json::array();
  if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : turns_) all.push_back(m);
  return all;
}

std::string Chat::render(const ordered_json& messages, bool add_generation_prompt) const {
  return template_.render(messages, add_generation_prompt, bos_text_, eos_text_);
}

std::string Chat::rendered() const { return render(messages(), false); }

bool Chat::needs_bos(const std::string& prompt) const {
  return tokenizer_.vocab().add_bos && tokenizer_.bos() >= 0 &&
         (bos_text_.empty() || prompt.compare(0, bos_text_.size(), bos_text_) != 0);
}

std::vector<int32_t> Chat::prompt_tokens(const std::string& user_text) const {
  ordered_json conversation = messages();
  conversation.push_back({{"role", "user"}, {"content", user_text}});
  const std::string prompt = render(conversation, true);
  std::vector<int32_t> tokens;
  if (needs_bos(prompt)) tokens.push_back(tokenizer_.bos());
  const std::vector<int32_t> text_tokens = tokenizer_.encode(prompt, false, true);  // markers as control tokens, as send()
  tokens.insert(tokens.end(), text_tokens.begin(), text_tokens.end());
  return tokens;
}

void Chat::clear() {
  turns_ = ordered_json::array();
  segments_.clear();
  shifted_ = false;
  generator_.reset();
}

ChatTurn Chat::send(const std::string& user_text, int32_t n_predict,
                    const std::function<void(std::string_view)>& on_text, const std::atomic<bool>* cancel) {
  ordered_json conversation = messages();
  conversation.push_back({{"role", "user"}, {"content", user_text}});
  const std::string prompt = render(conversation, true);
  if (shifted_) return send_appended(conversation, prompt, user_text, n_predict, on_text, cancel);

  // The longest run of whole segments whose text the new rendering still starts with:
  // their tokens stay in the cache, everything after them is evaluated.
  size_t matched = 0, text_pos = 0, keep_tokens = 0;
  for (; matched < segments_.size(); ++matched) {
    const Segment& s = segments_[matched];
    if (prompt.compare(text_pos, s.text.size(), s.text) != 0) break;
    text_pos += s.text.size();
    keep_tokens += (size_t)s.n_tokens;
  }
  std::vector<Segment> new_segments;
  std::vector<int32_t> tokens;
  if (keep_tokens == 0 && needs_bos(prompt)) {
    matched = 0;
    tokens.push_back(tokenizer_.bos());
    new_segments.push_back({1, ""});
  }
  const std::string delta = prompt.substr(text_pos);
  // Template text: its markers (<|im_start|>...) are control tokens; the user's own text
  // reaches the template as data, so it is spelled out the same way the model was trained.
  const std::vector<int32_t> delta_tokens = tokenizer_.encode(delta, false, true);
  tokens.insert(tokens.end(), delta_tokens.begin(), delta_tokens.end());
  new_segments.push_back({(int32_t)delta_tokens.size(), delta});

  segments_.resize(matched);
  generator_.truncate(keep_tokens);

  ChatTurn turn;
  turn.n_reused = (int32_t)keep_tokens;
  turn.stats = generator_.generate(tokens, n_predict, [&](std::string_view text) {
    turn.reply.append(text);
    on_text(text);
  }, cancel);  // throws with the generator back at keep_tokens, which segments_ describe

  if (turn.stats.n_discarded > 0) {
    shifted_ = true;
    segments_.assign(1, {(int32_t)generator_.history().size(), ""});
    turns_.push_back({{"role", "user"}, {"content", user_text}});
    turns_.push_back({{"role", "assistant"}, {"content", turn.reply}});
    return turn;
  }
  segments_.insert(segments_.end(), new_segments.begin(), new_segments.end());
  const std::vector<int32_t>& history = generator_.history();
  int32_t n_content = turn.stats.n_generated;
  const bool ended = turn.stats.stop == StopReason::end_of_generation;
  if (ended) --n_content;
  segments_.push_back({n_content, turn.reply});
  // Kept apart so that a template that does not write the end-of-turn marker after an
  // answer costs one re-evaluated token, not the whole answer.
  if (ended) segments_.push_back({1, tokenizer_.token_to_piece(history.back(), true)});

  turns_.push_back({{"role", "user"}, {"content", user_text}});
  turns_.push_back({{"role", "assistant"}, {"content", turn.reply}});
  return turn;
}

ChatTurn Chat::send_appended(const ordered_json& conversation, const std::string& prompt, const std::string& user_text,
                             int32_t n_predict, const std::function<void(std::string_view)>& on_text,
                             const std::atomic<bool>* cancel) {
  // The template's text for this turn: what the rendering gains over the previous one
  // (templates that re-render earlier turns differently get the new turn on its own).
  const std::string before = render(messages(), false);
  std::string delta;
  if (prompt.compare(0, before.size(), before) == 0) {
    delta = prompt.substr(before.size());
  } else {
    delta = render(ordered_json::array({conversation.back()}), true);
    if (!bos_text_.empty() && delta.compare(0, bos_text_.size(), bos_text_) == 0) delta.erase(0, bos_text_.size());
  }
  ChatTurn turn;
  turn.n_reused = (int32_t)generator_.history().size();
  turn.stats = generator_.generate(tokenizer_.encode(delta, false, true), n_predict, [&](std::string_view text) {
    turn.reply.append(text);
    on_text(text);
  }, cancel);
  segments_.assign(1, {(int32_t)generator_.history().size(), ""});
  turns_.push_back({{"role", "user"}, {"content", user_text}});
  turns_.push_back({{"role", "assistant"}, {"content", turn.reply}});
  return turn;
}

ordered_json Chat::state() const {
  ordered_json segments = ordered_json::array();
  for (const Segment& s : segments_) segments.push_back({s.n_tokens, s.text});
  return {{"system", system_}, {"turns", turns_}, {"segments", segments}, {"shifted", shifted_}};
}

void Chat::restore(const ordered_json& state) {
  try {
    std::string system = state.at("system").get<std::string>();
    ordered_json turns = state.at("turns");
    if (!turns.is_array()) throw Error("\"turns\" is not an array");
    for (const auto& m : turns)
      if (!m.is_object() || !m.at("role").is_string() || !m.at("content").is_string())
        throw Error("a message lacks a string role or content");
    std::vector<Segment> segments;
    size_t total = 0;
    for (const auto& s : state.at("segments")) {
      const int64_t n = json_integer(s.at(0), "a segment's size", 0, int64_t(generator_.history().size()));
      segments.push_back({(int32_t)n, s.at(1).get<std::string>()});
      total += (size_t)n;
    }
    if (total != generator_.history().size())
      throw Error("segments cover " + std::to_string(total) + " tokens, the conversation has " +
                  std::to_string(generator_.history().size()));
    const bool shifted = state.value("shifted", false);
    system_ = std::move(system);
    turns_ = std::move(turns);
    segments_ = std::move(segments);
    shifted_ = shifted;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("chat state: ") + e.what());
  }
}

}  // namespace kiln
