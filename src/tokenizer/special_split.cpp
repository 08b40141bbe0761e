#include "tokenizer/special_split.h"

#include <algorithm>
#include <cctype>

namespace kiln {

SpecialSplitter::SpecialSplitter(const Vocab& vocab, SpecialKinds kinds) : strip_(vocab.strip) {
  const bool control = kinds != SpecialKinds::user_defined;
  const bool user = kinds != SpecialKinds::control;
  std::vector<bool> special(vocab.size(), false);
  if (!vocab.types.empty()) {
    for (size_t i = 0; i < vocab.size(); ++i) {
      const TokenType t = vocab.types[i];
      special[i] = (control && (t == TokenType::control || t == TokenType::unknown)) ||
                   (user && t == TokenType::user_defined);
    }
  } else if (control) {
    // Without token types the only known special tokens are the ones the header names.
    for (int32_t id : {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id, vocab.eot_id, vocab.eom_id}) {
      if (id >= 0 && (size_t)id < vocab.size()) special[(size_t)id] = true;
    }
  }
  for (size_t i = 0; i < vocab.size(); ++i) {
    const std::string& t = vocab.tokens[i];
    // A string starting with a UTF-8 continuation byte could match inside a character
    // of valid text and cut it in two; no real special token looks like that.
    if (!special[i] || t.empty() || ((uint8_t)t[0] & 0xC0) == 0x80) continue;
    by_first_byte_[(uint8_t)t[0]].emplace_back(t, (int32_t)i);
    ++count_;
  }
  for (auto& list : by_first_byte_) {
    // Longest first; among equal strings the lowest id wins (stable sort keeps id order).
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
}

std::vector<TextSegment> SpecialSplitter::split(std::string_view text) const {
  std::vector<TextSegment> out;
  size_t raw_begin = 0, pos = 0;
  while (pos < text.size()) {
    const auto& candidates = by_first_byte_[(uint8_t)text[pos]];
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& c : candidates) {
      if (text.compare(pos, c.first.size(), c.first) == 0) {
        hit = &c;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    const uint8_t strip = size_t(hit->second) < strip_.size() ? strip_[size_t(hit->second)] : 0;
    size_t raw_end = pos;
    if (strip & Vocab::kStripBefore)
      while (raw_end > raw_begin && std::isspace((unsigned char)text[raw_end - 1])) --raw_end;
    if (raw_end > raw_begin) out.push_back({text.substr(raw_begin, raw_end - raw_begin), -1});
    out.push_back({{}, hit->second});
    pos += hit->first.size();
    if (strip & Vocab::kStripAfter)
      while (pos < text.size() && std::isspace((unsigned char)text[pos])) ++pos;
    raw_begin = pos;
  }
  if (raw_begin < text.size()) out.push_back({text.substr(raw_begin), -1});
  return out;
}

}  // namespace kiln
