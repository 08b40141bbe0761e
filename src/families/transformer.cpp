// The pieces most families share: the RoPE attention hyperparameters, the embedding and
// classifier, and pre-norm blocks whose optional parts (biases, fused matrices, Q/K norms,
// post-norms) are found by tensor name. A family file sets its flags and calls these, so
// a tensor name or a shape check is written once.
#include "families/architecture.h"

namespace kiln {

void read_rope_attention(const gguf::File& f, const std::string& p, ModelConfig& c) {
  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = (float)f.get_float(p + "rope.freq_base", 10000.0);
  if (c.n_heads == 0 || (!f.has(p + "attention.key_length") && c.dim % c.n_heads != 0))
    throw Error(f.path() + ": " + p + "embedding_length " + std::to_string(c.dim) +
                " is not a multiple of attention.head_count " + std::to_string(c.n_heads));
  c.head_dim = f.get_u32(p + "attention.key_length", c.dim / c.n_heads);
  if (c.head_dim == 0) throw Error(f.path() + ": " + p + "attention.key_length is 0");
  // The cache keeps keys and values of one width; no family kiln runs has them differ.
  const uint64_t v_len = f.get_uint(p + "attention.value_length", c.head_dim);
  if (v_len != c.head_dim)
    throw Error(f.path() + ": " + p + "attention.value_length " + std::to_string(v_len) + " differs from key_length " +
                std::to_string(c.head_dim) + ", which kiln does not support");
  c.n_rot = f.get_u32(p + "rope.dimension_count", c.head_dim);
  read_rope_scaling(f, p, c);
}

void read_embeddings(Model& model, bool always_tied) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  model.token_embd = model.weight("token_embd.weight", {c.dim, 0});
  c.n_vocab = (uint32_t)model.token_embd.rows;
  const std::string key = c.arch + ".vocab_size";
  if (f.has(key) && f.get_uint(key) != c.n_vocab)
    throw Error(f.path() + ": " + key + " " + std::to_string(f.get_uint(key)) + " differs from token_embd.weight's " +
                std::to_string(c.n_vocab) + " rows");
  model.output_norm = model.weight("output_norm.weight", {c.dim});
  // Families that always tie (Gemma) ignore an output.weight as llama.cpp does.
  if (!always_tied) model.output = model.weight("output.weight", {c.dim, c.n_vocab}, /*required=*/false);
  if (!model.output) model.output = model.token_embd;
}

void read_expert_shape(const gguf::File& f, const std::string& prefix, ModelConfig& c) {
  const std::string count_key = prefix + "expert_count", used_key = prefix + "expert_used_count";
  c.n_experts = f.get_u32(count_key);
  c.n_experts_used = f.get_u32(used_key);
  // Tens of thousands of experts would be no model anyone ships; the bound keeps the
  // per-token routing buffers small.
  if (c.n_experts < 1 || c.n_experts > 4096)
    throw Error(f.path() + ": " + count_key + " is " + std::to_string(c.n_experts) + ", expected 1 to 4096");
  if (c.n_experts_used < 1 || c.n_experts_used > c.n_experts)
    throw Error(f.path() + ": " + used_key + " is " + std::to_string(c.n_experts_used) + ", expected 1 to " + count_key +
                " (" + std::to_string(c.n_experts) + ")");
  c.expert_ffn_dim = f.get_u32(prefix + "expert_feed_forward_length", c.ffn_dim);
  if (c.expert_ffn_dim < 1) throw Error(f.path() + ": " + prefix + "expert_feed_forward_length is 0");
  c.expert_weights_norm = f.get_bool(prefix + "expert_weights_norm", true);
}

namespace {

// One view per expert into a 3-D [n_experts][rows][cols] tensor: expert e's matrix is the
// e-th slab of rows.
std::vector<WeightView> expert_views(const Model& model, const std::string& name, uint64_t cols, uint64_t rows) {
  const ModelConfig& c = model.config();
  const WeightView all = model.weight(name, {cols, rows, c.n_experts});
  std::vector<WeightView> out;
  for (uint32_t e = 0; e < c.n_experts; ++e) {
    WeightView w = row_range(all, uint64_t(e) * rows, rows);
    out.push_back(w);
  }
  return out;
}

// An optional bias the forward pass adds as floats: F32 whatever its rank.
WeightView f32_bias(const Model& model, const std::string& name, std::vector<uint64_t> dims) {
  const WeightView w = model.weight(name, std::move(dims), /*required=*/false);
  if (w && w.type != TensorType::F32)
    throw Error(model.file().path() + ": tensor '" + name + "' is " + type_name(w.type) + "; biases must be F32");
  return w;
}

void read_layer_experts(const Model& model, const std::string& b, LayerWeights& L) {
  const ModelConfig& c = model.config();
  L.ffn_gate_inp = model.weight(b + "ffn_gate_inp.weight", {c.dim, c.n_experts});
  L.gate_exps = expert_views(model, b + "ffn_gate_exps.weight", c.dim, c.expert_ffn_dim);
  L.up_exps = expert_views(model, b + "ffn_up_exps.weight", c.dim, c.expert_ffn_dim);
  L.down_exps = expert_views(model, b + "ffn_down_exps.weight", c.expert_ffn_dim, c.dim);
  L.ffn_gate_inp_b = f32_bias(model, b + "ffn_gate_inp.bias", {c.n_experts});
  L.gate_exps_b = f32_bias(model, b + "ffn_gate_exps.bias", {c.expert_ffn_dim, c.n_experts});
  L.up_exps_b = f32_bias(model, b + "ffn_up_exps.bias", {c.expert_ffn_dim, c.n_experts});
  L.down_exps_b = f32_bias(model, b + "ffn_down_exps.bias", {c.dim, c.n_experts});
}

}  // namespace

