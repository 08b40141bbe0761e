// Encoding and decoding on every vocabulary kiln can build a tokenizer for: the GGUF
// vocabularies, SentencePiece .model files, Hugging Face tokenizer.json files and llama2.c
// tokenizer.bin files in ../shared. They are built through the public Tokenizer API, so a
// new tokenizer family is fuzzed as soon as Tokenizer::from_gguf / from_file accepts its
// files (KILN_FUZZ_VERBOSE=1 lists which load).
// Input: [tokenizer index][flags][text or token ids]; the checks are tokenizer_checks.h's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer_checks.h"
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
      for (const auto& e : fs::recursive_directory_iterator(shared / dir)) {
        const fs::path& p = e.path();
        const std::string name = p.filename().string();
        if (p.extension() == ".gguf" || p.extension() == ".model" || name == "tokenizer.json" ||
            (p.extension() == ".bin" && name.rfind("tok", 0) == 0))
          files.push_back(p);
      }
    std::sort(files.begin(), files.end());  // the index byte must mean the same every run
    for (const fs::path& p : files) {
      try {
        if (p.extension() == ".gguf") out.push_back(kiln::Tokenizer::from_gguf(*kiln::gguf::File::open(p.string())));
        else out.push_back(kiln::Tokenizer::from_file(p.string()));
        if (std::getenv("KILN_FUZZ_VERBOSE"))
          std::fprintf(stderr, "fuzz_tokenizer: %zu %s\n", out.size() - 1, p.c_str());
      } catch (const kiln::Error& e) {
        // A family kiln does not tokenize yet.
        if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "fuzz_tokenizer: skipped: %s\n", e.what());
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

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const kiln::Tokenizer& tok = *tokenizers()[data[0] % tokenizers().size()];
  kiln::fuzz::exercise_tokenizer(tok, data[1], std::string_view(reinterpret_cast<const char*>(data + 2), size - 2));
  return 0;
}
