#include "tokenizer/spm_tokenizer.h"

#include <sentencepiece_processor.h>

#include "kiln/error.h"

namespace kiln {
namespace {

constexpr std::string_view kSpmSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"
// What sentencepiece itself prints for <unk> (its default unk_surface).
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";

std::string unescape_spaces(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpmSpaceMark.size(), kSpmSpaceMark) == 0) {
      out += ' ';
      i += kSpmSpaceMark.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// "<0x0A>" -> "\n"; anything else is not a byte piece and renders as text.
bool byte_piece(const std::string& text, std::string& out) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return false;
  unsigned v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') v = v * 16 + unsigned(c - '0');
    else if (c >= 'A' && c <= 'F') v = v * 16 + unsigned(c - 'A' + 10);
    else if (c >= 'a' && c <= 'f') v = v * 16 + unsigned(c - 'a' + 10);
    else return false;
  }
  out.assign(1, (char)v);
  return true;
}

std::string render(const Vocab& v, TokenType t, size_t id) {
  const std::string& text = v.tokens[id];
  switch (t) {
    case TokenType::control: return "";
    case TokenType::unknown: return std::string(kUnknownSurface);
    case TokenType::byte: {
      std::string b;
      if (byte_piece(text, b)) return b;
      return unescape_spaces(text);
    }
    default: return unescape_spaces(text);
  }
}

}  // namespace

SpmTokenizer::SpmTokenizer(Vocab vocab, std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
                           int32_t n_processor_ids)
    : sp_(std::move(sp)), n_processor_ids_(n_processor_ids), specials_(vocab) {
  vocab_ = std::move(vocab);
  types_ = vocab_.types;
  if (types_.empty()) {
    // A file without token types still names its special tokens; they must not print.
    types_.assign(vocab_.size(), TokenType::normal);
    for (int32_t id : {vocab_.bos_id, vocab_.eos_id, vocab_.pad_id, vocab_.eot_id, vocab_.eom_id}) {
      if (id >= 0 && id < n_vocab()) types_[(size_t)id] = TokenType::control;
    }
    if (vocab_.unk_id >= 0 && vocab_.unk_id < n_vocab()) types_[(size_t)vocab_.unk_id] = TokenType::unknown;
  }
  plain_pieces_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) plain_pieces_.push_back(render(vocab_, types_[i], i));
}

SpmTokenizer::~SpmTokenizer() = default;

std::unique_ptr<SpmTokenizer> SpmTokenizer::from_vocab(Vocab vocab, const std::string& origin) {
  if (vocab.tokens.empty()) throw Error(origin + ": tokenizer.ggml.tokens is empty");
  const spm::ModelProto model = model_proto_from_vocab(vocab, nullptr);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(spm::serialize(model));
  if (!status.ok()) {
    throw Error(origin + ": SentencePiece rejected the vocabulary: " + status.ToString());
  }
  // An appended unknown piece (see model_proto_from_vocab) gets id n, past every real id.
  const auto n = (int32_t)vocab.size();
  return std::unique_ptr<SpmTokenizer>(new SpmTokenizer(std::move(vocab), std::move(sp), n));
}

std::unique_ptr<SpmTokenizer> SpmTokenizer::from_model_file(const std::string& path) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(path);
  if (!status.ok()) throw Error(path + ": cannot load SentencePiece model: " + status.ToString());
  Vocab vocab = vocab_from_model_proto(spm::parse(sp->serialized_model_proto(), path));
  const auto n = (int32_t)vocab.size();
  return std::unique_ptr<SpmTokenizer>(new SpmTokenizer(std::move(vocab), std::move(sp), n));
}

void SpmTokenizer::encode_raw(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error("SentencePiece failed to encode text: " + status.ToString());
  for (int id : ids) {
    // Only the placeholder unknown piece (vocabularies without one) lies past the
    // vocabulary; there is no id to give it, so the character is dropped.
    if (id >= 0 && id < n_processor_ids_) out.push_back(id);
  }
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  size_t bad = 0;
  if (!is_valid_utf8(text, &bad)) {
    throw Error("invalid UTF-8 in text to tokenize at byte offset " + std::to_string(bad));
  }
  std::vector<int32_t> out;
  // add_bos stands for "add the special tokens the vocabulary asks for" at both ends.
  const bool bos = add_bos && vocab_.add_bos && vocab_.bos_id >= 0;
  const bool eos = add_bos && vocab_.add_eos && vocab_.eos_id >= 0;
  if (bos) out.push_back(vocab_.bos_id);
  if (!parse_special || specials_.empty()) {
    if (!text.empty()) encode_raw(text, out);
  } else {
    // Every raw segment starts the text or follows a special token, so each one gets the
    // dummy prefix (the processor adds it): the behaviour GGUF users know from llama.cpp.
    for (const TextSegment& seg : specials_.split(text)) {
      if (seg.token >= 0) out.push_back(seg.token);
      else encode_raw(seg.text, out);
    }
  }
  if (eos) out.push_back(vocab_.eos_id);
  return out;
}

std::string SpmTokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(n_vocab()) + " tokens");
  }
  if (special) {
    const TokenType t = types_[(size_t)id];
    if (t == TokenType::control || t == TokenType::unknown) return vocab_.tokens[(size_t)id];
  }
  return plain_pieces_[(size_t)id];
}

}  // namespace kiln
