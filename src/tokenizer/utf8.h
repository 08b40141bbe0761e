#pragma once
// UTF-8 helpers shared by the encoder (validation) and the Detokenizer (streaming).
#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at text[pos]: 1..4, 0 if the bytes there
// can never start a valid character, or -1 if they are a valid but truncated prefix
// (more bytes could still complete it).
int sequence_length(std::string_view text, size_t pos);

// Moves the longest prefix of `pending` that can be shown into `out`: complete characters
// as they are, bytes that can never become valid as U+FFFD. What stays in `pending` is a
// truncated sequence waiting for its remaining bytes (at most 3 bytes).
void drain_complete(std::string& pending, std::string& out);

}  // namespace kiln::utf8
