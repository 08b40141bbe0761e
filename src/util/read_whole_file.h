#pragma once
#include <fstream>
#include <string>

#include "kiln/error.h"

namespace kiln {

// A whole file's bytes in one read into a string of the right size (tokenizer files
// reach tens of megabytes). Throws kiln::Error "PATH: cannot open|read WHAT".
inline std::string read_whole_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": cannot open " + what);
  std::string bytes(size_t(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), std::streamsize(bytes.size()))) throw Error(path + ": cannot read " + what);
  return bytes;
}

}  // namespace kiln
