#pragma once
// Text <-> token ids. A Tokenizer is built from a GGUF's tokenizer.ggml.* metadata or from
// a SentencePiece tokenizer.model file; callers never see which implementation runs.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {
namespace gguf { class File; }

// Token types as GGUF stores them (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

// The vocabulary a GGUF carries, independent of the algorithm that uses it.
struct Vocab {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece), "gpt2", ...
  std::string pre;    // tokenizer.ggml.pre, when present
  std::vector<std::string> tokens;
  std::vector<float> scores;          // empty when the file has none
  std::vector<TokenType> types;       // empty when the file has none
  std::vector<std::string> merges;    // BPE merges, when present
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1, eom_id = -1;
  // tokenizer.ggml.seperator_token_id (sic): BERT's [SEP], which WordPiece appends to a
  // text whenever it prepends [CLS] (as llama.cpp does).
  int32_t sep_id = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
  // Special tokens that take the whitespace before (kStripBefore) or after (kStripAfter)
  // them when split out of text; empty: none. GGUF has no key for it, so from_gguf sets
  // it by model name as llama.cpp does (Phi-3's control tokens take what follows them).
  static constexpr uint8_t kStripBefore = 1, kStripAfter = 2;
  std::vector<uint8_t> strip;

  static Vocab from_gguf(const gguf::File& file);  // throws kiln::Error naming the key
  size_t size() const { return tokens.size(); }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // By tokenizer.ggml.model; an unsupported model throws kiln::Error naming the file.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  // A SentencePiece tokenizer.model file (special ids and settings come from the file).
  static std::unique_ptr<Tokenizer> from_spm_file(const std::string& path);
  // A Hugging Face tokenizer.json with a BPE model (byte-level or with byte fallback);
  // tokenizer_config.json beside it, when present, names BOS/EOS and whether BOS is added.
  // Components kiln cannot reproduce throw kiln::Error naming them.
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& path);
  // A llama2.c tokenizer.bin (scores and pieces; vocabulary of the model it came with).
  static std::unique_ptr<Tokenizer> from_llama2c_file(const std::string& path);
  // Any of the three file kinds, told apart by their content.
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);

  // add_bos: prepend BOS when the vocabulary asks for it (Vocab::add_bos).
  // parse_special: text like "<s>" or "<|im_start|>" becomes its control token instead of
  // being tokenized as characters (chat templates need it; user text must not get it).
  // BPE vocabularies split user-defined (added, non-special) tokens out of all text.
  // Invalid UTF-8 throws kiln::Error. Characters outside the vocabulary become byte
  // tokens when the vocabulary has them, else the unknown token.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                      bool parse_special = false) const = 0;

  // The raw bytes this token stands for ("▁" already turned into a space, <0x0A> into
  // "\n"). Control tokens (BOS/EOS...) give "" unless `special` is true. The result may
  // be part of a UTF-8 character: use Detokenizer to print.
  virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;

  // Whole-sequence decoding (no leading space after BOS is stripped here: callers trim).
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  const Vocab& vocab() const { return vocab_; }
  int32_t n_vocab() const { return (int32_t)vocab_.tokens.size(); }
  int32_t bos() const { return vocab_.bos_id; }
  int32_t eos() const { return vocab_.eos_id; }
  // True for every token that ends generation (EOS, EOT, EOM...).
  bool is_eog(int32_t id) const;

 protected:
  Vocab vocab_;
};

// Streams token pieces as text without ever emitting part of a UTF-8 character.
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Text that is complete after adding `id`; keeps an incomplete UTF-8 tail buffered.
  std::string push(int32_t id);
  // Whatever is still buffered (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

// True if `text` is valid UTF-8; otherwise error_offset gets the first bad byte.
bool is_valid_utf8(std::string_view text, size_t* error_offset = nullptr);

}  // namespace kiln
