#pragma once
// SentencePiece ("llama" tokenizer model) tokenization through libsentencepiece.
#include <memory>
#include <string>
#include <vector>

#include "kiln/tokenizer.h"
#include "tokenizer/special_split.h"
#include "tokenizer/spm_proto.h"

namespace sentencepiece { class SentencePieceProcessor; }

namespace kiln {

// The ModelProto a GGUF vocabulary stands for (BPE, byte fallback when all 256 byte
// pieces exist, identity normalization). Pieces sentencepiece would reject (empty,
// duplicate...) are renamed to unreachable placeholders so ids stay aligned with the
// vocabulary. `unk_appended` tells that no usable unknown token existed and one was
// added after the last vocabulary id.
spm::ModelProto model_proto_from_vocab(const Vocab& vocab, bool* unk_appended);
// The Vocab a SentencePiece model describes (used for tokenizer.model files).
Vocab vocab_from_model_proto(const spm::ModelProto& model);

class SpmTokenizer final : public Tokenizer {
 public:
  // `origin` (a file path) prefixes error messages.
  static std::unique_ptr<SpmTokenizer> from_vocab(Vocab vocab, const std::string& origin);
  static std::unique_ptr<SpmTokenizer> from_model_file(const std::string& path);
  ~SpmTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  SpmTokenizer(Vocab vocab, std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
               int32_t n_processor_ids);
  void encode_raw(std::string_view text, std::vector<int32_t>& out) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t n_processor_ids_;  // ids >= n_vocab() are the appended unknown piece
  SpecialSplitter specials_;
  std::vector<TokenType> types_;  // vocab_.types, or inferred from the special ids
  std::vector<std::string> plain_pieces_;  // token_to_piece(id, false), precomputed
};

}  // namespace kiln
