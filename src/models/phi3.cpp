// Phi-3 (mini/medium): Llama's block with one fused QKV matrix (attn_qkv: Q, K, V rows)
// and one fused gate/up matrix (ffn_up: 2 x ffn rows, the gate first), RoPE rotating
// halves. Long-context variants scale RoPE with per-pair factors (LongRoPE,
// rope_factors_long/short.weight), which kiln does not implement: refused, not ignored.
// Phi-3's attention.sliding_window is ignored as llama.cpp ignores it (its converter
// writes a window the models were not used with; see ggml-org/llama.cpp#13676).
#include "model/architecture.h"

namespace kiln {

void load_phi3(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
    if (f.find_tensor(t))
      throw Error(f.path() + ": tensor '" + t + "' (LongRoPE, Phi-3 128k) is not supported by kiln's phi3");
  read_block_shape(f, p, c);
  read_rope_attention(f, p, c);
  c.rope_neox = true;
  read_embeddings(model);
  read_blocks(model, {.fused_gate_up = true});
}

}  // namespace kiln
