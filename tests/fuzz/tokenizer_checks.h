#pragma once
// What every tokenizer must do with any input, shared by the targets that build one
// (fuzz_tokenizer from the shipped vocabularies, fuzz_tokenizer_json and fuzz_llama2c
// from fuzzed files): encoding valid UTF-8 succeeds with ids inside the vocabulary,
// invalid UTF-8 is a kiln::Error, and streamed detokenization only ever emits valid
// UTF-8. A broken promise traps, so that libFuzzer keeps the input.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln::fuzz {

inline void check_utf8(const std::string& s) {
  if (!kiln::is_valid_utf8(s)) __builtin_trap();
}

// flags: bit 0 add BOS, bit 1 parse special tokens, bit 2 `text` is 16-bit token ids
// instead (bit 3: taken as they are, some outside the vocabulary), bit 4 render control
// tokens.
inline void exercise_tokenizer(const Tokenizer& tok, uint8_t flags, std::string_view text) {
  const int32_t n_vocab = tok.n_vocab();
  std::vector<int32_t> ids;
  if (flags & 4) {
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
      const int32_t raw = int32_t(uint8_t(text[i]) | uint8_t(text[i + 1]) << 8);
      ids.push_back(flags & 8 ? raw : raw % n_vocab);
    }
  } else {
    try {
      ids = tok.encode(text, flags & 1, flags & 2);
      if (!kiln::is_valid_utf8(text)) __builtin_trap();  // must have been refused
    } catch (const kiln::Error&) {
      if (kiln::is_valid_utf8(text)) throw;  // valid text must always encode
      return;
    }
    for (int32_t id : ids)
      if (id < 0 || id >= n_vocab) __builtin_trap();
  }

  kiln::Detokenizer detok(tok);
  for (int32_t id : ids) {
    try {
      check_utf8(detok.push(id));
      (void)tok.token_to_piece(id, flags & 16);
      (void)tok.is_eog(id);
    } catch (const kiln::Error&) {
      if (id >= 0 && id < n_vocab) throw;  // only an id outside the vocabulary may fail
    }
  }
  check_utf8(detok.flush());
  try {
    (void)tok.decode(ids, flags & 16);
  } catch (const kiln::Error&) {
  }
}

}  // namespace kiln::fuzz
