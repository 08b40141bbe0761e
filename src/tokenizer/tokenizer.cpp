// Tokenizer construction and the model-independent parts (decode, end-of-generation).
#include <array>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/wordpiece_tokenizer.h"

namespace kiln {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
  Vocab vocab = Vocab::from_gguf(file);
  if (vocab.model == "llama") return SpmTokenizer::from_vocab(std::move(vocab), file.path());
  if (vocab.model == "gpt2") return BpeTokenizer::from_gguf_vocab(std::move(vocab), file.path());
  if (vocab.model == "bert") return WordPieceTokenizer::from_vocab(std::move(vocab), file.path());
  throw Error(file.path() + ": tokenizer.ggml.model '" + vocab.model +
              "' is not supported (supported: llama, gpt2, bert)");
}

std::unique_ptr<Tokenizer> Tokenizer::from_spm_file(const std::string& path) {
  return SpmTokenizer::from_model_file(path);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, special);
  return out;
}

bool Tokenizer::is_eog(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return false;
  if (id == vocab_.eos_id || id == vocab_.eot_id || id == vocab_.eom_id) return true;
  if (vocab_.types.empty() || vocab_.types[(size_t)id] != TokenType::control) return false;
  // Chat models end a turn with a marker that the GGUF does not always name as EOS/EOT;
  // generation must stop there anyway. Only control tokens count, so user text that
  // happens to spell a marker never ends generation.
  static constexpr std::array<std::string_view, 13> kEndMarkers = {
      "</s>",          "<|endoftext|>", "<|im_end|>",   "<|eot_id|>",
      "<|eom_id|>",    "<|end|>",       "<end_of_turn>", "<|end_of_text|>",
      "<EOT>",         "<|END_OF_TURN_TOKEN|>", "<|return|>", "<|end_of_turn|>",
      "<|call|>",
  };
  const std::string& text = vocab_.tokens[(size_t)id];
  // gpt-oss's harmony format ends a reply with <|return|> (or <|call|> for a tool call);
  // its <|end|> only closes one message of the reply (the chain of thought before the
  // final answer), so with both of those in the vocabulary it ends nothing, as in llama.cpp.
  if (text == "<|end|>") {
    const auto control = [&](std::string_view t) {
      for (size_t i = 0; i < vocab_.tokens.size(); ++i)
        if (vocab_.tokens[i] == t && vocab_.types[i] == TokenType::control) return true;
      return false;
    };
    return !(control("<|return|>") && control("<|call|>"));
  }
  for (std::string_view m : kEndMarkers) {
    if (text == m) return true;
  }
  return false;
}

}  // namespace kiln
