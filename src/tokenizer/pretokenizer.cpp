#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "kiln/error.h"

namespace kiln {
namespace {

// The published split patterns of each family (their tokenizer.json files state them).
// GPT-2's own: contractions, letters, digits and other runs each with one optional
// leading space, and whitespace that leaves its last space to the next word.
const std::string kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: case-insensitive contractions, numbers in groups of at most three, newlines
// kept apart from other whitespace.
const std::string kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 but every digit alone.
const std::string kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (GPT-4o, gpt-oss; tokenizer.ggml.pre "gpt-4o"): words split at case changes, a
// run of capitals, then lower-case letters, each with an optional leading non-letter and
// an optional contraction; numbers in groups of at most three; punctuation runs that keep
// following newlines and slashes. The published pattern's classes ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
// for capitals, [\p{Ll}\p{Lm}\p{Lo}\p{M}] for small letters) are written here as llama.cpp
// runs them, which is what GGUF users get: a capital is any letter but a-z, a small letter
// any letter but A-Z (so every letter outside ASCII is both), and marks join no word.
const std::string kO200kUpper = R"((?:(?=\p{L})[^a-z]))", kO200kLower = R"((?:(?=\p{L})[^A-Z]))";
const std::string kO200kContraction = R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)";
const std::string kO200k = R"([^\r\n\p{L}\p{N}]?)" + kO200kUpper + "*" + kO200kLower + "+" + kO200kContraction +
                           R"(|[^\r\n\p{L}\p{N}]?)" + kO200kUpper + "+" + kO200kLower + "*" + kO200kContraction +
                           R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's cased-letter class, written as code points: the tokenizer.json spells
// some range ends with characters that Unicode normalization would turn into others
// (U+1F7D, U+1FD3, U+1FDB, U+1FBE, U+2126, U+212A), and a normalized copy has
// descending ranges.
const std::string kDeepseekLetters =
    R"([\x{41}-\x{5A}\x{61}-\x{7A}\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})"
    R"(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386})"
    R"(\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F})"
    R"(\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA})"
    R"(\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
    R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}])";
// CJK ideographs (U+4E00-U+9FA5), U+0800-U+4E00 and Hangul syllables, as DeepSeek splits them.
const std::string kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

struct Family {
  std::initializer_list<const char*> names;
  std::initializer_list<std::string> stages;
  bool ignore_merges = false;
};

const std::initializer_list<Family>& families() {
  static const std::initializer_list<Family> table = {
      {{"gpt-2", "mpt", "olmo"}, {kGpt2}},
      // A byte-level BPE file without tokenizer.ggml.pre (older conversions, gpt-neox):
      // llama.cpp's fallback, which GGUF users get. Punctuation runs first, the GPT-2
      // split, then digits apart from the space before them, cut into threes.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
      {{"llama-bpe", "llama3", "llama-v3"}, {kLlama3}, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "stablelm2", "deepseek-r1-qwen"}, {kQwen2}},
      {{"deepseek-llm"},
       {R"([\r\n])", R"(\s?)" + kDeepseekLetters + "+",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      // Punctuation runs (Unicode P plus the ASCII symbols Rust counts as punctuation),
      // the GPT-2 split, then numbers cut into threes.
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {{"starcoder", "refact", "command-r", "smollm"}, {R"(\p{N})", kGpt2}},
      {{"gpt-4o", "llama4"}, {kO200k}},
  };
  return table;
}

}  // namespace

const std::string& Pretokenizer::gpt2_pattern() { return kGpt2; }

void Pretokenizer::add_stage(const std::string& pattern, SplitBehavior behavior) {
  stages_.push_back({UnicodeRegex(pattern), behavior});
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const Stage& stage : stages_) {
    next.clear();
    for (std::string_view piece : pieces) {
      const auto matches = stage.regex.find_all(piece);
      auto emit = [&](size_t b, size_t e) {
        if (e > b) next.push_back(piece.substr(b, e - b));
      };
      size_t prev = 0;  // end of what has been emitted
      switch (stage.behavior) {
        case SplitBehavior::isolated:
        case SplitBehavior::removed:
          for (auto [b, e] : matches) {
            emit(prev, b);
            if (stage.behavior == SplitBehavior::isolated) emit(b, e);
            prev = e;
          }
          break;
        case SplitBehavior::merged_with_previous:
          for (auto [b, e] : matches) {
            emit(prev, e);
            prev = e;
          }
          break;
        case SplitBehavior::merged_with_next:
          for (auto [b, e] : matches) {
            emit(prev, b);
            prev = b;
          }
          break;
        case SplitBehavior::contiguous:
          for (size_t i = 0; i < matches.size();) {
            const size_t b = matches[i].first;
            size_t e = matches[i].second;
            while (++i < matches.size() && matches[i].first == e) e = matches[i].second;
            emit(prev, b);
            emit(b, e);
            prev = e;
          }
          break;
      }
      emit(prev, piece.size());
    }
    pieces.swap(next);
  }
  return pieces;
}

Pretokenizer Pretokenizer::for_ggml_pre(const std::string& pre, bool* ignore_merges) {
  const std::string name = pre.empty() ? "default" : pre;
  for (const Family& f : families()) {
    for (const char* n : f.names) {
      if (name != n) continue;
      Pretokenizer p;
      for (const std::string& s : f.stages) p.add_stage(s);
      if (ignore_merges) *ignore_merges = f.ignore_merges;
      return p;
    }
  }
  throw Error("tokenizer.ggml.pre '" + pre + "' is not supported (supported: " + supported_ggml_pre() + ")");
}

std::string Pretokenizer::ggml_pre_name(const std::vector<std::string>& patterns, bool ignore_merges) {
  for (const Family& f : families()) {
    if (f.ignore_merges == ignore_merges && std::equal(patterns.begin(), patterns.end(), f.stages.begin(), f.stages.end()))
      return *f.names.begin();
  }
  return "";
}

std::string Pretokenizer::supported_ggml_pre() {
  std::string out;
  for (const Family& f : families()) {
    for (const char* n : f.names) out += (out.empty() ? "" : ", ") + std::string(n);
  }
  return out;
}

}  // namespace kiln
