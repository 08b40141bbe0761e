#pragma once
// WordPiece (GGUF tokenizer.ggml.model "bert"): BERT's normalization and split, then
// greedy longest-match pieces. GGUF stores word-initial pieces with a leading "▁" and
// continuation pieces bare (Hugging Face's "##" prefix removed).
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/tokenizer.h"
#include "tokenizer/special_split.h"

namespace kiln {

class WordPieceTokenizer final : public Tokenizer {
 public:
  static std::unique_ptr<WordPieceTokenizer> from_vocab(Vocab vocab, const std::string& origin);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  explicit WordPieceTokenizer(Vocab vocab);
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(const std::u32string& word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> ids_;
  SpecialSplitter specials_;
  std::vector<std::string> pieces_;
};

}  // namespace kiln
