#pragma once
// Unicode-aware regular expressions through PCRE2 (UTF + UCP mode): \p{L}, \p{N}, \s and
// lookaheads mean what they mean in the Oniguruma patterns that tokenizer.json files and
// the published pre-tokenizer lists are written for.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class UnicodeRegex {
 public:
  // Throws kiln::Error quoting the pattern and PCRE2's message when it does not compile.
  explicit UnicodeRegex(const std::string& pattern);
  ~UnicodeRegex();
  UnicodeRegex(UnicodeRegex&&) noexcept;
  UnicodeRegex& operator=(UnicodeRegex&&) noexcept;

  // Every non-empty match in `text`, left to right, as [begin, end) byte offsets. `text`
  // must be valid UTF-8 (the tokenizer checks once before splitting).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// `literal` escaped so that it matches only itself.
std::string regex_escape(std::string_view literal);

}  // namespace kiln
