// Gemma (1): Llama's block with GeGLU (gelu(gate) * up, tanh GELU) instead of SwiGLU, the
// token embeddings scaled by sqrt(dim) on the way in, RoPE rotating halves, multi-query
// attention on the 2B, a head size (attention.key_length, 256) that need not be dim /
// heads, and the classifier always tied to token_embd.
// Gemma's RMSNorm multiplies by (1 + w); the GGUF converters store 1 + w, so the norms
// here are plain RMSNorms of the stored weights (norm weights around 1 in a real file,
// around 0 in a checkpoint that was not converted).
#include <cmath>

#include "families/architecture.h"

namespace kiln {

void read_gemma(Model& model, const BlockOptions& options) {
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(model.file(), p, c);
  read_rope_attention(model.file(), p, c);
  c.rope_neox = true;
  c.embed_scale = std::sqrt(float(c.dim));
  c.ffn = Ffn::geglu;
  read_embeddings(model, /*always_tied=*/true);
  read_blocks(model, options);
}

// Gemma 2/3 27B scale queries by 1/sqrt(dim / heads) (query_pre_attn_scalar 144), not
// 1/sqrt(head size) (128); the GGUF does not carry the scalar, so the size is recognized
// by its layer count, as llama.cpp does (46 layers: Gemma 2 27B, 62: Gemma 3 27B).
void gemma_query_scale(ModelConfig& c, uint32_t n_layers_27b) {
  if (c.n_layers == n_layers_27b) c.attn_scale = 1.0f / std::sqrt(float(c.dim / c.n_heads));
}

void load_gemma(Model& model) { read_gemma(model, {}); }

}  // namespace kiln
