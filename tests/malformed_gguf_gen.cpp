// Writes every malformed GGUF case (tests/malformed_gguf.h) and the valid base model into
// a directory: seeds for the GGUF fuzz target, or files to try by hand.
#include <cstdio>
#include <fstream>

#include "kiln/gguf.h"
#include "malformed_gguf.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: malformed_gguf_gen VOCAB.gguf OUT_DIR\n");
    return 2;
  }
  try {
    auto vocab = kiln::gguf::File::open(argv[1]);
    auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
      std::ofstream out(std::string(argv[2]) + "/" + name + ".gguf", std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      if (!out) throw kiln::Error(std::string(argv[2]) + ": cannot write " + name);
    };
    write("base", kiln::test::base_model(*vocab).bytes());
    for (const auto& c : kiln::test::malformed_gguf_cases(*vocab)) write(c.name, c.bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "malformed_gguf_gen: %s\n", e.what());
    return 1;
  }
  return 0;
}
