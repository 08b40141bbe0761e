// Phi-3 (mini/medium, Phi-3.5): Llama's block with one fused QKV matrix (attn_qkv: Q, K, V
// rows) and one fused gate/up matrix (ffn_up: 2 x ffn rows, the gate first), RoPE rotating
// halves. The long-context variants (128k, Phi-3.5) carry LongRoPE: per-pair frequency
// divisors for short and long contexts (rope_factors_short/long.weight, which one by the
// session's context) and a cos/sin magnitude (rope.scaling.attn_factor).
// Phi-3's attention.sliding_window is ignored as llama.cpp ignores it (its converter
// writes a window the models were not used with; see ggml-org/llama.cpp#13676).
#include "families/architecture.h"

namespace kiln {

void load_phi3(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(f, p, c);
  read_rope_attention(f, p, c);
  read_longrope_factors(f, c);
  c.rope_neox = true;
  read_embeddings(model);
  read_blocks(model, {.fused_gate_up = true});
}

}  // namespace kiln
