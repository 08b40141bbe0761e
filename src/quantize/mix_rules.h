#pragma once
// What the mixes of src/quantize/mix.cpp (the K presets) and mix_iq.cpp (the i-quant and
// ternary presets) share: llama.cpp's tensor roles and layer positions, and the i-quant
// presets' per-tensor rule. Internal to src/quantize.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "kiln/error.h"
#include "quantize/mix.h"

namespace kiln::quantize::rules {

inline bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// Broad roles llama.cpp gives tensors by name (tensor_get_category), tested in this order:
// "attn_v.weight" must win over "attn_k.weight" and so on only by being checked first.
enum class Role { output, token_embd, attn_qkv, attn_kv_b, attn_v, attn_k, attn_q, attn_output, ffn_up, ffn_gate, ffn_down, other };

inline Role role_of(const std::string& name) {
  if (name == "output.weight") return Role::output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::token_embd;
  if (contains(name, "attn_qkv.weight")) return Role::attn_qkv;
  if (contains(name, "attn_kv_b.weight")) return Role::attn_kv_b;
  if (contains(name, "attn_v.weight")) return Role::attn_v;
  if (contains(name, "attn_k.weight")) return Role::attn_k;
  if (contains(name, "attn_q.weight")) return Role::attn_q;
  if (contains(name, "attn_output.weight")) return Role::attn_output;
  if (contains(name, "ffn_up")) return Role::ffn_up;
  if (contains(name, "ffn_gate")) return Role::ffn_gate;
  if (contains(name, "ffn_down")) return Role::ffn_down;
  return Role::other;
}

// The value projections (and fused QKV) are the most sensitive to quantization; the mixes
// treat them as one group with its own counter.
inline bool is_value_like(Role r) { return r == Role::attn_v || r == Role::attn_qkv || r == Role::attn_kv_b; }

// The layer number in a tensor's name ("blk.7.ffn_down_exps.weight" -> 7), -1 for none.
inline int layer_in_name(const std::string& name) {
  int layer = -1;
  std::sscanf(name.c_str(), "blk.%d.", &layer);
  return layer;
}

// Layers at the start and end of the stack, and every third one between, get more bits in
// the _M mixes (llama.cpp's use_more_bits).
inline bool use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// An expert model's ffn_down position: the layer number in its name, which must be one.
inline int expert_layer(const std::string& name, int n_layers) {
  const int layer = layer_in_name(name);
  if (layer < 0 || layer >= n_layers)
    throw Error("tensor '" + name + "': llama-quantize's mixes for a mixture-of-experts model need a layer number below " +
                std::to_string(n_layers) + " in its name");
  return layer;
}

// The i-quant and ternary presets (IQ1_S .. IQ4_XS, TQ1_0, TQ2_0).
bool is_iq_preset(FileType ft);

// What llama-quantize carries from tensor to tensor for those presets (mix_iq.cpp): the
// model's facts and how many tensors of each counted group it has typed so far, in its
// visiting order.
struct IqMixState {
  FileType ft;
  TensorType base;
  int n_layers;
  int gqa;  // n_heads / n_kv_heads
  bool is_70b;
  bool tied;  // token_embd doubles as the output projection
  uint32_t n_experts;
  bool has_imatrix;
  int ffn_down_seen = 0, ffn_gate_seen = 0, ffn_up_seen = 0;
};

// The type an i-quant or ternary preset gives a tensor llama-quantize quantizes, before
// the row-length fallback.
TensorType iq_mix_type(IqMixState& s, Role role, const TensorDesc& t);

}  // namespace kiln::quantize::rules
