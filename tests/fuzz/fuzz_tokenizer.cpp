// Encoding and decoding on every vocabulary kiln can build a tokenizer for: the GGUF
// vocabularies and the SentencePiece .model files in ../shared. They are built through
// the public Tokenizer API, so a new tokenizer family is fuzzed as soon as
// Tokenizer::from_gguf accepts its files.
// Input: [tokenizer index][flags][text or token ids]. Checked: encoding valid UTF-8
// succeeds with ids inside the vocabulary, invalid UTF-8 is a kiln::Error, and streamed
// detokenization only ever emits valid UTF-8.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"

namespace {

std::vector<std::unique_ptr<kiln::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<kiln::Tokenizer>> all = [] {
    std::vector<std::unique_ptr<kiln::Tokenizer>> out;
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    const fs::path shared = kiln::fuzz::shared_dir();
    for (const char* dir : {"vocab", "models", "tokenizers"})
      for (const auto& e : fs::recursive_directory_iterator(shared / dir))
        if (e.path().extension() == ".gguf" || e.path().extension() == ".model") files.push_back(e.path());
    std::sort(files.begin(), files.end());  // the index byte must mean the same every run
    for (const fs::path& p : files) {
      try {
        if (p.extension() == ".gguf") out.push_back(kiln::Tokenizer::from_gguf(*kiln::gguf::File::open(p.string())));
        else out.push_back(kiln::Tokenizer::from_spm_file(p.string()));
      } catch (const kiln::Error&) {
        // A family kiln does not tokenize yet.
      }
    }
    if (out.empty()) {
      std::fprintf(stderr, "fuzz_tokenizer: no tokenizer under %s\n", shared.c_str());
      std::abort();
    }
    return out;
  }();
  return all;
}

void check_utf8(const std::string& s) {
  if (!kiln::is_valid_utf8(s)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const kiln::Tokenizer& tok = *tokenizers()[data[0] % tokenizers().size()];
  const uint8_t flags = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const int32_t n_vocab = tok.n_vocab();

  std::vector<int32_t> ids;
  if (flags & 4) {
    // The bytes as token ids (16 bits each), some of them outside the vocabulary.
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
      return 0;
    }
    for (int32_t id : ids)
      if (id < 0 || id >= n_vocab) __builtin_trap();
  }

  kiln::Detokenizer detok(tok);
  std::string streamed;
  for (int32_t id : ids) {
    try {
      const std::string piece = detok.push(id);
      check_utf8(piece);
      streamed += piece;
      (void)tok.token_to_piece(id, flags & 16);
      (void)tok.is_eog(id);
    } catch (const kiln::Error&) {
      if (id >= 0 && id < n_vocab) throw;  // only an id outside the vocabulary may fail
    }
  }
  const std::string rest = detok.flush();
  check_utf8(rest);
  try {
    (void)tok.decode(ids, flags & 16);
  } catch (const kiln::Error&) {
  }
  return 0;
}
