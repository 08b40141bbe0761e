#pragma once
// Pre-tokenization: the text is cut into pieces by a sequence of regex stages before BPE
// runs inside each piece, so merges never cross a piece boundary. Each stage cuts every
// piece the previous stage produced (Hugging Face's Sequence of Split pre-tokenizers).
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode_regex.h"

namespace kiln {

// What a stage does with its matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior {
  isolated,              // matches and the text between them are separate pieces
  removed,               // matches are dropped
  merged_with_previous,  // a match ends the piece before it
  merged_with_next,      // a match starts the piece after it
  contiguous,            // adjacent matches form one piece
};

class Pretokenizer {
 public:
  void add_stage(const std::string& pattern, SplitBehavior behavior = SplitBehavior::isolated);
  bool empty() const { return stages_.empty(); }

  // Non-empty pieces of `text` in order; they are views into `text` and cover all of it
  // unless a stage removes matches.
  std::vector<std::string_view> split(std::string_view text) const;

  // The stages for a GGUF's tokenizer.ggml.pre (empty: the GPT-2 split that byte-level
  // BPE applies by default). `ignore_merges` tells whether a piece that is itself a
  // token skips merging (Llama 3). Unknown names throw kiln::Error naming them and the
  // supported ones.
  static Pretokenizer for_ggml_pre(const std::string& pre, bool* ignore_merges);
  static std::string supported_ggml_pre();
  // The tokenizer.ggml.pre name whose stages are exactly `patterns` (each isolating its
  // matches) with this ignore_merges, or "" when no GGUF name describes them.
  static std::string ggml_pre_name(const std::vector<std::string>& patterns, bool ignore_merges);

  // The pattern Hugging Face's ByteLevel pre-tokenizer splits with (use_regex: true).
  static const std::string& gpt2_pattern();

 private:
  struct Stage {
    UnicodeRegex regex;
    SplitBehavior behavior;
  };
  std::vector<Stage> stages_;
};

}  // namespace kiln
