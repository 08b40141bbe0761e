// llama-quantize's per-tensor rules for its i-quant and ternary presets (llama.cpp
// src/llama-quant.cpp, llama_tensor_get_type_impl), restated by preset family:
//  * the output projection: Q6_K, or Q5_K in the lowest-bit presets (Q8_0 when rows are
//    not whole base-type blocks);
//  * the 1.5-2.7 bit presets (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M) lift the
//    value projections, the first eighth of the ffn_down matrices, attn_output and the
//    embeddings to a type a step or two up, since those errors cost the most;
//  * IQ3_XXS and IQ3_XS trade bits between attention (attn_q/attn_k a step down) and the
//    value and FFN matrices; IQ3_M lifts value, attn_output and early ffn_down to Q4_K;
//  * IQ4_NL/IQ4_XS give grouped-query value matrices (4+ query heads per KV head) Q5_K,
//    and without an importance matrix the first eighth of ffn_down too;
//  * the ternary presets give untied embeddings Q4_K;
// and, as in the K mixes, a 70B model's value matrices and a model of exactly eight
// experts get more bits.
#include "quantize/mix_rules.h"

namespace kiln::quantize::rules {
namespace {

using T = TensorType;

// The presets whose output projection is Q5_K (the others: Q6_K).
bool lowest_bits(FileType ft) {
  switch (ft) {
    case FileType::IQ1_S:
    case FileType::IQ1_M:
    case FileType::IQ2_XXS:
    case FileType::IQ2_XS:
    case FileType::IQ2_S:
    case FileType::IQ2_M:
    case FileType::IQ3_XXS: return true;
    default: return false;
  }
}

// The presets with their own rule set below 3 bits (IQ3_XXS, though in lowest_bits, is not
// one of them).
bool two_bit_family(FileType ft) { return lowest_bits(ft) && ft != FileType::IQ3_XXS; }

// Untied token embeddings (only looked up, never multiplied by every token's state).
T embedding_type(const IqMixState& s) {
  switch (s.ft) {
    case FileType::IQ1_S:
    case FileType::IQ1_M:
    case FileType::IQ2_XXS:
    case FileType::IQ2_XS: return T::Q2_K;
    case FileType::IQ2_S:
    case FileType::IQ2_M:
    case FileType::IQ3_XXS: return T::IQ3_S;
    case FileType::TQ1_0:
    case FileType::TQ2_0: return T::Q4_K;
    default: return s.base;
  }
}

// IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M. The ffn_down position is the count of
// ffn_down matrices typed so far even with experts (llama.cpp's rule here does not read the
// layer from the name).
T two_bit_type(IqMixState& s, Role role) {
  const bool s_or_m = s.ft == FileType::IQ2_S || s.ft == FileType::IQ2_M;
  const T step_up = s_or_m ? T::IQ3_S : T::Q2_K;
  if (is_value_like(role)) return s.gqa >= 4 || s.n_experts >= 4 ? T::Q4_K : step_up;
  if (role == Role::attn_k && s.n_experts == 8) return T::Q4_K;
  if (role == Role::ffn_down) return s.ffn_down_seen++ < s.n_layers / 8 ? step_up : s.base;
  if (role == Role::attn_output) {
    if (s.n_experts == 8) return T::Q5_K;
    if (s.ft == FileType::IQ1_S || s.ft == FileType::IQ1_M) return T::IQ2_XXS;
    if (s_or_m) return T::IQ3_S;
  }
  return s.base;
}

T value_type(const IqMixState& s) {
  T type = s.base;
  if (s.ft == FileType::IQ3_XXS) {
    type = s.gqa >= 4 ? T::Q4_K : s.has_imatrix ? T::IQ3_XXS : T::IQ3_S;
  } else if ((s.ft == FileType::IQ3_XS || s.ft == FileType::IQ3_S) && s.gqa >= 4) {
    type = T::Q4_K;
  } else if (s.ft == FileType::IQ3_M) {
    type = T::Q4_K;
  } else if ((s.ft == FileType::IQ4_NL || s.ft == FileType::IQ4_XS) && s.gqa >= 4) {
    type = T::Q5_K;
  }
  // 70B: eight query heads share each value matrix, so it is small and more bits are cheap.
  if (s.is_70b && (type == T::Q3_K || type == T::Q4_K)) type = T::Q5_K;
  return s.n_experts == 8 ? T::Q8_0 : type;
}

// The position of an FFN matrix: the layer in its name with experts, else the count so far.
int ffn_position(const IqMixState& s, int& seen, const TensorDesc& t) {
  const int position = s.n_experts > 1 ? expert_layer(t.name, s.n_layers) : seen;
  ++seen;
  return position;
}

T ffn_down_type(IqMixState& s, const TensorDesc& t) {
  const int layer = ffn_position(s, s.ffn_down_seen, t);
  const bool first_eighth = layer < s.n_layers / 8;
  if (s.ft == FileType::IQ3_XXS && !s.has_imatrix) return first_eighth ? T::Q4_K : T::Q3_K;
  if (s.ft == FileType::IQ3_M && (first_eighth || (s.n_experts == 8 && use_more_bits(layer, s.n_layers)))) return T::Q4_K;
  if ((s.ft == FileType::IQ4_NL || s.ft == FileType::IQ4_XS) && first_eighth && !s.has_imatrix) return T::Q5_K;
  return s.base;
}

T attn_output_type(const IqMixState& s) {
  if (s.n_experts == 8) {
    switch (s.ft) {
      case FileType::IQ3_XS:
      case FileType::IQ3_XXS:
      case FileType::IQ3_S:
      case FileType::IQ3_M:
      case FileType::IQ4_NL:
      case FileType::IQ4_XS: return T::Q5_K;
      default: return s.base;
    }
  }
  if (s.ft == FileType::IQ3_XXS) return T::IQ3_S;
  if (s.ft == FileType::IQ3_M) return T::Q4_K;
  return s.base;
}

}  // namespace

bool is_iq_preset(FileType ft) {
  switch (ft) {
    case FileType::IQ1_S:
    case FileType::IQ1_M:
    case FileType::IQ2_XXS:
    case FileType::IQ2_XS:
    case FileType::IQ2_S:
    case FileType::IQ2_M:
    case FileType::IQ3_XXS:
    case FileType::IQ3_XS:
    case FileType::IQ3_S:
    case FileType::IQ3_M:
    case FileType::IQ4_NL:
    case FileType::IQ4_XS:
    case FileType::TQ1_0:
    case FileType::TQ2_0: return true;
    default: return false;
  }
}

TensorType iq_mix_type(IqMixState& s, Role role, const TensorDesc& t) {
  if (role == Role::output || (s.tied && role == Role::token_embd)) {
    if (t.dims[0] % type_info(s.base).block_size != 0) return T::Q8_0;
    return lowest_bits(s.ft) ? T::Q5_K : T::Q6_K;
  }
  if (role == Role::token_embd) return embedding_type(s);
  if (two_bit_family(s.ft)) return two_bit_type(s, role);
  if (is_value_like(role)) return value_type(s);
  if (role == Role::attn_k && s.n_experts == 8) return T::Q8_0;
  if (role == Role::attn_k || role == Role::attn_q) {
    // The IQ3 presets take their bits for the value and FFN matrices from here.
    if (s.ft == FileType::IQ3_XS) return T::IQ3_XXS;
    if (s.ft == FileType::IQ3_XXS) return T::IQ2_S;
    return s.base;
  }
  if (role == Role::ffn_down) return ffn_down_type(s, t);
  if (role == Role::attn_output) return attn_output_type(s);
  if (role == Role::ffn_gate || role == Role::ffn_up) {
    const int layer = ffn_position(s, role == Role::ffn_gate ? s.ffn_gate_seen : s.ffn_up_seen, t);
    // IQ3_XS: the middle three quarters of the gate and up matrices a step down.
    if (s.ft == FileType::IQ3_XS && layer >= s.n_layers / 8 && layer < 7 * s.n_layers / 8) return T::IQ3_XXS;
  }
  return s.base;
}

}  // namespace kiln::quantize::rules
