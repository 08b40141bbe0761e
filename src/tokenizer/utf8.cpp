#include "tokenizer/utf8.h"

#include <cstdint>

#include "kiln/tokenizer.h"

namespace kiln::utf8 {
namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The allowed range of the second byte depends on the lead byte: this is what rules out
// overlong forms, UTF-16 surrogates and code points above U+10FFFF (RFC 3629 table).
bool second_byte_ok(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return is_continuation(b);
  }
}

int expected_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte, C0/C1 (always overlong) or F5..FF
}

}  // namespace

int sequence_length(std::string_view text, size_t pos) {
  const auto lead = (uint8_t)text[pos];
  const int len = expected_length(lead);
  if (len <= 1) return len;
  for (int k = 1; k < len; ++k) {
    if (pos + k >= text.size()) return -1;  // every byte so far was acceptable
    const auto b = (uint8_t)text[pos + k];
    if (!(k == 1 ? second_byte_ok(lead, b) : is_continuation(b))) return 0;
  }
  return len;
}

void drain_complete(std::string& pending, std::string& out) {
  size_t pos = 0;
  while (pos < pending.size()) {
    const int len = sequence_length(pending, pos);
    if (len < 0) break;  // wait for the rest of this character
    if (len == 0) {
      out += kReplacement;
      ++pos;
      continue;
    }
    out.append(pending, pos, (size_t)len);
    pos += (size_t)len;
  }
  pending.erase(0, pos);
}

}  // namespace kiln::utf8

namespace kiln {

bool is_valid_utf8(std::string_view text, size_t* error_offset) {
  size_t pos = 0;
  while (pos < text.size()) {
    const int len = utf8::sequence_length(text, pos);
    if (len <= 0) {
      if (error_offset) *error_offset = pos;
      return false;
    }
    pos += (size_t)len;
  }
  return true;
}

}  // namespace kiln
