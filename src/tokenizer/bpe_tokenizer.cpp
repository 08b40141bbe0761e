#include "tokenizer/bpe_tokenizer.h"

#include <cstdio>
#include <queue>

#include "kiln/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁"

uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

std::string replace_space_marks(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// "<0x0A>" -> 0x0A; -1 for anything else.
int byte_token_value(const std::string& text) {
  unsigned v = 0;
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  if (std::sscanf(text.c_str() + 3, "%2X", &v) != 1) return -1;
  return (int)v;
}

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab, const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                           BpeOptions options, const std::string& origin)
    : opt_(std::move(options)),
      user_defined_(vocab, SpecialKinds::user_defined),
      all_special_(vocab, SpecialKinds::control_and_user_defined) {
  vocab_ = std::move(vocab);
  if (vocab_.tokens.empty()) throw Error(origin + ": the vocabulary is empty");
  if (vocab_.types.empty()) vocab_.types.assign(vocab_.size(), TokenType::normal);
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) ids_.emplace(vocab_.tokens[i], (int32_t)i);

  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    joined.assign(a).append(b);
    const auto ir = ids_.find(joined);
    if (ir == ids_.end()) continue;
    const auto ia = ids_.find(a), ib = ids_.find(b);
    if (ia == ids_.end() || ib == ids_.end()) continue;
    merges_.emplace(pair_key(ia->second, ib->second), Merge{(int32_t)rank, ir->second});
  }

  byte_tokens_.fill(-1);
  have_all_byte_tokens_ = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = ids_.find(name);
    if (it != ids_.end()) byte_tokens_[(size_t)b] = it->second;
    else have_all_byte_tokens_ = false;
  }

  pieces_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& text = vocab_.tokens[i];
    switch (vocab_.types[i]) {
      case TokenType::control: pieces_.emplace_back(); break;
      // Added tokens hold their text as written, not in the byte alphabet; without
      // byte-level "▁" still stands for a space in them (Gemma's "▁▁" runs).
      case TokenType::user_defined: pieces_.push_back(opt_.byte_level ? text : replace_space_marks(text)); break;
      case TokenType::byte: {
        const int v = byte_token_value(text);
        pieces_.push_back(v >= 0 ? std::string(1, (char)v) : text);
        break;
      }
      default:
        if (opt_.byte_level) pieces_.push_back(byte_level::decode(text));
        else if (opt_.byte_fallback && byte_token_value(text) >= 0) pieces_.emplace_back(1, (char)byte_token_value(text));
        else pieces_.push_back(replace_space_marks(text));
    }
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_gguf_vocab(Vocab vocab, const std::string& origin) {
  BpeOptions opt;
  try {
    opt.pretokenizer = Pretokenizer::for_ggml_pre(vocab.pre, &opt.ignore_merges);
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what());
  }
  // Views into vocab.merges stay valid when the vocabulary is moved: a moved vector
  // keeps its elements where they are.
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(vocab.merges.size());
  for (const std::string& m : vocab.merges) {
    // Byte-level tokens never contain a space, so the first one separates the parts.
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) throw Error(origin + ": tokenizer.ggml.merges entry '" + m + "' has no space");
    merges.emplace_back(std::string_view(m).substr(0, sp), std::string_view(m).substr(sp + 1));
  }
  return std::make_unique<BpeTokenizer>(std::move(vocab), merges, std::move(opt), origin);
}

void BpeTokenizer::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  bool last_unknown = false;
  for (size_t pos = 0; pos < word.size();) {
    const int len = std::max(1, utf8::sequence_length(word, pos));
    const std::string_view ch = word.substr(pos, (size_t)len);
    pos += (size_t)len;
    if (const auto it = ids_.find(ch); it != ids_.end()) {
      ids.push_back(it->second);
      last_unknown = false;
    } else if (opt_.byte_fallback && have_all_byte_tokens_) {
      for (unsigned char b : ch) ids.push_back(byte_tokens_[b]);
      last_unknown = false;
    } else if (vocab_.unk_id >= 0) {
      if (!(opt_.fuse_unk && last_unknown)) ids.push_back(vocab_.unk_id);
      last_unknown = true;
    }
    // Without an unknown token the character has no id and is dropped.
  }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    if (const auto it = ids_.find(word); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> id;
  initial_symbols(word, id);
  const int n = (int)id.size();
  if (n <= 1) {
    out.insert(out.end(), id.begin(), id.end());
    return;
  }
  // Symbols form a linked list; candidate merges wait in a heap ordered by rank, then by
  // position, so the best-ranked pair merges first and ties go to the leftmost pair.
  // Entries go stale when a neighbour merges; they are checked when popped.
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    const auto it = merges_.find(pair_key(id[i], id[next[i]]));
    if (it != merges_.end()) heap.push({it->second.rank, i, id[i], id[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int r = next[c.pos];
    if (id[c.pos] != c.left || r < 0 || id[r] != c.right) continue;
    id[c.pos] = merges_.at(pair_key(c.left, c.right)).result;
    id[r] = -1;  // dead: no stale entry can match it again
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (!opt_.normalizer.empty()) {
    normalized = opt_.normalizer.apply(text);
    text = normalized;
  }
  const std::vector<std::string_view> words =
      opt_.pretokenizer.empty() ? std::vector<std::string_view>{text} : opt_.pretokenizer.split(text);
  for (std::string_view w : words) {
    if (opt_.byte_level) encode_word(byte_level::encode(w), out);
    else encode_word(w, out);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  size_t bad = 0;
  if (!is_valid_utf8(text, &bad)) {
    throw Error("invalid UTF-8 in text to tokenize at byte offset " + std::to_string(bad));
  }
  std::vector<int32_t> out;
  if (add_bos && vocab_.add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
  const SpecialSplitter& splitter = parse_special ? all_special_ : user_defined_;
  if (splitter.empty()) {
    if (!text.empty()) encode_segment(text, out);
  } else {
    for (const TextSegment& seg : splitter.split(text)) {
      if (seg.token >= 0) out.push_back(seg.token);
      else encode_segment(seg.text, out);
    }
  }
  if (add_bos && vocab_.add_eos && vocab_.eos_id >= 0) out.push_back(vocab_.eos_id);
  return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n_vocab()) +
                " tokens");
  }
  if (special && (vocab_.types[(size_t)id] == TokenType::control || vocab_.types[(size_t)id] == TokenType::unknown)) {
    return vocab_.tokens[(size_t)id];
  }
  return pieces_[(size_t)id];
}

}  // namespace kiln
