#pragma once
// Splits text on the literal strings of special tokens (control and unknown-type tokens)
// so that "<|user|>" in a chat template becomes one token instead of characters.
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

class SpecialSplitter {
 public:
  explicit SpecialSplitter(const Vocab& vocab);
  // Alternating raw-text and special-token segments, in order; raw segments are never
  // empty. At each position the longest special string wins.
  std::vector<TextSegment> split(std::string_view text) const;
  bool empty() const { return count_ == 0; }

 private:
  // Candidates indexed by their first byte, longest first, so a scan position only looks
  // at strings that can match there.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> by_first_byte_;
  size_t count_ = 0;
};

}  // namespace kiln
