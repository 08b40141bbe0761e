#pragma once
// GPT-2's byte-level alphabet: every byte gets a printable character (bytes that are
// already printable Latin-1 keep theirs, the rest take U+0100 onwards), so BPE over
// characters covers any byte string and no token ever holds a raw space or control byte.
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::byte_level {

// The UTF-8 of the character standing for each byte of `raw`, concatenated.
std::string encode(std::string_view raw);
// The bytes a token's characters stand for; a character outside the alphabet (a token
// added as plain text) keeps its own UTF-8.
std::string decode(std::string_view token);

}  // namespace kiln::byte_level
