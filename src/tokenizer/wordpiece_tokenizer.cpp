#include "tokenizer/wordpiece_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "kiln/error.h"

namespace kiln {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁"
constexpr size_t kMaxWordChars = 100;                    // longer words are one [UNK]

std::string to_utf8(const std::u32string& s, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; ++i) {
    const char32_t c = s[i];
    if (c < 0x80) {
      out += (char)c;
    } else if (c < 0x800) {
      out += (char)(0xC0 | (c >> 6)), out += (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += (char)(0xE0 | (c >> 12)), out += (char)(0x80 | ((c >> 6) & 0x3F)), out += (char)(0x80 | (c & 0x3F));
    } else {
      out += (char)(0xF0 | (c >> 18)), out += (char)(0x80 | ((c >> 12) & 0x3F));
      out += (char)(0x80 | ((c >> 6) & 0x3F)), out += (char)(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType((UChar32)c) == U_SPACE_SEPARATOR;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (u_charType((UChar32)c)) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_PRIVATE_USE_CHAR: case U_SURROGATE: case U_UNASSIGNED:
      return true;
    default:
      return false;
  }
}

// BERT counts all non-alphanumeric ASCII as punctuation, plus Unicode's P categories.
bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  switch (u_charType((UChar32)c)) {
    case U_DASH_PUNCTUATION: case U_START_PUNCTUATION: case U_END_PUNCTUATION: case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION: case U_INITIAL_PUNCTUATION: case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertNormalizer with lower-casing (and so accent stripping): drop control characters,
// whitespace to spaces, spaces around CJK ideographs, NFD without combining marks,
// lower case.
std::u32string normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  if (U_FAILURE(status)) throw Error(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  const icu::UnicodeString src = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), (int32_t)text.size()));
  icu::UnicodeString cleaned;
  for (int32_t i = 0; i < src.length();) {
    const UChar32 c = src.char32At(i);
    i += U16_LENGTH(c);
    if (c == 0 || c == 0xFFFD || is_control((char32_t)c)) continue;
    if (is_whitespace((char32_t)c)) cleaned.append((UChar32)' ');
    else if (is_cjk((char32_t)c)) cleaned.append((UChar32)' ').append(c).append((UChar32)' ');
    else cleaned.append(c);
  }
  const icu::UnicodeString decomposed = nfd->normalize(cleaned, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU normalization failed: ") + u_errorName(status));
  std::u32string out;
  for (int32_t i = 0; i < decomposed.length();) {
    const UChar32 c = decomposed.char32At(i);
    i += U16_LENGTH(c);
    if (u_charType(c) == U_NON_SPACING_MARK) continue;
    out += (char32_t)u_tolower(c);
  }
  return out;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(Vocab vocab) : specials_(vocab, SpecialKinds::control) {
  vocab_ = std::move(vocab);
  if (vocab_.types.empty()) vocab_.types.assign(vocab_.size(), TokenType::normal);
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) ids_.emplace(vocab_.tokens[i], (int32_t)i);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& t = vocab_.tokens[i];
    if (vocab_.types[i] == TokenType::control) pieces_.emplace_back();
    else if (t.compare(0, kSpaceMark.size(), kSpaceMark) == 0) pieces_.emplace_back(1, ' ').append(t, kSpaceMark.size());
    else pieces_.push_back(t);
  }
}

std::unique_ptr<WordPieceTokenizer> WordPieceTokenizer::from_vocab(Vocab vocab, const std::string& origin) {
  if (vocab.tokens.empty()) throw Error(origin + ": tokenizer.ggml.tokens is empty");
  if (vocab.unk_id < 0) throw Error(origin + ": a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id");
  return std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer(std::move(vocab)));
}

void WordPieceTokenizer::encode_word(const std::u32string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() > kMaxWordChars) {
    out.push_back(vocab_.unk_id);
    return;
  }
  const size_t first = out.size();
  for (size_t start = 0; start < word.size();) {
    // Longest piece first; the first piece of a word is stored with its "▁".
    int32_t id = -1;
    size_t end = word.size();
    for (; end > start; --end) {
      std::string piece;
      if (start == 0) piece = kSpaceMark;
      piece += to_utf8(word, start, end);
      if (const auto it = ids_.find(piece); it != ids_.end()) {
        id = it->second;
        break;
      }
    }
    if (id < 0) {
      // A word that cannot be spelled with pieces is one unknown token as a whole.
      out.resize(first);
      out.push_back(vocab_.unk_id);
      return;
    }
    out.push_back(id);
    start = end;
  }
}

void WordPieceTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  const std::u32string norm = normalize(text);
  std::u32string word;
  for (char32_t c : norm) {
    if (c == ' ') {
      encode_word(word, out);
      word.clear();
    } else if (is_punctuation(c)) {
      encode_word(word, out);
      word.assign(1, c);
      encode_word(word, out);
      word.clear();
    } else {
      word += c;
    }
  }
  encode_word(word, out);
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  size_t bad = 0;
  if (!is_valid_utf8(text, &bad)) {
    throw Error("invalid UTF-8 in text to tokenize at byte offset " + std::to_string(bad));
  }
  std::vector<int32_t> out;
  if (add_bos && vocab_.add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
  if (!parse_special || specials_.empty()) {
    encode_segment(text, out);
  } else {
    for (const TextSegment& seg : specials_.split(text)) {
      if (seg.token >= 0) out.push_back(seg.token);
      else encode_segment(seg.text, out);
    }
  }
  if (add_bos && vocab_.add_eos && vocab_.eos_id >= 0) out.push_back(vocab_.eos_id);
  // [CLS] text [SEP]: llama.cpp's WordPiece adds both with its special tokens (BERT's
  // encoders were trained on such sequences; an embedding without [SEP] differs).
  if (add_bos && vocab_.add_bos && vocab_.sep_id >= 0) out.push_back(vocab_.sep_id);
  return out;
}

std::string WordPieceTokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n_vocab()) +
                " tokens");
  }
  if (special && vocab_.types[(size_t)id] == TokenType::control) return vocab_.tokens[(size_t)id];
  return pieces_[(size_t)id];
}

}  // namespace kiln
