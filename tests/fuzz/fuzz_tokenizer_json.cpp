// The Hugging Face tokenizer.json loader (Tokenizer::from_hf_json: the streaming reader
// of vocabulary and merges, then normalizers, pre-tokenizers with their regexes, added
// tokens, post-processor) on mutated files, with an optional tokenizer_config.json beside
// it. Any outcome but a tokenizer or a kiln::Error is a finding; a tokenizer that loads
// must pass tokenizer_checks.h on a few fixed strings and on its own special tokens.
// Input: [flags] tokenizer.json [NUL tokenizer_config.json]. Flags go to the checks.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "tokenizer_checks.h"

namespace {

namespace fs = std::filesystem;

// The loader finds the config by the file's directory, so both live in a private one
// (in memory where /dev/shm exists).
const fs::path& work_dir() {
  static const fs::path dir = [] {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("kiln-fuzz-tokenizer-json-" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), (std::streamsize)bytes.size());
  if (!out) std::abort();
}

struct RemoveAtExit {
  ~RemoveAtExit() {
    std::error_code ec;
    fs::remove_all(work_dir(), ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static RemoveAtExit cleanup;
  work_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0] & ~4;  // text, not ids: ids come below
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const fs::path json = work_dir() / "tokenizer.json", config = work_dir() / "tokenizer_config.json";
  write(json, rest.substr(0, nul));
  if (nul != std::string_view::npos) write(config, rest.substr(nul + 1));
  else fs::remove(config);
  std::unique_ptr<kiln::Tokenizer> tok;
  try {
    tok = kiln::Tokenizer::from_hf_json(json.string());
  } catch (const kiln::Error&) {
    return 0;
  }
  using kiln::fuzz::exercise_tokenizer;
  for (std::string_view text : {std::string_view("Hello world! 123 4567  \n\n\tcan't"),
                                std::string_view("\xC3\xA9t\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80 "
                                                 "\xE2\x96\x81x <s></s><|endoftext|><|im_start|><bos>"),
                                std::string_view("")})
    exercise_tokenizer(*tok, flags, text);
  // Every token by id, including the highest: the placeholders for gaps, byte tokens,
  // control tokens.
  std::string ids;
  for (int32_t id : {0, 1, 2, 3, tok->n_vocab() / 2, tok->n_vocab() - 1}) {
    ids.push_back(char(id & 0xff));
    ids.push_back(char((id >> 8) & 0xff));
  }
  exercise_tokenizer(*tok, 4 | (flags & 16), ids);
  // Added tokens' texts, as a chat template would put them into the prompt.
  std::string specials;
  for (int32_t id = 0; id < std::min(tok->n_vocab(), 1 << 16) && specials.size() < 4096; ++id)
    if (tok->vocab().types.size() > size_t(id) && tok->vocab().types[size_t(id)] != kiln::TokenType::normal)
      specials += tok->vocab().tokens[size_t(id)];
  if (kiln::is_valid_utf8(specials)) exercise_tokenizer(*tok, 2 | (flags & 1), specials);
  return 0;
}
