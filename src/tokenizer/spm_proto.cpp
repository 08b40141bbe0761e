#include "tokenizer/spm_proto.h"

#include <cstring>

#include "kiln/error.h"

namespace kiln::spm {
namespace {

// Field numbers from sentencepiece_model.proto.
namespace field {
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPieceText = 1, kPieceScore = 2, kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35,
                   kTrainerUnkId = 40, kTrainerBosId = 41, kTrainerEosId = 42,
                   kTrainerPadId = 43;
constexpr uint32_t kNormName = 1, kNormCharsmap = 2, kNormAddDummyPrefix = 3,
                   kNormRemoveExtraWhitespaces = 4, kNormEscapeWhitespaces = 5;
}  // namespace field

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

class Out {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back((char)(uint8_t)(v | 0x80));
      v >>= 7;
    }
    buf_.push_back((char)(uint8_t)v);
  }
  void tag(uint32_t number, WireType wt) { varint((uint64_t(number) << 3) | wt); }
  // Negative int32 values are sign-extended to 64 bits on the wire (10 bytes), as
  // protobuf requires for int32/enum fields.
  void int32(uint32_t number, int32_t v) {
    tag(number, kVarint);
    varint((uint64_t)(int64_t)v);
  }
  void boolean(uint32_t number, bool v) {
    tag(number, kVarint);
    varint(v ? 1 : 0);
  }
  void fixed_float(uint32_t number, float v) {
    tag(number, kFixed32);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) buf_.push_back((char)(uint8_t)(bits >> (8 * i)));
  }
  void bytes(uint32_t number, std::string_view v) {
    tag(number, kLength);
    varint(v.size());
    buf_.append(v);
  }
  std::string& str() { return buf_; }

 private:
  std::string buf_;
};

class In {
 public:
  In(std::string_view data, const std::string& origin) : d_(data), origin_(origin) {}
  bool done() const { return pos_ >= d_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= d_.size()) fail("truncated varint");
      const auto b = (uint8_t)d_[pos_++];
      v |= uint64_t(b & 0x7F) << shift;
      if (b < 0x80) return v;
    }
    fail("varint longer than 10 bytes");
  }
  std::string_view length_delimited() {
    const uint64_t n = varint();
    if (n > d_.size() - pos_) fail("length-delimited field runs past the end");
    auto v = d_.substr(pos_, (size_t)n);
    pos_ += (size_t)n;
    return v;
  }
  float fixed_float() {
    if (d_.size() - pos_ < 4) fail("truncated fixed32");
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= uint32_t((uint8_t)d_[pos_ + i]) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  void skip(uint32_t wt) {
    switch (wt) {
      case kVarint: varint(); return;
      case kLength: length_delimited(); return;
      case kFixed32:
        if (d_.size() - pos_ < 4) fail("truncated fixed32");
        pos_ += 4;
        return;
      case kFixed64:
        if (d_.size() - pos_ < 8) fail("truncated fixed64");
        pos_ += 8;
        return;
      default: fail("unsupported wire type " + std::to_string(wt));
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(origin_ + ": malformed SentencePiece model (" + what + ")");
  }

 private:
  std::string_view d_;
  size_t pos_ = 0;
  const std::string& origin_;
};

void parse_piece(std::string_view bytes, const std::string& origin, Piece& p) {
  In in(bytes, origin);
  while (!in.done()) {
    const uint64_t t = in.varint();
    const auto number = uint32_t(t >> 3), wt = uint32_t(t & 7);
    if (number == field::kPieceText && wt == kLength) p.text = std::string(in.length_delimited());
    else if (number == field::kPieceScore && wt == kFixed32) p.score = in.fixed_float();
    else if (number == field::kPieceType && wt == kVarint) p.type = (PieceType)(int32_t)in.varint();
    else in.skip(wt);
  }
}

void parse_trainer(std::string_view bytes, const std::string& origin, ModelProto& m) {
  In in(bytes, origin);
  while (!in.done()) {
    const uint64_t t = in.varint();
    const auto number = uint32_t(t >> 3), wt = uint32_t(t & 7);
    if (wt != kVarint) {
      in.skip(wt);
      continue;
    }
    const auto v = (int32_t)in.varint();  // int32 fields: truncation is the protobuf rule
    switch (number) {
      case field::kTrainerModelType: m.model_type = (ModelType)v; break;
      case field::kTrainerByteFallback: m.byte_fallback = v != 0; break;
      case field::kTrainerUnkId: m.unk_id = v; break;
      case field::kTrainerBosId: m.bos_id = v; break;
      case field::kTrainerEosId: m.eos_id = v; break;
      case field::kTrainerPadId: m.pad_id = v; break;
      default: break;
    }
  }
}

void parse_normalizer(std::string_view bytes, const std::string& origin, ModelProto& m) {
  In in(bytes, origin);
  while (!in.done()) {
    const uint64_t t = in.varint();
    const auto number = uint32_t(t >> 3), wt = uint32_t(t & 7);
    if (wt == kLength && number == field::kNormName) m.normalizer_name = std::string(in.length_delimited());
    else if (wt == kLength && number == field::kNormCharsmap) m.precompiled_charsmap = std::string(in.length_delimited());
    else if (wt == kVarint && number == field::kNormAddDummyPrefix) m.add_dummy_prefix = in.varint() != 0;
    else if (wt == kVarint && number == field::kNormRemoveExtraWhitespaces) m.remove_extra_whitespaces = in.varint() != 0;
    else if (wt == kVarint && number == field::kNormEscapeWhitespaces) m.escape_whitespaces = in.varint() != 0;
    else in.skip(wt);
  }
}

}  // namespace

