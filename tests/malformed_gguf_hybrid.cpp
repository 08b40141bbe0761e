// The malformed-GGUF corpus's hybrid part (tests/malformed_gguf.h): a two-layer
// granitehybrid that loads and runs, and the ways its per-layer layout can disagree with
// its tensors.
#include <functional>

#include "malformed_gguf.h"

namespace kiln::test {

using gguf::Value;

RawGguf granite_hybrid_model(const gguf::File& vocab) {
  RawGguf g;
  const std::string p = "granitehybrid.";
  g.set("general.architecture", Value::of_string("granitehybrid"));
  g.set("general.name", Value::of_string("malformed-granitehybrid"));
  g.set(p + "context_length", Value::of_u32(64));
  g.set(p + "embedding_length", Value::of_u32(8));
  g.set(p + "block_count", Value::of_u32(2));
  g.set(p + "feed_forward_length", Value::of_u32(16));
  g.set(p + "attention.head_count", Value::of_u32(2));
  g.set(p + "attention.head_count_kv", Value::of_array(gguf::ValueType::INT32, {Value::of_i32(0), Value::of_i32(1)}));
  g.set(p + "attention.layer_norm_rms_epsilon", Value::of_f32(1e-5f));
  g.set(p + "rope.scaling.finetuned", Value::of_bool(false));
  g.set(p + "ssm.conv_kernel", Value::of_u32(4));
  g.set(p + "ssm.inner_size", Value::of_u32(16));
  g.set(p + "ssm.state_size", Value::of_u32(4));
  g.set(p + "ssm.time_step_rank", Value::of_u32(4));
  g.set(p + "ssm.group_count", Value::of_u32(2));
  g.set(p + "expert_count", Value::of_u32(4));
  g.set(p + "expert_used_count", Value::of_u32(2));
  g.set(p + "expert_shared_feed_forward_length", Value::of_u32(8));
  g.set(p + "embedding_scale", Value::of_f32(2.0f));
  g.set(p + "residual_scale", Value::of_f32(0.5f));
  g.set(p + "attention.scale", Value::of_f32(0.25f));
  g.set(p + "logit_scale", Value::of_f32(2.0f));
  for (const auto& [key, value] : vocab.metadata())
    if (key.rfind("tokenizer.ggml.", 0) == 0) g.set(key, value);
  const uint64_t n_vocab = vocab.get_string_array("tokenizer.ggml.tokens").size();
  uint32_t seed = 300;
  const auto add = [&](const std::string& name, std::vector<uint64_t> dims) { g.add_f32_tensor(name, std::move(dims), ++seed); };
  add("token_embd.weight", {8, n_vocab});
  add("output_norm.weight", {8});
  // Layer 0: Mamba-2 (d_inner 16 in 4 heads, 2 groups, d_state 4, conv 4).
  add("blk.0.attn_norm.weight", {8});
  add("blk.0.ssm_in.weight", {8, 16 + 32 + 4});
  add("blk.0.ssm_conv1d.weight", {4, 32});
  add("blk.0.ssm_conv1d.bias", {32});
  add("blk.0.ssm_dt.bias", {4});
  add("blk.0.ssm_a", {1, 4});
  add("blk.0.ssm_d", {1, 4});
  add("blk.0.ssm_norm.weight", {8, 2});
  add("blk.0.ssm_out.weight", {16, 8});
  // Layer 1: attention, 2 heads of 4 over 1.
  add("blk.1.attn_norm.weight", {8});
  add("blk.1.attn_q.weight", {8, 8});
  add("blk.1.attn_k.weight", {8, 4});
  add("blk.1.attn_v.weight", {8, 4});
  add("blk.1.attn_output.weight", {8, 8});
  // Both: 4 experts of 16, 2 used, and a shared expert of 8.
  for (const std::string b : {"blk.0.", "blk.1."}) {
    add(b + "ffn_norm.weight", {8});
    add(b + "ffn_gate_inp.weight", {8, 4});
    add(b + "ffn_gate_exps.weight", {8, 16, 4});
    add(b + "ffn_up_exps.weight", {8, 16, 4});
    add(b + "ffn_down_exps.weight", {16, 8, 4});
    add(b + "ffn_gate_shexp.weight", {8, 8});
    add(b + "ffn_up_shexp.weight", {8, 8});
    add(b + "ffn_down_shexp.weight", {8, 8});
  }
  return g;
}

std::vector<MalformedCase> granite_hybrid_cases(const gguf::File& vocab) {
  const RawGguf base = granite_hybrid_model(vocab);
  std::vector<MalformedCase> cases;
  const auto edit = [&](std::string name, std::vector<std::string> expect, const std::function<void(RawGguf&)>& f) {
    RawGguf g = base;
    f(g);
    cases.push_back({std::move(name), g.bytes(), std::move(expect)});
  };
  const auto kv_heads = [](std::vector<int32_t> v) {
    std::vector<Value> items;
    for (int32_t x : v) items.push_back(Value::of_i32(x));
    return Value::of_array(gguf::ValueType::INT32, std::move(items));
  };
  const std::string p = "granitehybrid.";
  edit("hybrid-head-count-kv-wrong-length", {p + "attention.head_count_kv has 3 entries for 2 layers"},
       [&](RawGguf& g) { g.set(p + "attention.head_count_kv", kv_heads({0, 1, 1})); });
  edit("hybrid-head-count-kv-negative", {p + "attention.head_count_kv holds a value out of range"},
       [&](RawGguf& g) { g.set(p + "attention.head_count_kv", kv_heads({0, -1})); });
  edit("hybrid-attention-layer-without-attention",
       {"missing tensor 'blk.0.attn_q.weight' (layer 0 is an attention layer: " + p + "attention.head_count_kv[0] is 1)"},
       [&](RawGguf& g) { g.set(p + "attention.head_count_kv", kv_heads({1, 1})); });
  edit("hybrid-ssm-layer-without-ssm",
       {"missing tensor 'blk.1.ssm_in.weight' (layer 1 is a Mamba-2 layer: " + p + "attention.head_count_kv[1] is 0)"},
       [&](RawGguf& g) { g.set(p + "attention.head_count_kv", kv_heads({0, 0})); });
  edit("hybrid-shared-expert-wrong-shape", {"tensor 'blk.0.ffn_gate_shexp.weight' has shape [8, 8], expected [8, 16]"},
       [&](RawGguf& g) { g.set(p + "expert_shared_feed_forward_length", Value::of_u32(16)); });
  edit("hybrid-shared-expert-missing", {"missing tensor 'blk.1.ffn_down_shexp.weight'"},
       [](RawGguf& g) { g.erase_tensor("blk.1.ffn_down_shexp.weight"); });
  edit("hybrid-residual-scale-negative", {p + "residual_scale is -0.500000, expected a positive number"},
       [&](RawGguf& g) { g.set(p + "residual_scale", Value::of_f32(-0.5f)); });
  return cases;
}

}  // namespace kiln::test