void read_block_attention(const Model& model, uint32_t l, LayerWeights& L, const BlockOptions& o) {
  const ModelConfig& c = model.config();
  const uint64_t dim = c.dim, q_dim = uint64_t(c.n_heads) * c.head_dim, kv_dim = uint64_t(c.n_kv_heads) * c.head_dim;
  const auto optional = [&](const std::string& name, std::vector<uint64_t> dims) {
    return model.weight(name, std::move(dims), /*required=*/false);
  };
  const std::string b = "blk." + std::to_string(l) + ".";
  // One fused matrix (Phi-3; any family's converter may write it) or three.
  if (const WeightView wqkv = optional(b + "attn_qkv.weight", {dim, q_dim + 2 * kv_dim})) {
    L.wq = row_range(wqkv, 0, q_dim);
    L.wk = row_range(wqkv, q_dim, kv_dim);
    L.wv = row_range(wqkv, q_dim + kv_dim, kv_dim);
    if (const WeightView bqkv = optional(b + "attn_qkv.bias", {q_dim + 2 * kv_dim})) {
      L.bq = element_range(bqkv, 0, q_dim);
      L.bk = element_range(bqkv, q_dim, kv_dim);
      L.bv = element_range(bqkv, q_dim + kv_dim, kv_dim);
    }
  } else {
    L.wq = model.weight(b + "attn_q.weight", {dim, q_dim});
    L.wk = model.weight(b + "attn_k.weight", {dim, kv_dim});
    L.wv = model.weight(b + "attn_v.weight", {dim, kv_dim});
    L.bq = optional(b + "attn_q.bias", {q_dim});  // Qwen2
    L.bk = optional(b + "attn_k.bias", {kv_dim});
    L.bv = optional(b + "attn_v.bias", {kv_dim});
  }
  if (o.qk_norm) {
    L.q_norm = model.weight(b + "attn_q_norm.weight", {c.head_dim});
    L.k_norm = model.weight(b + "attn_k_norm.weight", {c.head_dim});
  }
  L.wo = model.weight(b + "attn_output.weight", {q_dim, dim});
  L.bo = optional(b + "attn_output.bias", {dim});
  L.attn_sinks = optional(b + "attn_sinks.weight", {c.n_heads});
  if (o.post_norms) L.attn_post_norm = model.weight(b + "post_attention_norm.weight", {dim});
}

void read_block_ffn(const Model& model, uint32_t l, LayerWeights& L, const BlockOptions& o) {
  const ModelConfig& c = model.config();
  const uint64_t dim = c.dim, ffn = c.ffn_dim;
  const std::string b = "blk." + std::to_string(l) + ".";
  L.ffn_norm = model.weight(b + o.ffn_norm + ".weight", {dim});
  if (o.experts) {
    read_layer_experts(model, b, L);
  } else if (o.fused_gate_up) {
    // Phi-3's gate_up_proj: the gate's rows, then the up projection's.
    const WeightView up = model.weight(b + "ffn_up.weight", {dim, 2 * ffn});
    L.w_gate = row_range(up, 0, ffn);
    L.w_up = row_range(up, ffn, ffn);
  } else {
    L.w_gate = model.weight(b + "ffn_gate.weight", {dim, ffn});
    L.w_up = model.weight(b + "ffn_up.weight", {dim, ffn});
  }
  if (!o.experts) L.w_down = model.weight(b + "ffn_down.weight", {ffn, dim});
  if (o.post_norms) L.ffn_post_norm = model.weight(b + "post_ffw_norm.weight", {dim});
}

void read_blocks(Model& model, const BlockOptions& o) {
  resize_layers(model);
  for (uint32_t l = 0; l < model.config().n_layers; ++l) {
    LayerWeights& L = model.layers[l];
    L.attn_norm = model.weight("blk." + std::to_string(l) + ".attn_norm.weight", {model.config().dim});
    read_block_attention(model, l, L, o);
    read_block_ffn(model, l, L, o);
  }
}

}  // namespace kiln
