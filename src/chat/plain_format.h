#pragma once
// The conversation format for models without a chat template: the user's text is simply
// continued by the model, one line per turn. Real chat templates (read from the GGUF)
// plug in behind the same two calls.
#include <string>
#include <vector>

#include "kiln/tokenizer.h"

namespace kiln {

class PlainChatFormat {
 public:
  explicit PlainChatFormat(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // Tokens to append for a user message (BOS on the first turn of a conversation).
  std::vector<int32_t> user_turn(const std::string& text) const {
    const bool first = !started_;
    std::string t = first ? text : "\n" + text;
    return tokenizer_.encode(t, first && tokenizer_.vocab().add_bos);
  }
  // The turn was accepted by the model (a failed one leaves the conversation unchanged).
  void commit_turn() { started_ = true; }
  void reset() { started_ = false; }

 private:
  const Tokenizer& tokenizer_;
  bool started_ = false;
};

}  // namespace kiln
