#pragma once
// Text normalization before pre-tokenization, as a tokenizer.json's "normalizer" asks:
// Unicode forms through ICU, literal replacement and prefixing.
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class Normalizer {
 public:
  enum class Form { nfc, nfd, nfkc, nfkd };
  void add_unicode_form(Form form);
  void add_replace(std::string from, std::string to);
  // Prefixes non-empty text (SentencePiece-style "▁" before the first word); with
  // unless_present, only text that does not already start with the prefix.
  void add_prepend(std::string prefix, bool unless_present = false);
  void add_lowercase();
  bool empty() const { return steps_.empty(); }

  // `text` is valid UTF-8; so is the result.
  std::string apply(std::string_view text) const;

 private:
  enum class Kind { form, replace, prepend, lowercase };
  struct Step {
    Kind kind;
    Form form = Form::nfc;
    std::string a, b;
    bool unless_present = false;
  };
  std::vector<Step> steps_;
};

}  // namespace kiln
