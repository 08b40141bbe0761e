// MPT (MosaicML): pre-norm blocks of LayerNorm -> attention with one fused QKV matrix,
// Q/K/V clamped to [-clamp_kqv, clamp_kqv], no rotary embedding but ALiBi biases on the
// scores (Press et al. 2022) -> residual, LayerNorm -> GELU MLP (no gate) -> residual.
// Every bias and the Q/K LayerNorms (qk_ln) are optional, as in llama.cpp's loader
// (llama-model / models/mpt.cpp); the classifier is tied to token_embd when the file
// has no output.weight.
#include "families/architecture.h"

namespace kiln {

void load_mpt(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";

  read_block_shape(f, p, c);
  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_epsilon");
  // Required: an MPT without ALiBi positions its tokens by a learned table (pos_embd),
  // which kiln does not implement; refusing is better than running without positions.
  c.max_alibi_bias = (float)f.get_float(p + "attention.max_alibi_bias");
  c.clamp_kqv = (float)f.get_float(p + "attention.clamp_kqv", 0.0);
  if (c.n_heads == 0 || c.dim % c.n_heads != 0)
    throw Error(f.path() + ": " + p + "embedding_length " + std::to_string(c.dim) +
                " is not a multiple of attention.head_count " + std::to_string(c.n_heads));
  c.head_dim = f.get_u32(p + "attention.key_length", c.dim / c.n_heads);
  if (c.head_dim == 0) throw Error(f.path() + ": " + p + "attention.key_length is 0");
  c.n_rot = 0;
  c.norm = Norm::layer;
  c.ffn = Ffn::gelu;
  c.positions = Positions::alibi;

  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool pos_embd = t.name == "pos_embd.weight", act_scales = t.name.ends_with("ffn_act.scales");
    if (pos_embd || act_scales)
      throw Error(f.path() + ": tensor '" + t.name + "' (" +
                  (pos_embd ? "learned position embeddings" : "AWQ activation scales") +
                  ") is not supported by kiln's mpt");
  }

  const uint64_t dim = c.dim, q_dim = uint64_t(c.n_heads) * c.head_dim,
                 kv_dim = uint64_t(c.n_kv_heads) * c.head_dim, ffn = c.ffn_dim;
  const auto optional = [&](const std::string& name, std::vector<uint64_t> dims) {
    return model.weight(name, std::move(dims), /*required=*/false);
  };

  read_embeddings(model);  // tied when output.weight is absent (every MPT checkpoint)
  model.output_norm_b = optional("output_norm.bias", {dim});

  resize_layers(model);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = model.layers[l];
    L.attn_norm = model.weight(b + "attn_norm.weight", {dim});
    L.attn_norm_b = optional(b + "attn_norm.bias", {dim});
    // attn_qkv rows are Q (q_dim), then K and V (kv_dim each).
    const WeightView wqkv = model.weight(b + "attn_qkv.weight", {dim, q_dim + 2 * kv_dim});
    L.wq = row_range(wqkv, 0, q_dim);
    L.wk = row_range(wqkv, q_dim, kv_dim);
    L.wv = row_range(wqkv, q_dim + kv_dim, kv_dim);
    if (const WeightView bqkv = optional(b + "attn_qkv.bias", {q_dim + 2 * kv_dim})) {
      L.bq = element_range(bqkv, 0, q_dim);
      L.bk = element_range(bqkv, q_dim, kv_dim);
      L.bv = element_range(bqkv, q_dim + kv_dim, kv_dim);
    }
    L.q_norm = optional(b + "attn_q_norm.weight", {q_dim});
    L.q_norm_b = optional(b + "attn_q_norm.bias", {q_dim});
    L.k_norm = optional(b + "attn_k_norm.weight", {kv_dim});
    L.k_norm_b = optional(b + "attn_k_norm.bias", {kv_dim});
    if (bool(L.q_norm) != bool(L.k_norm))
      throw Error(f.path() + ": " + b + "attn_q_norm.weight and attn_k_norm.weight come together (qk_ln); one is missing");
    L.wo = model.weight(b + "attn_output.weight", {q_dim, dim});
    L.bo = optional(b + "attn_output.bias", {dim});
    L.ffn_norm = model.weight(b + "ffn_norm.weight", {dim});
    L.ffn_norm_b = optional(b + "ffn_norm.bias", {dim});
    L.w_up = model.weight(b + "ffn_up.weight", {dim, ffn});
    L.b_up = optional(b + "ffn_up.bias", {ffn});
    L.w_down = model.weight(b + "ffn_down.weight", {ffn, dim});
    L.b_down = optional(b + "ffn_down.bias", {dim});
  }
}

}  // namespace kiln
