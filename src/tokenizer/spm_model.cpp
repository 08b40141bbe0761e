// Translation between kiln's Vocab and sentencepiece's ModelProto.
#include <string>
#include <unordered_set>

#include "tokenizer/spm_tokenizer.h"

namespace kiln {
namespace {

// The byte value of a "<0xNN>" piece, or -1.
int byte_piece_value(const std::string& text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[(size_t)i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return -1;  // sentencepiece only writes upper-case hex
    v = v * 16 + d;
  }
  return v;
}

bool has_all_byte_pieces(const Vocab& v) {
  if (v.types.empty()) return false;
  std::vector<bool> found(256, false);
  size_t n = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.types[i] != TokenType::byte) continue;
    const int b = byte_piece_value(v.tokens[i]);
    if (b >= 0 && !found[(size_t)b]) found[(size_t)b] = true, ++n;
  }
  return n == 256;
}

bool is_valid_id(const Vocab& v, int32_t id) { return id >= 0 && (size_t)id < v.size(); }

}  // namespace

spm::ModelProto model_proto_from_vocab(const Vocab& v, bool* unk_appended) {
  spm::ModelProto m;
  // GGUF "llama" vocabularies come from SentencePiece BPE models: their scores are merge
  // priorities, and llama.cpp (which defines what these files mean) merges by them.
  // A unigram reading of the same scores would segment differently.
  m.model_type = spm::ModelType::bpe;
  m.normalizer_name = "identity";
  m.add_dummy_prefix = v.add_space_prefix;
  m.remove_extra_whitespaces = false;
  m.escape_whitespaces = true;
  // sentencepiece refuses byte_fallback unless all 256 byte pieces exist; with a partial
  // set the byte pieces are made unreachable and unknown characters become unk instead.
  m.byte_fallback = has_all_byte_pieces(v);
  const bool unk_ok = is_valid_id(v, v.unk_id);
  m.unk_id = unk_ok ? v.unk_id : (int32_t)v.size();
  m.bos_id = is_valid_id(v, v.bos_id) ? v.bos_id : -1;
  m.eos_id = is_valid_id(v, v.eos_id) ? v.eos_id : -1;
  m.pad_id = is_valid_id(v, v.pad_id) ? v.pad_id : -1;

  std::unordered_set<std::string_view> seen;
  seen.reserve(v.size());
  m.pieces.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    spm::Piece& p = m.pieces[i];
    const auto id = (int32_t)i;
    p.text = v.tokens[i];
    p.score = v.scores.empty() ? 0.0f : v.scores[i];
    TokenType t = v.types.empty() ? TokenType::normal : v.types[i];
    if (v.types.empty() && (id == v.bos_id || id == v.eos_id || id == v.pad_id || id == v.eot_id ||
                            id == v.eom_id)) {
      t = TokenType::control;  // never produce these from plain text
    }
    switch (t) {
      case TokenType::undefined:
      case TokenType::normal: p.type = spm::PieceType::normal; break;
      case TokenType::user_defined: p.type = spm::PieceType::user_defined; break;
      case TokenType::unused: p.type = spm::PieceType::unused; break;
      case TokenType::byte:
        p.type = m.byte_fallback ? spm::PieceType::byte : spm::PieceType::control;
        break;
      // sentencepiece allows exactly one unknown piece; the others (phi-3's padding
      // tokens) must just never come out of text, which control pieces guarantee.
      case TokenType::unknown:
      case TokenType::control: p.type = spm::PieceType::control; break;
    }
    if (id == m.unk_id) p.type = spm::PieceType::unknown;

    const bool acceptable = !p.text.empty() && p.text.find('\0') == std::string::npos &&
                            p.text.size() < 8000 && seen.insert(v.tokens[i]).second;
    if (!acceptable) {
      // Keeps the id reserved but unreachable: no text produces a control piece, and
      // this string cannot collide with a real token (it contains U+0001).
      p.text = "\x01kiln-unreachable-" + std::to_string(i);
      if (p.type != spm::PieceType::unknown) p.type = spm::PieceType::control;
    }
  }
  if (!unk_ok) m.pieces.push_back({"\x01kiln-unk", 0.0f, spm::PieceType::unknown});
  if (unk_appended) *unk_appended = !unk_ok;
  return m;
}

Vocab vocab_from_model_proto(const spm::ModelProto& m) {
  Vocab v;
  v.model = "llama";
  v.tokens.reserve(m.pieces.size());
  v.scores.reserve(m.pieces.size());
  v.types.reserve(m.pieces.size());
  for (const spm::Piece& p : m.pieces) {
    v.tokens.push_back(p.text);
    v.scores.push_back(p.score);
    const auto t = (int32_t)p.type;
    v.types.push_back(t >= 1 && t <= 6 ? (TokenType)t : TokenType::undefined);
  }
  v.unk_id = v.bos_id = v.eos_id = v.pad_id = -1;
  // The ids that matter are the pieces' types, not the trainer's (informational) ids.
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.types[i] == TokenType::unknown && v.unk_id < 0) v.unk_id = (int32_t)i;
  }
  auto control_id = [&](int32_t id) {
    return is_valid_id(v, id) && v.types[(size_t)id] == TokenType::control ? id : -1;
  };
  v.bos_id = control_id(m.bos_id);
  v.eos_id = control_id(m.eos_id);
  v.pad_id = control_id(m.pad_id);
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = m.add_dummy_prefix;
  return v;
}

}  // namespace kiln
