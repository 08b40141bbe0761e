#pragma once
// Splits text on the literal strings of special tokens so that "<|user|>" in a chat
// template becomes one token instead of characters.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/tokenizer.h"

namespace kiln {

struct TextSegment {
  std::string_view text;  // raw text to tokenize, when token < 0
  int32_t token = -1;     // a special token matched verbatim
};

// Which tokens a splitter looks for. Control (and unknown-type) tokens only when the
// caller asks for special parsing; user-defined tokens (added to a vocabulary as plain
// text, e.g. MPT's runs of spaces) are matched in all text, as Hugging Face does.
enum class SpecialKinds { control, user_defined, control_and_user_defined };

class SpecialSplitter {
 public:
  explicit SpecialSplitter(const Vocab& vocab, SpecialKinds kinds = SpecialKinds::control);
  // Alternating raw-text and special-token segments, in order; raw segments are never
  // empty. At each position the longest special string wins. A token with a strip
  // attribute (Vocab::strip) drops the whitespace before and/or after it.
  std::vector<TextSegment> split(std::string_view text) const;
  bool empty() const { return count_ == 0; }

 private:
  // Candidates indexed by their first byte, longest first, so a scan position only looks
  // at strings that can match there.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> by_first_byte_;
  std::vector<uint8_t> strip_;  // Vocab::strip
  size_t count_ = 0;
};

}  // namespace kiln
