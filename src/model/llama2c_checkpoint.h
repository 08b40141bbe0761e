#pragma once
// llama2.c checkpoints (Karpathy's run.c format): the legacy header of seven int32s and
// float32 weights, and export.py's version 1 (float32) and version 2 (int8 groups with
// float32 scales) behind a 256-byte "ak42" header. They are turned into the GGUF layout
// that llama.cpp's converter gives the same model, so one loader serves both.
#include <cstdint>
#include <string>

#include "kiln/gguf.h"
#include "kiln/tokenizer.h"

namespace kiln {

struct Llama2cHeader {
  int32_t version = 0;  // 0: legacy
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  int32_t group_size = 0;  // version 2
  uint64_t data_offset = 0;
};

// The header when `path` is a llama2.c checkpoint whose size fits it, else false.
bool read_llama2c_header(const std::string& path, Llama2cHeader& header);
// The same from the file's first `n` bytes (up to 256), without the size check; and the
// size a file with this header must have (0: none can). The fuzz target sizes mutated
// headers' files with them, so that mutations reach the weights reader.
bool parse_llama2c_header(const uint8_t* head, size_t n, Llama2cHeader& header);
uint64_t llama2c_file_size(const Llama2cHeader& header);

// A GGUF (architecture llama, F32 weights; version 2's groups dequantized) holding the
// checkpoint's weights and `vocab` as its tokenizer. Throws kiln::Error naming the file.
gguf::Writer llama2c_to_gguf(const std::string& path, const Vocab& vocab);

}  // namespace kiln
