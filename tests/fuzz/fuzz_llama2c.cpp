// llama2.c files: a checkpoint (legacy, version 1 or 2) through Model::is_llama2c and
// Model::load_llama2c with tok512.bin as its tokenizer, or a tokenizer.bin through
// Tokenizer::from_llama2c_file and then, with stories260K.bin, load_llama2c. Any outcome
// but a model or a kiln::Error is a finding; a model that loads must also run a prompt,
// and a tokenizer that loads must pass tokenizer_checks.h.
// Input: [selector][file]. Selector bit 0: the file is a tokenizer.bin; bit 1 (checkpoint)
// pad or cut the file to the size its header implies, since a reader that accepts only
// exactly-sized files would otherwise refuse nearly every mutated header; bit 2: packed
// weights.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "kiln/error.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "model/llama2c_checkpoint.h"
#include "tokenizer_checks.h"

namespace {

std::string shared_model(const char* name) { return kiln::fuzz::shared_dir() + "/models/" + name; }

void run_prompt(const kiln::Model& model) {
  kiln::SessionParams sp;
  sp.n_ctx = 8;
  sp.n_threads = 1;
  kiln::Session session(model, sp);
  const std::vector<int32_t> ids = model.tokenizer().encode("Once upon a time", true);
  if (!ids.empty()) session.decode(std::span(ids.data(), std::min<size_t>(ids.size(), 8)));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // load_llama2c writes its conversion to a temporary file: keep that off the disk.
  if (!std::getenv("TMPDIR") && std::filesystem::is_directory("/dev/shm")) setenv("TMPDIR", "/dev/shm", 1);
  for (const char* f : {"tok512.bin", "stories260K.bin"})
    if (!std::filesystem::exists(shared_model(f))) {
      std::fprintf(stderr, "fuzz_llama2c: %s is missing\n", shared_model(f).c_str());
      std::abort();
    }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  std::vector<uint8_t> file(data + 1, data + size);
  kiln::LoadParams lp;
  lp.repack = selector & 4;
  try {
    if (selector & 1) {
      fuzz::MemFile f(file.data(), file.size());
      auto tok = Tokenizer::from_llama2c_file(f.path());
      fuzz::exercise_tokenizer(*tok, 0, "Once upon a time, \xE4\xB8\x96\xE7\x95\x8C <s> 123");
      fuzz::exercise_tokenizer(*tok, 4 | 16, std::string_view("\x00\x00\x01\x00\x02\x00\x03\x01\xff\x01", 10));
      if (tok->n_vocab() <= 512) run_prompt(*Model::load_llama2c(shared_model("stories260K.bin"), std::move(tok), lp));
      return 0;
    }
    if (selector & 2) {
      Llama2cHeader h;
      if (!parse_llama2c_header(file.data(), file.size(), h)) return 0;
      const uint64_t want = llama2c_file_size(h);
      if (want == 0 || want > (4u << 20)) return 0;  // keeps each run small and fast
      file.resize(want);
    }
    fuzz::MemFile f(file.data(), file.size());
    if (!Model::is_llama2c(f.path())) return 0;
    auto model = Model::load_llama2c(f.path(), Tokenizer::from_llama2c_file(shared_model("tok512.bin")), lp);
    run_prompt(*model);
  } catch (const Error&) {
  }
  return 0;
}
