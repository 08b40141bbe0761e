// SentencePiece-BPE vocabularies published as a tokenizer.json (Gemma 3's) restated with
// the scores a GGUF "llama" vocabulary needs.
//
// The two merge rules differ in form. llama.cpp's SentencePiece tokenizer (and the
// sentencepiece library kiln uses) repeatedly joins the adjacent pair whose concatenation
// is a token of the highest score, the leftmost on a tie, whatever the two halves are.
// A tokenizer.json's BPE joins the adjacent pair of the lowest rank in its merge list.
// transformers' converter made that list from the SentencePiece model by listing, for
// each piece in score order, every split of it into two pieces. Such a list is the score
// order in disguise: a piece's score can be taken back as minus the rank of its first
// merge. That holds only when the list is such a listing, which is checked rather than
// assumed: every merge joins two tokens into a token, the merges making one token are
// consecutive (but for added tokens, below), and every split of a token into two symbols the SentencePiece rule could
// join (tokens, or single characters that are not tokens) is listed.
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "kiln/error.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

uint64_t merge_pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

}  // namespace

Vocab spm_vocab_from_merges(const Vocab& in, const std::string& origin) {
  const auto fail = [&](const std::string& why) {
    throw Error(origin + ": its merges cannot be restated as SentencePiece scores: " + why);
  };
  if (in.model != "llama") fail("not a SentencePiece-style vocabulary");
  if (in.merges.empty()) fail("it has no merges");
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(in.tokens.size());
  for (size_t i = 0; i < in.tokens.size(); ++i) ids.emplace(in.tokens[i], int32_t(i));
  const auto id_of = [&](std::string_view s) {
    const auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };

  const size_t n = in.tokens.size();
  std::vector<int64_t> first(n, -1), last(n, -1);
  std::unordered_set<uint64_t> listed;
  listed.reserve(in.merges.size());
  std::string joined;
  for (size_t r = 0; r < in.merges.size(); ++r) {
    const std::string& m = in.merges[r];
    // "a b": a token may itself hold a space, so the split is the one naming two tokens.
    int32_t a = -1, b = -1, t = -1;
    for (size_t sp = m.find(' '); sp != std::string::npos && t < 0; sp = m.find(' ', sp + 1)) {
      a = id_of(std::string_view(m).substr(0, sp));
      b = id_of(std::string_view(m).substr(sp + 1));
      if (a < 0 || b < 0) continue;
      joined.assign(m, 0, sp).append(m, sp + 1);
      t = id_of(joined);
    }
    if (t < 0) fail("merge " + std::to_string(r) + " '" + m + "' does not join two tokens into a token");
    // Exempt: added tokens (user-defined), whose merges transformers ordered by length
    // within their tied score (Gemma's runs of newlines, tabs and spaces). Runs of
    // newlines and tabs are split out of the text before merging; a run of up to 31
    // spaces ends as one token in any merge order (see tests/data/families/README.md).
    const bool user_defined = !in.types.empty() && in.types[size_t(t)] == TokenType::user_defined;
    if (first[size_t(t)] < 0) first[size_t(t)] = int64_t(r);
    else if (last[size_t(t)] != int64_t(r) - 1 && !user_defined)
      fail("the merges making '" + in.tokens[size_t(t)] + "' are not consecutive (ranks " +
           std::to_string(last[size_t(t)]) + " and " + std::to_string(r) + ")");
    last[size_t(t)] = int64_t(r);
    listed.insert(merge_pair_key(a, b));
  }

  // A symbol is a token or one character; -2 stands for a character outside the vocabulary.
  const auto symbol = [&](std::string_view s) {
    const int32_t id = id_of(s);
    return id >= 0 ? id : utf8_length((unsigned char)s[0]) == s.size() ? -2 : -1;
  };
  for (size_t t = 0; t < n; ++t) {
    const std::string& text = in.tokens[t];
    for (size_t k = utf8_length((unsigned char)text[0]); k < text.size(); k += utf8_length((unsigned char)text[k])) {
      const int32_t a = symbol(std::string_view(text).substr(0, k)), b = symbol(std::string_view(text).substr(k));
      if (a == -1 || b == -1) continue;
      if (a == -2 || b == -2 || !listed.count(merge_pair_key(a, b)))
        fail("'" + text.substr(0, k) + "' + '" + text.substr(k) + "' makes token " + std::to_string(t) +
             " but is not a merge");
    }
  }

  Vocab out = in;
  out.merges.clear();
  out.scores.assign(n, -float(in.merges.size()));  // tokens no merge makes: never joined
  for (size_t t = 0; t < n; ++t)
    if (first[t] >= 0) out.scores[t] = -float(first[t]);
  return out;
}

}  // namespace kiln
