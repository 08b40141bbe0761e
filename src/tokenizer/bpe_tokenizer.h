#pragma once
// Byte-pair encoding with ranked merges: GGUF "gpt2" vocabularies (byte-level, split by
// the family's pre-tokenizer) and Hugging Face tokenizer.json BPE models (byte-level or
// SentencePiece-style with byte fallback).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/tokenizer.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_split.h"

namespace kiln {

struct BpeOptions {
  // Text is mapped to GPT-2's byte alphabet before merging (and back when decoding);
  // otherwise merging runs on the characters themselves and "▁" decodes to a space.
  bool byte_level = true;
  // A pre-token that is itself in the vocabulary is taken whole (Llama 3).
  bool ignore_merges = false;
  // A character missing from the vocabulary becomes its <0xXX> byte tokens...
  bool byte_fallback = false;
  // ...or else the unknown token, one for a whole run of such characters when fused.
  bool fuse_unk = false;
  Normalizer normalizer;
  Pretokenizer pretokenizer;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // `merges` in priority order (first merges first), as pairs of token texts; a merge
  // whose parts or result are not tokens is ignored. `origin` prefixes errors.
  BpeTokenizer(Vocab vocab, const std::vector<std::pair<std::string_view, std::string_view>>& merges,
               BpeOptions options, const std::string& origin);
  // A GGUF "gpt2" vocabulary: merges from tokenizer.ggml.merges, the pre-tokenizer from
  // tokenizer.ggml.pre (an unknown name throws kiln::Error listing the supported ones).
  static std::unique_ptr<BpeTokenizer> from_gguf_vocab(Vocab vocab, const std::string& origin);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  // `word`: one pre-token, already in the alphabet merging runs on.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;

  // Looked up with string_views (no allocation per character while encoding).
  struct ViewHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  BpeOptions opt_;
  std::unordered_map<std::string, int32_t, ViewHash, std::equal_to<>> ids_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id)
  std::array<int32_t, 256> byte_tokens_{};      // <0xXX> ids for byte fallback, -1 if absent
  bool have_all_byte_tokens_ = false;
  SpecialSplitter user_defined_;  // matched in all text
  SpecialSplitter all_special_;   // with parse_special
  std::vector<std::string> pieces_;  // token_to_piece(id, false)
};

}  // namespace kiln
