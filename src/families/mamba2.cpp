// Mamba-2 (Dao & Gu 2024, "Transformers are SSMs"): every block is RMSNorm -> a selective
// state-space mixer -> residual, with no attention and no FFN. The mixer's
// hyperparameters are the ssm.* keys llama.cpp's converter writes; its tensors are
// ssm_in, ssm_conv1d (+ bias), ssm_dt.bias, ssm_a, ssm_d (no .weight suffix on those
// two), ssm_norm and ssm_out. The converter writes feed_forward_length and
// attention.head_count as 0 ("unused"); they are read and must be 0.
#include "families/architecture.h"

namespace kiln {
namespace {

// The small per-channel tensors are read element by element by the mixer: F32 only, as
// the converter and llama-quantize always leave them.
WeightView f32_weight(const Model& model, const std::string& name, std::vector<uint64_t> dims) {
  const WeightView w = model.weight(name, std::move(dims));
  if (w.type != TensorType::F32)
    throw Error(model.file().path() + ": tensor '" + name + "' is " + type_name(w.type) + ", expected F32");
  return w;
}

}  // namespace

void read_trunk_shape(const gguf::File& f, ModelConfig& c) {
  const std::string p = c.arch + ".";
  c.n_ctx_train = f.get_u32(p + "context_length");
  c.dim = f.get_u32(p + "embedding_length");
  c.n_layers = f.get_u32(p + "block_count");
  if (c.dim == 0) throw Error(f.path() + ": " + p + "embedding_length is 0");
}

void read_ssm_shape(const gguf::File& f, const std::string& p, ModelConfig& c) {
  c.ssm_d_conv = f.get_u32(p + "ssm.conv_kernel");
  c.ssm_d_inner = f.get_u32(p + "ssm.inner_size");
  c.ssm_d_state = f.get_u32(p + "ssm.state_size");
  c.ssm_n_heads = f.get_u32(p + "ssm.time_step_rank");
  c.ssm_n_groups = f.get_u32(p + "ssm.group_count", 1);
  const auto bad = [&](const std::string& key, uint32_t v, const std::string& why) {
    throw Error(f.path() + ": " + p + key + " is " + std::to_string(v) + ", " + why);
  };
  // Bounds keep the state and the scan's buffers sane for a malformed file; real models
  // use d_conv 4, d_state 128, heads of 64.
  if (c.ssm_d_conv < 1 || c.ssm_d_conv > 64) bad("ssm.conv_kernel", c.ssm_d_conv, "expected 1 to 64");
  if (c.ssm_d_state < 1 || c.ssm_d_state > 1024) bad("ssm.state_size", c.ssm_d_state, "expected 1 to 1024");
  if (c.ssm_d_inner < 1 || c.ssm_d_inner > (1u << 16)) bad("ssm.inner_size", c.ssm_d_inner, "expected 1 to 65536");
  if (c.ssm_n_heads < 1 || c.ssm_d_inner % c.ssm_n_heads != 0)
    bad("ssm.time_step_rank", c.ssm_n_heads, "expected a divisor of ssm.inner_size " + std::to_string(c.ssm_d_inner));
  if (c.ssm_n_groups < 1 || c.ssm_n_heads % c.ssm_n_groups != 0)
    bad("ssm.group_count", c.ssm_n_groups, "expected a divisor of ssm.time_step_rank " + std::to_string(c.ssm_n_heads));
}

void read_ssm_layer(const Model& model, uint32_t l, LayerWeights& L) {
  const ModelConfig& c = model.config();
  const std::string b = "blk." + std::to_string(l) + ".";
  const uint64_t d_inner = c.ssm_d_inner, conv_dim = c.ssm_conv_dim(), heads = c.ssm_n_heads;
  L.ssm_in = model.weight(b + "ssm_in.weight", {c.dim, d_inner + conv_dim + heads});
  L.ssm_conv1d = f32_weight(model, b + "ssm_conv1d.weight", {c.ssm_d_conv, conv_dim});
  L.ssm_conv1d_b = f32_weight(model, b + "ssm_conv1d.bias", {conv_dim});
  L.ssm_dt_b = f32_weight(model, b + "ssm_dt.bias", {heads});
  L.ssm_a = f32_weight(model, b + "ssm_a", {1, heads});
  L.ssm_d = f32_weight(model, b + "ssm_d", {1, heads});
  L.ssm_norm = f32_weight(model, b + "ssm_norm.weight", {d_inner / c.ssm_n_groups, c.ssm_n_groups});
  L.ssm_out = model.weight(b + "ssm_out.weight", {d_inner, c.dim});
}

void load_mamba2(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  read_trunk_shape(f, c);
  for (const char* key : {"feed_forward_length", "attention.head_count", "attention.head_count_kv"})
    if (const uint64_t v = f.get_uint(p + key, 0); v != 0)
      throw Error(f.path() + ": " + p + key + " is " + std::to_string(v) + "; a mamba2 block has no FFN or attention");
  c.rms_eps = (float)f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  read_ssm_shape(f, p, c);
  read_embeddings(model);
  resize_layers(model);
  c.layer_mixer.assign(c.n_layers, Mixer::ssm);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = model.layers[l];
    L.attn_norm = model.weight("blk." + std::to_string(l) + ".attn_norm.weight", {c.dim});
    read_ssm_layer(model, l, L);
  }
}

}  // namespace kiln
