// gpt-oss (OpenAI's open-weight MoE): pre-norm blocks whose attention has biases on Q, K,
// V and the output, a learned sink logit per head that joins every softmax's denominator,
// NEOX RoPE with YaRN scaling, and layers that alternate a sliding window (even layers)
// with full attention; every FFN is a mixture of experts with a biased router, biased
// expert matrices and a clamped SwiGLU (min(g, 7) sigmoid(1.702 g) (clamp(u, -7, 7) + 1)),
// weighted by the softmax of the chosen experts' router logits. The norm before the FFN
// is stored as post_attention_norm. The constants of the SwiGLU are not in the file: they
// are the model's (and llama.cpp's) fixed values.
#include <cmath>

#include "families/architecture.h"

namespace kiln {

void load_gpt_oss(Model& model) {
  const gguf::File& f = model.file();
  ModelConfig& c = model.mutable_config();
  const std::string p = c.arch + ".";
  const auto fail = [&](const std::string& what) { throw Error(f.path() + ": " + what); };
  read_block_shape(f, p, c);
  read_rope_attention(f, p, c);
  c.rope_neox = true;
  c.attn_scale = 1.0f / std::sqrt(float(c.n_rot));
  // The beta keys the converter writes are the values llama.cpp (and kiln's YaRN) use
  // without reading them; other values would be silently ignored there.
  for (const auto& [key, want] : {std::pair{"rope.scaling.yarn_beta_fast", 32.0}, {"rope.scaling.yarn_beta_slow", 1.0}})
    if (f.has(p + key) && f.get_float(p + key) != want)
      fail(p + key + " " + std::to_string(f.get_float(p + key)) + " is not " + std::to_string(int(want)) +
           ", the only value kiln runs");
  // Local layers share the global layers' base and scaling unless the file says otherwise,
  // which kiln's separate local table (unscaled) cannot express.
  if (f.has(p + "rope.freq_base_swa") && float(f.get_float(p + "rope.freq_base_swa")) != c.rope_theta)
    fail(p + "rope.freq_base_swa differs from rope.freq_base, which kiln does not support for gpt-oss");
  if (!f.has(p + "attention.sliding_window")) fail("missing key '" + p + "attention.sliding_window'");
  read_sliding_window(f, p, c, /*default_window=*/0, /*default_pattern=*/2);
  if (c.swa_window.empty()) fail(p + "attention.sliding_window is 0");
  read_expert_shape(f, p, c);
  c.expert_softmax_chosen = true;
  c.ffn = Ffn::swiglu_clamped;
  read_embeddings(model);
  if (model.output.data == model.token_embd.data) fail("missing tensor 'output.weight', which every gpt-oss model has");
  read_blocks(model, {.experts = true, .ffn_norm = "post_attention_norm"});
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = model.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    const auto need = [&](const WeightView& w, const char* name) {
      if (!w) fail("missing tensor '" + b + name + "', which every gpt-oss model has");
    };
    need(L.bq, "attn_q.bias"), need(L.bk, "attn_k.bias"), need(L.bv, "attn_v.bias"), need(L.bo, "attn_output.bias");
    need(L.attn_sinks, "attn_sinks.weight");
    need(L.ffn_gate_inp_b, "ffn_gate_inp.bias");
    need(L.gate_exps_b, "ffn_gate_exps.bias"), need(L.up_exps_b, "ffn_up_exps.bias");
    need(L.down_exps_b, "ffn_down_exps.bias");
  }
}

}  // namespace kiln
