#pragma once
// The registry of model families. Each family's file (src/models/<arch>.cpp) reads its
// hyperparameters and tensors into the shared ModelConfig / LayerWeights shape; nothing
// else in kiln switches on an architecture's name.
#include <string>
#include <vector>

#include "kiln/model.h"

namespace kiln {

struct Architecture {
  const char* name;  // general.architecture
  void (*load)(Model& model);
};

const Architecture* find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Parts of a fused tensor as views of their own (no copy): rows [r0, r0 + n) of a 2-D
// weight, e.g. Q, K and V of attn_qkv; elements [i0, i0 + n) of a 1-D F32 one (its bias).
WeightView row_range(const WeightView& w, uint64_t r0, uint64_t n);
WeightView element_range(const WeightView& w, uint64_t i0, uint64_t n);

// <prefix>attention.sliding_window (a window for every layer) and the optional
// <prefix>attention.sliding_window_pattern into c.swa_window (needs c.n_layers): a number
// N (every Nth layer global, llama.cpp's gemma rule) or an array of per-layer booleans
// (true: sliding). Leaves it empty when the file has no window. src/models/sliding_window.cpp.
void read_sliding_window(const gguf::File& f, const std::string& prefix, ModelConfig& c);
// Layer l of a pattern of N slides unless it is the last of its group of N (N 0: all slide).
inline bool swa_pattern_slides(uint32_t l, uint32_t n) { return n == 0 || l % n < n - 1; }

// Architectures (one line each in src/models/registry.cpp).
void load_llama(Model& model);
void load_mpt(Model& model);

// The block shape every family states the same way: <prefix>context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count(_kv).
void read_block_shape(const gguf::File& f, const std::string& prefix, ModelConfig& c);
// Per-layer data is sized before the layers' tensors are looked up: a block count that no
// file could hold tensors for must not reach those allocations (it throws kiln::Error).
void check_layer_count(const gguf::File& f, const ModelConfig& c);
// model.layers sized to block_count, after check_layer_count.
void resize_layers(Model& model);

}  // namespace kiln
