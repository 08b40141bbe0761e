// Qwen3-MoE: Qwen3's attention (per-head Q/K RMSNorm, NEOX RoPE, key_length heads) with
// every block's FFN a mixture of experts: a router (ffn_gate_inp) scores expert_count
// SwiGLU experts, the top expert_used_count run, weighted by the router's softmax
// renormalized over them (the converter's norm_topk_prob, which llama.cpp applies
// without a key for this architecture).
#include "families/architecture.h"

namespace kiln {

void load_qwen3moe(Model& model) {
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(model.file(), p, c);
  read_rope_attention(model.file(), p, c);
  c.rope_neox = true;
  read_expert_shape(model.file(), p, c);
  read_embeddings(model);
  read_blocks(model, {.qk_norm = true, .experts = true});
}

}  // namespace kiln
