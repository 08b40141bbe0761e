#include "kiln/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kiln {

std::string Detokenizer::push(int32_t id) {
  // Byte-fallback tokens deliver a character one byte at a time; printing each byte as
  // it comes would show garbage, so an incomplete tail waits in pending_.
  pending_ += tokenizer_.token_to_piece(id);
  std::string out;
  utf8::drain_complete(pending_, out);
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  utf8::drain_complete(pending_, out);
  // Whatever is left is a character whose remaining bytes never came.
  if (!pending_.empty()) out += utf8::kReplacement;
  pending_.clear();
  return out;
}

}  // namespace kiln
