// BERT (BGE, MiniLM, all-MiniLM, e5...: sentence embedding encoders), as llama.cpp's
// converter writes it. The input is the token embedding plus token type 0's row
// (token_types; every token is "sentence A") plus a learned absolute position's row
// (position_embd), LayerNormed (token_embd_norm). Post-norm blocks: x = LayerNorm(x +
// attention(x)) (attn_output_norm), then x = LayerNorm(x + FFN(x)) (layer_output_norm),
// where the attention sees the whole text (attention.causal false, a key the model loader
// reads for every family), every matrix has a bias, and the FFN is a GELU MLP. No
// classifier: the model's output is its last hidden states, which kiln::Embedder pools
// (pooling_type) into one vector per text. nomic-bert (src/families/nomic_bert.cpp) is
// the same encoder with rotary positions and a SwiGLU FFN.
#include "families/architecture.h"

namespace kiln {

void read_bert_encoder(Model& model, const EncoderOptions& o) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";

  read_block_shape(f, p, c);
  if (c.n_heads == 0 || c.dim % c.n_heads != 0)
    throw Error(f.path() + ": " + p + "embedding_length " + std::to_string(c.dim) +
                " is not a multiple of attention.head_count " + std::to_string(c.n_heads));
  if (o.rope) {
    read_rope_attention(f, p, c);  // head size, rope.freq_base, rope.dimension_count
    c.rope_neox = true;            // llama.cpp rotates nomic-bert's halves (NEOX)
  } else {
    c.head_dim = c.dim / c.n_heads;
    c.n_rot = 0;
    c.positions = Positions::learned;
  }
  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_epsilon");
  c.norm = Norm::layer;
  c.ffn = o.swiglu ? Ffn::swiglu : Ffn::gelu;

  const uint64_t dim = c.dim, ffn = c.ffn_dim;
  const auto optional = [&](const std::string& name, std::vector<uint64_t> dims) {
    return model.weight(name, std::move(dims), /*required=*/false);
  };
  model.token_embd = model.weight("token_embd.weight", {dim, 0});
  c.n_vocab = (uint32_t)model.token_embd.rows;
  if (f.has(p + "vocab_size") && f.get_uint(p + "vocab_size") != c.n_vocab)
    throw Error(f.path() + ": " + p + "vocab_size " + std::to_string(f.get_uint(p + "vocab_size")) +
                " differs from token_embd.weight's " + std::to_string(c.n_vocab) + " rows");
  // llama.cpp treats the table as optional; when present, only row 0 is ever read.
  model.token_types = optional("token_types.weight", {dim, 0});
  if (model.token_types && model.token_types.rows == 0)
    throw Error(f.path() + ": tensor 'token_types.weight' has no rows");
  if (!o.rope) model.pos_embd = model.weight("position_embd.weight", {dim, c.n_ctx_train});
  model.token_embd_norm = model.weight("token_embd_norm.weight", {dim});
  model.token_embd_norm_b = model.weight("token_embd_norm.bias", {dim});

  resize_layers(model);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = model.layers[l];
    // Q, K and V as three matrices or one fused attn_qkv, with optional biases; no
    // pre-norm (attn_norm) and no Q/K norms: read_block_attention's options all off.
    read_block_attention(model, l, L, {});
    L.attn_out_norm = model.weight(b + "attn_output_norm.weight", {dim});
    L.attn_out_norm_b = model.weight(b + "attn_output_norm.bias", {dim});
    if (o.swiglu) L.w_gate = model.weight(b + "ffn_gate.weight", {dim, ffn});
    L.w_up = model.weight(b + "ffn_up.weight", {dim, ffn});
    L.w_down = model.weight(b + "ffn_down.weight", {ffn, dim});
    // llama.cpp's nomic-bert FFN has no biases (it would ignore any in the file).
    if (!o.swiglu) {
      L.b_up = optional(b + "ffn_up.bias", {ffn});
      L.b_down = optional(b + "ffn_down.bias", {dim});
    }
    L.layer_out_norm = model.weight(b + "layer_output_norm.weight", {dim});
    L.layer_out_norm_b = model.weight(b + "layer_output_norm.bias", {dim});
  }
}

void load_bert(Model& model) { read_bert_encoder(model, {}); }

}  // namespace kiln
