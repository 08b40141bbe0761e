// Llama (and the many models that reuse its GGUF layout: Llama 2/3, Mistral, TinyLlama...):
// pre-norm blocks of RMSNorm -> attention with RoPE and grouped KV heads -> residual,
// RMSNorm -> SwiGLU FFN -> residual. Llama 3.1's long-context frequencies come as the
// rope_freqs.weight tensor (read with the RoPE scaling keys); a Mistral's window as
// attention.sliding_window. The classifier is tied to token_embd when output.weight is
// absent (Llama 3.2 1B/3B). Mixtral is a llama file with <arch>.expert_count: every
// block's FFN is then a mixture of SwiGLU experts (top expert_used_count of the router's
// softmax, renormalized).
#include "families/architecture.h"

namespace kiln {

void load_llama(Model& model) {
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(model.file(), p, c);
  read_rope_attention(model.file(), p, c);
  read_sliding_window(model.file(), p, c);
  c.rope_neox = false;  // GGUF llama files store Q/K permuted for adjacent-pair rotation
  const bool experts = model.file().has(p + "expert_count");
  if (experts) read_expert_shape(model.file(), p, c);
  read_embeddings(model);
  read_blocks(model, {.experts = experts});
}

}  // namespace kiln
