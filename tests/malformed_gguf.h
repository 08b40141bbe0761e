#pragma once
// Hand-made hostile GGUF files, generated rather than committed: one small valid llama
// model serialized field by field, and a list of cases that each break one thing in it
// (a header field, a count, a string length, a tensor's place or shape, a key the loader
// needs, a token id). Used by malformed_gguf_test and, through malformed_gguf_gen, as
// seeds for the GGUF fuzz target.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/gguf.h"

namespace kiln::test {

// A GGUF file as its fields, so that a case can set any of them to what no writer would.
struct RawGguf {
  struct Kv {
    std::string key;
    uint32_t type = 0;          // ValueType, or anything else
    std::vector<uint8_t> body;  // the encoded value after the type
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = 0;  // TensorType, or anything else
    uint64_t offset = 0;
  };
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  // When set, written instead of the real number of tensors / keys.
  bool override_counts = false;
  uint64_t n_tensors = 0, n_kv = 0;
  std::vector<Kv> kv;
  std::vector<Tensor> tensors;
  uint64_t alignment = 32;    // pads the start of the data section
  std::vector<uint8_t> data;  // the data section

  // Where each section starts in bytes(): cases cut the file inside each of them.
  struct Layout {
    size_t kv_begin = 0, tensors_begin = 0, data_begin = 0;
  };
  std::vector<uint8_t> bytes(Layout* layout = nullptr) const;

  Kv* find(const std::string& key);
  Tensor* tensor(const std::string& name);
  void set(const std::string& key, const gguf::Value& v);  // replaces or appends
  void erase(const std::string& key);
  void erase_tensor(const std::string& name);
  // Appends an F32 tensor of seeded values (norm weights near 1) to the data section.
  void add_f32_tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t seed);
};

std::vector<uint8_t> encode_value(const gguf::Value& v);

// A small llama model (1 layer, dim 8, the stories260K vocabulary of 512 tokens) that
// loads and runs; every case below starts from it.
RawGguf base_model(const gguf::File& vocab);
// The base model as Mixtral lays one out: llama.expert_count 4, expert_used_count 2, and
// blk.0's FFN as ffn_gate_inp and the 3-D ffn_{gate,up,down}_exps. It loads and runs too.
RawGguf moe_model(const gguf::File& vocab);
// A one-layer Mamba-2 (dim 8, d_inner 16 in 4 heads, 2 groups, d_state 4, conv 4) on the
// same vocabulary. It loads and runs too.
RawGguf mamba2_model(const gguf::File& vocab);
// A two-layer granitehybrid (malformed_gguf_hybrid.cpp): layer 0 that Mamba-2, layer 1
// attention (2 heads of 4 over 1, no RoPE), both with 4 experts of 16 (2 used) and a
// shared expert of 8, and Granite's four multipliers. It loads and runs too.
RawGguf granite_hybrid_model(const gguf::File& vocab);

struct MalformedCase {
  std::string name;                 // also the file name
  std::vector<uint8_t> bytes;
  std::vector<std::string> expect;  // fragments the one-line error must contain
};

std::vector<MalformedCase> malformed_gguf_cases(const gguf::File& vocab);
// The hybrid's cases (per-layer head_count_kv against the tensors, the shared expert),
// part of malformed_gguf_cases.
std::vector<MalformedCase> granite_hybrid_cases(const gguf::File& vocab);

}  // namespace kiln::test
