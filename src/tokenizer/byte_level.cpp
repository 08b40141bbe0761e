#include "tokenizer/byte_level.h"

#include <array>

namespace kiln::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> to_char;  // byte -> UTF-8 of its character
  std::array<int16_t, 324> to_byte;      // code point (all below 324) -> byte, -1 if none
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else {  // the alphabet stays below U+0800
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next++;
      append_utf8(t.to_char[b], cp);
      t.to_byte[cp] = (int16_t)b;
    }
    return t;
  }();
  return t;
}

}  // namespace

std::string encode(std::string_view raw) {
  const Tables& t = tables();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) out += t.to_char[b];
  return out;
}

std::string decode(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const auto c0 = (unsigned char)token[i];
    uint32_t cp = c0;
    size_t len = 1;
    if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c0 & 0x1Fu) << 6) | ((unsigned char)token[i + 1] & 0x3Fu);
      len = 2;
    } else if (c0 >= 0x80) {
      // Three- and four-byte characters are never in the alphabet.
      len = (c0 & 0xF0) == 0xE0 ? 3 : (c0 & 0xF8) == 0xF0 ? 4 : 1;
      out.append(token.substr(i, len));
      i += len;
      continue;
    }
    if (cp < t.to_byte.size() && t.to_byte[cp] >= 0) out += (char)t.to_byte[cp];
    else out.append(token.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace kiln::byte_level
