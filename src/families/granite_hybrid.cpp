// IBM Granite 4.0-H (granitehybrid): pre-norm blocks whose mixer is a Mamba-2 layer or
// causal self-attention, layer by layer, each followed by an FFN: a mixture of experts
// with a shared expert that every token runs (its output added, ungated, to the routed
// sum), or a dense SwiGLU where expert_count is 0 (Granite 4.0-H-Micro). The file marks
// the SSM layers with a per-layer attention.head_count_kv of 0.
//
// Granite's muP multipliers: embeddings times embedding_scale, every sublayer's output
// times residual_scale before the residual add, attention scores times attention.scale
// instead of 1/sqrt(head size), logits divided by logit_scale (each absent or 0: off, as
// llama.cpp reads them). Granite 4.0-H's attention layers have no positional encoding;
// the converter says so with rope.scaling.finetuned = false (Bamba, the same
// architecture, keeps RoPE: true or absent).
#include <algorithm>
#include <cmath>
#include <limits>

#include "families/architecture.h"

namespace kiln {
namespace {

// A key that is one number for every layer or an array of one per layer.
std::vector<uint32_t> per_layer_u32(const gguf::File& f, const std::string& key, uint32_t n_layers) {
  const gguf::Value* v = f.find(key);
  if (!v) throw Error(f.path() + ": missing key '" + key + "'");
  const auto bad = [&](const std::string& why) { throw Error(f.path() + ": " + key + " " + why); };
  const auto number = [&](const gguf::Value& e) -> uint32_t {
    if (!e.is_integer()) bad("must hold integers");
    const bool is_signed = e.type == gguf::ValueType::INT8 || e.type == gguf::ValueType::INT16 ||
                           e.type == gguf::ValueType::INT32 || e.type == gguf::ValueType::INT64;
    if (is_signed ? (e.i < 0 || e.i > int64_t(UINT32_MAX)) : e.u > UINT32_MAX) bad("holds a value out of range");
    return uint32_t(is_signed ? uint64_t(e.i) : e.u);
  };
  if (v->type != gguf::ValueType::ARRAY) return std::vector<uint32_t>(n_layers, number(*v));
  if (v->size() != n_layers)
    bad("has " + std::to_string(v->size()) + " entries for " + std::to_string(n_layers) + " layers (block_count)");
  std::vector<uint32_t> out(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) out[l] = number(v->at(l));
  return out;
}

// The one value the layers in `which` share (kiln keeps one head count and one FFN width
// per model); 0 when no layer is in `which`.
uint32_t uniform(const gguf::File& f, const std::string& key, const std::vector<uint32_t>& values,
                 const std::vector<bool>& which) {
  uint32_t value = 0;
  for (size_t l = 0; l < values.size(); ++l) {
    if (!which[l]) continue;
    if (value != 0 && values[l] != value)
      throw Error(f.path() + ": " + key + " differs between layers (" + std::to_string(value) + " and " +
                  std::to_string(values[l]) + " at layer " + std::to_string(l) + "), which kiln does not support");
    value = values[l];
  }
  return value;
}

// A multiplier key: absent or 0 means off; anything else must be a finite positive number.
float scale_key(const gguf::File& f, const std::string& key) {
  const double v = f.get_float(key, 0.0);
  if (!std::isfinite(v) || v < 0 || v > std::numeric_limits<float>::max())
    throw Error(f.path() + ": " + key + " is " + std::to_string(v) + ", expected a positive number");
  return float(v);
}
float multiplier(const gguf::File& f, const std::string& key) {
  const float v = scale_key(f, key);
  return v == 0 ? 1.0f : v;
}

}  // namespace

void load_granite_hybrid(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_trunk_shape(f, c);
  check_layer_count(f, c);

  const std::vector<uint32_t> kv_heads = per_layer_u32(f, p + "attention.head_count_kv", c.n_layers);
  std::vector<bool> attends(c.n_layers), all(c.n_layers, true);
  c.layer_mixer.resize(c.n_layers);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    attends[l] = kv_heads[l] != 0;
    c.layer_mixer[l] = attends[l] ? Mixer::attention : Mixer::ssm;
  }
  const bool any_attention = std::find(attends.begin(), attends.end(), true) != attends.end();
  const bool any_ssm = std::find(attends.begin(), attends.end(), false) != attends.end();
  c.n_kv_heads = uniform(f, p + "attention.head_count_kv", kv_heads, attends);
  c.n_heads = uniform(f, p + "attention.head_count", per_layer_u32(f, p + "attention.head_count", c.n_layers), attends);
  c.ffn_dim = uniform(f, p + "feed_forward_length", per_layer_u32(f, p + "feed_forward_length", c.n_layers), all);
  if (c.ffn_dim == 0) throw Error(f.path() + ": " + p + "feed_forward_length is 0");
  if (any_attention && c.n_heads == 0)
    throw Error(f.path() + ": " + p + "attention.head_count is 0 on a layer whose head_count_kv is not");

  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  if (any_attention) {
    read_rope_attention(f, p, c);
    c.positions = f.get_bool(p + "rope.scaling.finetuned", true) ? Positions::rope : Positions::none;
  }
  if (any_ssm) read_ssm_shape(f, p, c);
  c.embed_scale = multiplier(f, p + "embedding_scale");
  c.residual_scale = multiplier(f, p + "residual_scale");
  c.logit_scale = multiplier(f, p + "logit_scale");
  c.attn_scale = scale_key(f, p + "attention.scale");  // 0: 1/sqrt(head size)

  const bool experts = f.get_uint(p + "expert_count", 0) > 0;
  if (experts) {
    read_expert_shape(f, p, c);
    c.shared_expert_ffn_dim = f.get_u32(p + "expert_shared_feed_forward_length", 0);
  }

  read_embeddings(model);
  resize_layers(model);
  const BlockOptions options{.experts = experts};
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = model.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    L.attn_norm = model.weight(b + "attn_norm.weight", {c.dim});
    // A missing mixer tensor says which key made the layer what it is.
    try {
      if (attends[l]) read_block_attention(model, l, L, options);
      else read_ssm_layer(model, l, L);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (layer " + std::to_string(l) + " is " +
                  (attends[l] ? "an attention" : "a Mamba-2") + " layer: " + p + "attention.head_count_kv[" +
                  std::to_string(l) + "] is " + std::to_string(kv_heads[l]) + ")");
    }
    read_block_ffn(model, l, L, options);
    if (c.shared_expert_ffn_dim > 0) {
      const uint64_t sh = c.shared_expert_ffn_dim;
      L.gate_shexp = model.weight(b + "ffn_gate_shexp.weight", {c.dim, sh});
      L.up_shexp = model.weight(b + "ffn_up_shexp.weight", {c.dim, sh});
      L.down_shexp = model.weight(b + "ffn_down_shexp.weight", {sh, c.dim});
    }
  }
}

}  // namespace kiln
