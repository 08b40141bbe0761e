// Llama (and the many models that reuse its GGUF layout): pre-norm blocks of RMSNorm ->
// attention with RoPE and grouped KV heads -> residual, RMSNorm -> SwiGLU FFN -> residual.
#include "model/architecture.h"
#include "runtime/rope.h"

namespace kiln {

void load_llama(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";

  read_block_shape(f, p, c);
  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = (float)f.get_float(p + "rope.freq_base", 10000.0);
  if (c.n_heads == 0 || c.dim % c.n_heads != 0)
    throw Error(f.path() + ": " + p + "embedding_length " + std::to_string(c.dim) +
                " is not a multiple of attention.head_count " + std::to_string(c.n_heads));
  c.head_dim = f.get_u32(p + "attention.key_length", c.dim / c.n_heads);
  if (c.head_dim == 0) throw Error(f.path() + ": " + p + "attention.key_length is 0");
  c.n_rot = f.get_u32(p + "rope.dimension_count", c.head_dim);
  c.rope_neox = false;  // GGUF llama files store Q/K permuted for adjacent-pair rotation
  read_rope_scaling(f, p, c);
  read_sliding_window(f, p, c);

  const uint64_t dim = c.dim, q_dim = uint64_t(c.n_heads) * c.head_dim,
                 kv_dim = uint64_t(c.n_kv_heads) * c.head_dim, ffn = c.ffn_dim;

  model.token_embd = model.weight("token_embd.weight", {dim, 0});
  c.n_vocab = (uint32_t)model.token_embd.rows;
  const uint64_t vocab = c.n_vocab;
  model.output_norm = model.weight("output_norm.weight", {dim});
  model.output = model.weight("output.weight", {dim, vocab}, /*required=*/false);
  if (!model.output) model.output = model.token_embd;  // tied embeddings

  resize_layers(model);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = model.layers[l];
    L.attn_norm = model.weight(b + "attn_norm.weight", {dim});
    L.wq = model.weight(b + "attn_q.weight", {dim, q_dim});
    L.wk = model.weight(b + "attn_k.weight", {dim, kv_dim});
    L.wv = model.weight(b + "attn_v.weight", {dim, kv_dim});
    L.wo = model.weight(b + "attn_output.weight", {q_dim, dim});
    L.ffn_norm = model.weight(b + "ffn_norm.weight", {dim});
    L.w_gate = model.weight(b + "ffn_gate.weight", {dim, ffn});
    L.w_up = model.weight(b + "ffn_up.weight", {dim, ffn});
    L.w_down = model.weight(b + "ffn_down.weight", {ffn, dim});
  }
}

}  // namespace kiln
