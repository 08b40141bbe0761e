// Qwen3 (dense): Qwen2's block without the Q/K/V biases but with an RMSNorm over each head
// of Q and of K (attn_q_norm / attn_k_norm, [head_dim]) before RoPE, which keeps the
// attention logits bounded; head size from attention.key_length (128 at every size, so
// heads x head size need not equal the width).
#include "families/architecture.h"

namespace kiln {

void load_qwen3(Model& model) {
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(model.file(), p, c);
  read_rope_attention(model.file(), p, c);
  c.rope_neox = true;
  read_embeddings(model);
  read_blocks(model, {.qk_norm = true});
}

}  // namespace kiln
