// llama2.c's tokenizer.bin: int32 max_token_length, then per token a float32 score, an
// int32 byte length and the piece. The exporter wrote SentencePiece pieces with "▁" as a
// plain space and BOS/EOS as "\n<s>\n" / "\n</s>\n"; undoing that gives back the
// SentencePiece vocabulary the GGUF conversion of the same model carries.
#include <cstring>
#include <fstream>
#include <sstream>

#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "util/read_whole_file.h"

namespace kiln {
namespace {

struct Entry {
  float score;
  std::string piece;
};

// The entries, or false when `bytes` is not laid out as a tokenizer.bin.
bool parse(const std::string& bytes, std::vector<Entry>& out) {
  auto read_i32 = [&](size_t pos, int32_t& v) {
    if (pos + 4 > bytes.size()) return false;
    std::memcpy(&v, bytes.data() + pos, 4);
    return true;
  };
  int32_t max_len = 0;
  if (!read_i32(0, max_len) || max_len <= 0 || max_len > 4096) return false;
  out.clear();
  for (size_t pos = 4; pos < bytes.size();) {
    Entry e;
    int32_t len = 0;
    if (pos + 8 > bytes.size()) return false;
    std::memcpy(&e.score, bytes.data() + pos, 4);
    if (!read_i32(pos + 4, len) || len < 0 || len > max_len || pos + 8 + (size_t)len > bytes.size()) return false;
    e.piece.assign(bytes, pos + 8, (size_t)len);
    out.push_back(std::move(e));
    pos += 8 + (size_t)len;
  }
  return !out.empty();
}

bool is_byte_piece(const std::string& p) {
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>';
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_llama2c_file(const std::string& path) {
  std::vector<Entry> entries;
  if (!parse(read_whole_file(path, "tokenizer file"), entries)) throw Error(path + ": not a llama2.c tokenizer.bin");
  Vocab v;
  v.model = "llama";
  v.bos_id = 1, v.eos_id = 2, v.unk_id = 0;  // llama2.c's fixed ids
  v.add_bos = true, v.add_space_prefix = true;
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string p = entries[i].piece;
    TokenType t = TokenType::normal;
    if (i == (size_t)v.unk_id) {
      t = TokenType::unknown;
    } else if (i == (size_t)v.bos_id || i == (size_t)v.eos_id) {
      // "\n<s>\n" -> "<s>"
      if (p.size() >= 2 && p.front() == '\n' && p.back() == '\n') p = p.substr(1, p.size() - 2);
      t = TokenType::control;
    } else if (is_byte_piece(p)) {
      t = TokenType::byte;
    } else {
      std::string restored;
      for (char c : p) {
        if (c == ' ') restored += "\xE2\x96\x81";
        else restored += c;
      }
      p = std::move(restored);
    }
    v.tokens.push_back(std::move(p));
    v.scores.push_back(entries[i].score);
    v.types.push_back(t);
  }
  return SpmTokenizer::from_vocab(std::move(v), path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  {
    // JSON is told by its first character; only the other kinds are read whole here.
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open tokenizer file");
    char c = 0;
    while (in.get(c) && (c == ' ' || c == '\t' || c == '\r' || c == '\n')) {}
    if (in && c == '{') return from_hf_json(path);
  }
  std::vector<Entry> entries;
  if (parse(read_whole_file(path, "tokenizer file"), entries)) return from_llama2c_file(path);
  return from_spm_file(path);
}

}  // namespace kiln
