#pragma once
// The subset of sentencepiece's ModelProto (sentencepiece_model.proto) that kiln writes
// and reads. Debian ships libsentencepiece without its generated .pb.h, so the protobuf
// wire format is produced and parsed by hand here.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::spm {

// ModelProto.SentencePiece.Type; the numbers equal kiln::TokenType's.
enum class PieceType : int32_t {
  normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

// TrainerSpec.ModelType.
enum class ModelType : int32_t { unigram = 1, bpe = 2, word = 3, character = 4 };

struct Piece {
  std::string text;
  float score = 0;
  PieceType type = PieceType::normal;
};

// Defaults are the .proto's defaults, so a parsed message that omits a field reads the
// same as sentencepiece would read it.
struct ModelProto {
  std::vector<Piece> pieces;
  // TrainerSpec
  ModelType model_type = ModelType::unigram;
  bool byte_fallback = false;
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  // NormalizerSpec
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// Serialized ModelProto bytes, ready for SentencePieceProcessor::LoadFromSerializedProto.
std::string serialize(const ModelProto& model);

// Parses serialized ModelProto bytes; unknown fields are skipped. Throws kiln::Error
// (prefixed with `origin`) on malformed input.
ModelProto parse(std::string_view bytes, const std::string& origin);

}  // namespace kiln::spm