std::string serialize(const ModelProto& model) {
  Out out;
  for (const Piece& p : model.pieces) {
    Out piece;
    piece.bytes(field::kPieceText, p.text);
    piece.fixed_float(field::kPieceScore, p.score);
    piece.int32(field::kPieceType, (int32_t)p.type);
    out.bytes(field::kModelPieces, piece.str());
  }

  Out trainer;
  trainer.int32(field::kTrainerModelType, (int32_t)model.model_type);
  trainer.int32(field::kTrainerVocabSize, (int32_t)model.pieces.size());
  trainer.boolean(field::kTrainerByteFallback, model.byte_fallback);
  trainer.int32(field::kTrainerUnkId, model.unk_id);
  trainer.int32(field::kTrainerBosId, model.bos_id);
  trainer.int32(field::kTrainerEosId, model.eos_id);
  trainer.int32(field::kTrainerPadId, model.pad_id);
  out.bytes(field::kModelTrainerSpec, trainer.str());

  Out norm;
  norm.bytes(field::kNormName, model.normalizer_name);
  if (!model.precompiled_charsmap.empty()) norm.bytes(field::kNormCharsmap, model.precompiled_charsmap);
  norm.boolean(field::kNormAddDummyPrefix, model.add_dummy_prefix);
  norm.boolean(field::kNormRemoveExtraWhitespaces, model.remove_extra_whitespaces);
  norm.boolean(field::kNormEscapeWhitespaces, model.escape_whitespaces);
  out.bytes(field::kModelNormalizerSpec, norm.str());
  return std::move(out.str());
}

ModelProto parse(std::string_view bytes, const std::string& origin) {
  ModelProto m;
  In in(bytes, origin);
  while (!in.done()) {
    const uint64_t t = in.varint();
    const auto number = uint32_t(t >> 3), wt = uint32_t(t & 7);
    if (wt != kLength) {
      in.skip(wt);
      continue;
    }
    const std::string_view sub = in.length_delimited();
    // Embedded messages that repeat are merged field by field, so parsing each occurrence
    // into the same struct gives protobuf's semantics.
    if (number == field::kModelPieces) parse_piece(sub, origin, m.pieces.emplace_back());
    else if (number == field::kModelTrainerSpec) parse_trainer(sub, origin, m);
    else if (number == field::kModelNormalizerSpec) parse_normalizer(sub, origin, m);
  }
  return m;
}

}  // namespace kiln::spm
