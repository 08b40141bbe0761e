// Qwen2 / Qwen2.5: Llama's block with biases on the Q, K and V projections (none on the
// output projection), RoPE rotating halves of each head (the HF layout, kept as is by the
// converter) and a large base (1e6). Small models tie the classifier to token_embd.
#include "families/architecture.h"

namespace kiln {

void load_qwen2(Model& model) {
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_block_shape(model.file(), p, c);
  read_rope_attention(model.file(), p, c);
  c.rope_neox = true;
  read_embeddings(model);
  read_blocks(model, {});
  // Without them this would be a Llama with the wrong rotation: say so, not run it.
  for (uint32_t l = 0; l < c.n_layers; ++l)
    if (!model.layers[l].bq || !model.layers[l].bk || !model.layers[l].bv)
      throw Error(model.file().path() + ": blk." + std::to_string(l) +
                  " lacks attn_q/attn_k/attn_v bias, which every qwen2 model has");
}

}  // namespace kiln
