// llama-quantize's per-tensor type rules (llama.cpp src/llama-quant.cpp decides them in
// tensor_allows_quantization, llama_tensor_get_type_impl and tensor_type_fallback), for
// the architectures kiln runs, without an importance matrix or user overrides, restated as
// tables: which tensors are quantized, the K mixes, the 70B sizes, the 8-expert rules.
#include "quantize/mix.h"

#include "kernels/quant_iq.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "kiln/error.h"
#include "quantize/mix_rules.h"

namespace kiln::quantize {
namespace {

using namespace rules;

constexpr Preset kPresets[] = {
    {"Q8_0", FileType::Q8_0, TensorType::Q8_0, false},
    {"Q4_0", FileType::Q4_0, TensorType::Q4_0, false},
    {"Q4_1", FileType::Q4_1, TensorType::Q4_1, false},
    {"Q5_0", FileType::Q5_0, TensorType::Q5_0, false},
    {"Q5_1", FileType::Q5_1, TensorType::Q5_1, false},
    {"Q2_K", FileType::Q2_K, TensorType::Q2_K, true},
    {"Q3_K_S", FileType::Q3_K_S, TensorType::Q3_K, true},
    {"Q3_K_M", FileType::Q3_K_M, TensorType::Q3_K, true},
    {"Q3_K_L", FileType::Q3_K_L, TensorType::Q3_K, true},
    {"Q4_K_S", FileType::Q4_K_S, TensorType::Q4_K, true},
    {"Q4_K_M", FileType::Q4_K_M, TensorType::Q4_K, true},
    {"Q5_K_S", FileType::Q5_K_S, TensorType::Q5_K, true},
    {"Q5_K_M", FileType::Q5_K_M, TensorType::Q5_K, true},
    {"Q6_K", FileType::Q6_K, TensorType::Q6_K, true},
    {"IQ2_XXS", FileType::IQ2_XXS, TensorType::IQ2_XXS, true},
    {"IQ2_XS", FileType::IQ2_XS, TensorType::IQ2_XS, true},
    {"IQ2_S", FileType::IQ2_S, TensorType::IQ2_XS, true},
    {"IQ2_M", FileType::IQ2_M, TensorType::IQ2_S, true},
    {"IQ1_S", FileType::IQ1_S, TensorType::IQ1_S, true},
    {"IQ1_M", FileType::IQ1_M, TensorType::IQ1_M, true},
    {"IQ3_XXS", FileType::IQ3_XXS, TensorType::IQ3_XXS, true},
    {"IQ3_XS", FileType::IQ3_XS, TensorType::IQ3_S, true},
    {"IQ3_S", FileType::IQ3_S, TensorType::IQ3_S, true},
    {"IQ3_M", FileType::IQ3_M, TensorType::IQ3_S, true},
    {"IQ4_NL", FileType::IQ4_NL, TensorType::IQ4_NL, true},
    {"IQ4_XS", FileType::IQ4_XS, TensorType::IQ4_XS, true},
    {"TQ1_0", FileType::TQ1_0, TensorType::TQ1_0, true},
    {"TQ2_0", FileType::TQ2_0, TensorType::TQ2_0, true},
    {"MXFP4_MOE", FileType::MXFP4_MOE, TensorType::MXFP4, false},
};

// llama-quantize accepts the bare K type names for its medium mixes.
constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
    {"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

uint64_t block_size(TensorType t) { return type_info(t).block_size; }

TypeChoice plain(TensorType t) { return {t, false, {}}; }



// ggml_n_dims: trailing dimensions of 1 do not count, so a [n, 1] tensor is 1-D.
size_t effective_dims(const std::vector<uint64_t>& dims) {
  size_t n = dims.size();
  while (n > 1 && dims[n - 1] == 1) --n;
  return n;
}

// llama.cpp's tensor_allows_quantization: only 2-D and 3-D weights, never norms, and a list
// of small or position-like tensors other architectures have (kept so a file that has
// them is treated the same way).
bool llama_quantizes(const TensorDesc& t) {
  if (effective_dims(t.dims) < 2) return false;
  const std::string& n = t.name;
  if (!ends_with(n, "weight") || contains(n, "_norm.weight")) return false;
  if (n == "position_embd.weight" || n == "token_types.weight") return false;
  static constexpr std::string_view kNever[] = {
      "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "ssm_conv1d",
      "shortconv.conv.weight", "time_mix_first.weight", "time_mix_w0.weight",
      "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
      "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
      "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
      "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
      ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
      ".patch_merger"};
  for (std::string_view part : kNever)
    if (contains(n, part)) return false;
  return true;
}


// The K mixes as data. Each one gives most matrices its base type and singles out three
// groups: the value projections (attn_v, or the fused attn_qkv), ffn_down, and
// attn_output. In the first two, a tensor's position among its group (not the layer in
// its name) decides whether it gets `more` bits or `rest`.
enum class Pick {
  none,             // every tensor of the group gets `rest`
  first_n,          // the first n
  first_sixteenth,  // position < n_layers / 16
  first_eighth,     // position < n_layers / 8
  more_bits,        // use_more_bits(position, group size)
  gqa_4,            // every tensor when 4 or more query heads share each KV head
};
constexpr TensorType kBase = TensorType::F32;  // stands for the mix's base type in the table

struct Boost {
  Pick pick = Pick::none;
  TensorType more = kBase;
  TensorType rest = kBase;
  int n = 0;  // for first_n
};

struct KMix {
  FileType ft;
  Boost value;
  Boost ffn_down;
  TensorType attn_output = kBase;
};

constexpr TensorType Q3 = TensorType::Q3_K, Q4 = TensorType::Q4_K, Q5 = TensorType::Q5_K, Q6 = TensorType::Q6_K;
constexpr KMix kKMixes[] = {
    {FileType::Q2_K, {Pick::gqa_4, Q4, Q3}, {Pick::none, kBase, Q3}, Q3},
    {FileType::Q3_K_S, {}, {}},
    {FileType::Q3_K_M, {Pick::first_n, Q5, Q4, 2}, {Pick::first_sixteenth, Q5, Q4}, Q4},
    {FileType::Q3_K_L, {Pick::none, kBase, Q5}, {Pick::none, kBase, Q5}, Q5},
    {FileType::Q4_K_S, {Pick::first_n, Q5, kBase, 4}, {Pick::first_eighth, Q5, kBase}},
    {FileType::Q4_K_M, {Pick::more_bits, Q6, kBase}, {Pick::more_bits, Q6, kBase}},
    {FileType::Q5_K_S, {}, {}},
    {FileType::Q5_K_M, {Pick::more_bits, Q6, kBase}, {Pick::more_bits, Q6, kBase}},
    {FileType::Q6_K, {}, {}},
};

const KMix& k_mix(FileType ft) {
  for (const KMix& m : kKMixes)
    if (m.ft == ft) return m;
  throw Error("no K mix for file type " + std::to_string(uint32_t(ft)));  // every K preset has a row
}

// The architectures kiln runs, and which of their sizes llama.cpp calls a 70B model (its
// value matrices then get more bits, see mix_type). llama-quantize applies the same rules
// to all of them; only the 70B test depends on the family.
struct ArchRule {
  std::string_view arch;
  bool (*is_70b)(const ModelFacts&);
};
bool never_70b(const ModelFacts&) { return false; }
constexpr ArchRule kArchRules[] = {
    // LLaMA-1 65B has 80 layers too, without grouped-query attention.
    {"llama", [](const ModelFacts& m) { return m.n_layers == 80 && m.n_heads != m.n_kv_heads; }},
    {"qwen2", [](const ModelFacts& m) { return m.n_layers == 80; }},  // Qwen2 72B
    {"qwen3", never_70b},
    {"qwen3moe", never_70b},
    {"gemma", never_70b},
    {"gemma2", never_70b},
    {"gemma3", never_70b},
    {"phi3", never_70b},
    {"mpt", never_70b},
    // The Mamba-2 projections (ssm_in, ssm_out) take the base type like any other matrix;
    // a hybrid's value projections are counted over its attention layers only.
    {"gpt-oss", never_70b},
    {"mamba2", never_70b},
    {"granitehybrid", never_70b},
};

const ArchRule* arch_rule(const std::string& arch) {
  for (const ArchRule& r : kArchRules)
    if (r.arch == arch) return &r;
  return nullptr;
}

// The state llama-quantize carries from tensor to tensor: how many value projections and
// ffn_down matrices it has typed so far. Their position, not the layer in the name, picks
// the type, so the tensors must be visited in llama.cpp's order (see visit_order).
struct MixState {
  const KMix& mix;
  TensorType base;
  int n_layers;
  int n_value_like;  // value-projection tensors in the whole model
  int gqa;           // n_heads / n_kv_heads
  bool is_70b;
  bool tied;         // no output.weight: token_embd doubles as the output projection
  uint32_t n_experts;
  int value_seen = 0;
  int ffn_down_seen = 0;
};

TensorType boosted(const Boost& b, int position, int group_size, const MixState& s) {
  bool more = false;
  switch (b.pick) {
    case Pick::none: break;
    case Pick::first_n: more = position < b.n; break;
    case Pick::first_sixteenth: more = position < s.n_layers / 16; break;
    case Pick::first_eighth: more = position < s.n_layers / 8; break;
    case Pick::more_bits: more = use_more_bits(position, group_size); break;
    case Pick::gqa_4: more = s.gqa >= 4; break;
  }
  const TensorType t = more ? b.more : b.rest;
  return t == kBase ? s.base : t;
}

// The output projection decides every token: Q6_K, or Q8_0 when rows are not whole blocks
// of the base type (the block test uses the base type, not Q6_K's) or the base is Q8_0.
TensorType output_projection_type(TensorType base, const TensorDesc& t) {
  if (t.dims[0] % block_size(base) != 0 || base == TensorType::Q8_0) return TensorType::Q8_0;
  return TensorType::Q6_K;
}


// llama.cpp tuned these on Mixtral 8x7B and applies them to any model with exactly eight
// experts, whatever the preset: its attention is a small share of the weights, so the key
// and value projections get Q8_0, and attn_output Q5_K in the lower mixes.
bool eight_expert_kv(uint32_t n_experts, Role r) { return n_experts == 8 && (is_value_like(r) || r == Role::attn_k); }
bool eight_expert_attn_output_q5(FileType ft) {
  switch (ft) {
    case FileType::Q2_K:
    case FileType::Q3_K_S:
    case FileType::Q3_K_M:
    case FileType::Q4_K_S:
    case FileType::Q4_K_M: return true;
    default: return false;
  }
}

// The type a K mix gives a tensor, before the row-length fallback.
TensorType mix_type(MixState& s, Role role, const TensorDesc& t) {
  if (role == Role::output || (s.tied && role == Role::token_embd)) return output_projection_type(s.base, t);
  if (is_value_like(role)) {
    TensorType type = boosted(s.mix.value, s.value_seen++, s.n_value_like, s);
    // In 70B models 8 heads share each value matrix, so it is 8x smaller than attn_q and
    // more bits cost little.
    if (s.is_70b && (type == TensorType::Q3_K || type == TensorType::Q4_K)) type = TensorType::Q5_K;
    return eight_expert_kv(s.n_experts, role) ? TensorType::Q8_0 : type;
  }
  if (role == Role::attn_k) return eight_expert_kv(s.n_experts, role) ? TensorType::Q8_0 : s.base;
  if (role == Role::ffn_down) {
    // With experts, the layer in the name picks the type: a model's expert and shared
    // matrices need not come one per layer in order (llama.cpp found Mixtral's did not).
    const int position = s.n_experts > 1 ? expert_layer(t.name, s.n_layers) : s.ffn_down_seen;
    ++s.ffn_down_seen;
    return boosted(s.mix.ffn_down, position, s.n_layers, s);
  }
  if (role == Role::attn_output) {
    if (s.n_experts == 8) return eight_expert_attn_output_q5(s.mix.ft) ? TensorType::Q5_K : s.base;
    return s.mix.attn_output == kBase ? s.base : s.mix.attn_output;
  }
  return s.base;
}

// tensor_type_fallback: a type whose blocks do not tile the rows becomes the 32-value type
// of about the same size (IQ4_NL for the i-quants), and F16 if even that does not fit.
TypeChoice fit_row_length(TensorType type, const TensorDesc& t) {
  const uint64_t row = t.dims[0];
  if (row % block_size(type) == 0) return plain(type);
  TensorType fallback;
  switch (type) {
    case TensorType::IQ1_S:
    case TensorType::IQ1_M:
    case TensorType::IQ2_XXS:
    case TensorType::IQ2_XS:
    case TensorType::IQ2_S:
    case TensorType::IQ3_XXS:
    case TensorType::IQ3_S:
    case TensorType::IQ4_XS: fallback = TensorType::IQ4_NL; break;
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::TQ1_0:
    case TensorType::TQ2_0: fallback = TensorType::Q4_0; break;
    case TensorType::Q4_K: fallback = TensorType::Q5_0; break;
    case TensorType::Q5_K: fallback = TensorType::Q5_1; break;
    case TensorType::Q6_K: fallback = TensorType::Q8_0; break;
    default:
      throw Error("tensor '" + t.name + "': rows of " + std::to_string(row) + " are not whole " + type_name(type) +
                  " blocks, and llama-quantize defines no fallback for " + type_name(type));
  }
  if (row % block_size(fallback) != 0) fallback = TensorType::F16;
  return {fallback, true, "rows of " + std::to_string(row) + " are not whole " + type_name(type) + " blocks"};
}

// llama-quantize refuses to write these types without an importance matrix ("the result
// will be garbage"), except in the embeddings and output projection, where its rules never
// put them.
void require_no_importance(TensorType type, Role r, const TensorDesc& t) {
  if (r == Role::output || r == Role::token_embd) return;
  switch (type) {
    case TensorType::IQ1_S:
    case TensorType::IQ1_M:
    case TensorType::IQ2_XXS:
    case TensorType::IQ2_XS:
    case TensorType::IQ2_S:
    case TensorType::IQ3_XXS: break;
    default: return;
  }
  throw Error("this quantization requires an importance matrix: tensor '" + t.name + "' would be " + type_name(type) +
              ", which llama-quantize refuses to write without one (make one with llama-imatrix)");
}

// llama-quantize visits tensors sorted by layer number (non-layer tensors first), then by
// name: that order numbers the value projections and ffn_down matrices.
std::vector<size_t> visit_order(const std::vector<TensorDesc>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_in_name(tensors[a].name), lb = layer_in_name(tensors[b].name);
    if (la != lb) return la < lb;
    return tensors[a].name < tensors[b].name;
  });
  return order;
}

// The legacy presets: every 2-D (and 3-D expert) tensor whose rows are whole blocks gets the base type
// (llama-quantize would refuse the others; kiln keeps their type), except the output
// projection, which gets llama-quantize's choice (Q6_K, or Q8_0) as in the K mixes, and
// an 8-expert model's key and value projections, which get Q8_0 as there.
std::vector<TypeChoice> legacy_types(const Preset& p, const ModelFacts& model, const std::vector<TensorDesc>& tensors,
                                     bool has_imatrix) {
  bool tied = true;
  for (const TensorDesc& t : tensors)
    if (role_of(t.name) == Role::output) tied = false;
  // With an importance matrix, llama-quantize gives the first eighth of the ffn_down
  // matrices Q4_1 (Q5_1) in the Q4_0 (Q5_0) preset: their first layers go astray even with
  // one. Position as in the K mixes: the layer in the name with experts, else the visiting
  // order.
  const bool step_up_ffn_down = has_imatrix && (p.base_type == TensorType::Q4_0 || p.base_type == TensorType::Q5_0);
  std::vector<int> ffn_down_position(tensors.size(), -1);
  if (step_up_ffn_down) {
    int seen = 0;
    for (size_t i : visit_order(tensors)) {
      const TensorDesc& t = tensors[i];
      if (role_of(t.name) != Role::ffn_down || !llama_quantizes(t)) continue;
      ffn_down_position[i] = model.n_experts > 1 ? expert_layer(t.name, int(model.n_layers)) : seen;
      ++seen;
    }
  }
  std::vector<TypeChoice> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    const Role r = role_of(t.name);
    // 3-D: a mixture of experts' stacked matrices (rows of every expert, one after the
    // other). What llama-quantize never quantizes stays as it is: the router
    // (ffn_gate_inp), biases (gpt-oss's per-expert 2-D ones), 2-D norms (Mamba-2's grouped ssm_norm), ssm_conv1d.
    if ((t.dims.size() != 2 && t.dims.size() != 3) || !llama_quantizes(t)) {
      out.push_back(plain(t.type));
    } else if (t.dims[0] % block_size(p.base_type) != 0) {
      out.push_back({t.type, true,
                     "rows of " + std::to_string(t.dims[0]) + " are not whole " + type_name(p.base_type) + " blocks"});
    } else if (r == Role::output || (tied && r == Role::token_embd)) {
      out.push_back(fit_row_length(output_projection_type(p.base_type, t), t));
    } else if (eight_expert_kv(model.n_experts, r) && llama_quantizes(t)) {
      out.push_back(plain(TensorType::Q8_0));
    } else if (ffn_down_position[i] >= 0 && ffn_down_position[i] < int(model.n_layers) / 8) {
      out.push_back(plain(p.base_type == TensorType::Q4_0 ? TensorType::Q4_1 : TensorType::Q5_1));
    } else {
      out.push_back(plain(p.base_type));
    }
  }
  return out;
}

// MXFP4_MOE: llama-quantize's rule tests the third dimension, not the name, so any
// stacked matrix of several experts qualifies and a [n, m, 1] tensor does not.
std::vector<TypeChoice> mxfp4_moe_types(const std::vector<TensorDesc>& tensors) {
  std::vector<TypeChoice> out;
  for (const TensorDesc& t : tensors) {
    if (!llama_quantizes(t)) {
      out.push_back(plain(t.type));
      continue;
    }
    const bool experts = t.dims.size() >= 3 && t.dims[2] > 1 && role_of(t.name) != Role::output;
    out.push_back(fit_row_length(experts ? TensorType::MXFP4 : TensorType::Q8_0, t));
  }
  return out;
}

}  // namespace

const Preset* find_preset(std::string_view name) {
  std::string want = upper(name);
  for (const auto& [alias, target] : kAliases)
    if (want == alias) want = target;
  for (const Preset& p : kPresets)
    if (p.name == want) return &p;
  return nullptr;
}

std::string preset_names() {
  std::string out;
  for (const Preset& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

namespace {

std::vector<TypeChoice> preset_types(const Preset& preset, const ModelFacts& model,
                                     const std::vector<TensorDesc>& tensors, bool has_imatrix) {
  if (preset.file_type == FileType::MXFP4_MOE) return mxfp4_moe_types(tensors);
  if (!preset.llama_mix) return legacy_types(preset, model, tensors, has_imatrix);
  const ArchRule* arch = arch_rule(model.arch);
  if (!arch) {
    std::string known;
    for (const ArchRule& r : kArchRules) known += (known.empty() ? "" : ", ") + std::string(r.arch);
    throw Error("the " + std::string(preset.name) + " mix follows llama-quantize's rules for the architectures kiln runs (" +
                known + "); this model is '" + model.arch + "'");
  }
  const int gqa = model.n_kv_heads ? int(model.n_heads / model.n_kv_heads) : 0;
  int n_value_like = 0;
  bool tied = true;
  for (const TensorDesc& t : tensors) {
    const Role r = role_of(t.name);
    if (is_value_like(r)) ++n_value_like;
    if (r == Role::output) tied = false;
  }
  const bool iq = is_iq_preset(preset.file_type);
  IqMixState iq_state{preset.file_type, preset.base_type, int(model.n_layers), gqa, arch->is_70b(model), tied,
                      model.n_experts, has_imatrix};
  std::optional<MixState> k_state;
  if (!iq)
    k_state.emplace(MixState{k_mix(preset.file_type), preset.base_type, int(model.n_layers), n_value_like, gqa,
                             arch->is_70b(model), tied, model.n_experts});

  std::vector<TypeChoice> out(tensors.size(), plain(TensorType::F32));
  for (size_t i : visit_order(tensors)) {
    const TensorDesc& t = tensors[i];
    if (!llama_quantizes(t)) {
      out[i] = plain(t.type);
      continue;
    }
    const Role r = role_of(t.name);
    out[i] = fit_row_length(iq ? iq_mix_type(iq_state, r, t) : mix_type(*k_state, r, t), t);
    if (!has_imatrix) require_no_importance(out[i].type, r, t);
  }
  return out;
}

// Exactly the type asked for: llama-quantize applies overrides after its fallbacks.
TypeChoice forced(TensorType type, const TensorDesc& t) {
  if (t.dims[0] % block_size(type) != 0)
    throw Error("tensor '" + t.name + "': rows of " + std::to_string(t.dims[0]) + " are not whole " + type_name(type) +
                " blocks (from --pure, --output-tensor-type or --token-embedding-type)");
  return plain(type);
}

}  // namespace

std::vector<TypeChoice> choose_types(const Preset& preset, const ModelFacts& model,
                                     const std::vector<TensorDesc>& tensors, bool has_imatrix,
                                     const TypeOverrides& overrides) {
  std::vector<TypeChoice> out = preset_types(preset, model, tensors, has_imatrix);
  if (!overrides.pure && !overrides.output_type && !overrides.token_embd_type) return out;
  bool tied = true;
  for (const TensorDesc& t : tensors)
    if (role_of(t.name) == Role::output) tied = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    if (!llama_quantizes(t)) continue;
    const Role r = role_of(t.name);
    if (r == Role::token_embd && overrides.token_embd_type) {
      out[i] = forced(*overrides.token_embd_type, t);
    } else if (r == Role::output && overrides.output_type) {
      out[i] = forced(*overrides.output_type, t);
    } else if (overrides.pure) {
      out[i] = forced(preset.base_type, t);
    } else if (r == Role::token_embd && tied && overrides.output_type) {
      out[i] = forced(*overrides.output_type, t);
    } else {
      continue;
    }
    if (has_imatrix) continue;
    require_no_importance(out[i].type, r, t);
    // The embeddings and output escape llama-quantize's refusal, but not ggml's quantizers.
    if (kernels::ref::quantize_requires_importance(out[i].type))
      throw Error("tensor '" + t.name + "' would be " + type_name(out[i].type) +
                  ", which cannot be written without an importance matrix (--imatrix)");
  }
  return out;
}

}  // namespace kiln::quantize
