// Random-weight GGUFs of every family kiln runs. Speed matters for the 1.1B shape (a billion values): one
// splitmix64 draw gives two 24-bit uniforms, and values are converted chunk by chunk into
// the tensor's bytes, so the only large allocation is the file's own tensor data.
#include "model_gen/generate_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kiln/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln::gen {
namespace {

bool is_gemma(const std::string& arch) { return arch == "gemma" || arch == "gemma2" || arch == "gemma3"; }
bool rope_family(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" || arch == "phi3" ||
         arch == "gpt-oss" || is_gemma(arch);
}
uint32_t head_dim_of(const ModelShape& s) { return s.head_dim ? s.head_dim : s.n_heads ? s.dim / s.n_heads : 0; }

// Llama 3.1's rope_freqs: pairs turning more than high_freq_factor times over the original
// context keep their frequency, those turning fewer than low_freq_factor times are slowed
// by `factor`, a smooth blend in between (Meta's apply_scaling). Stored as divisors.
std::vector<float> llama3_freq_factors(uint32_t n_rot, double base, double orig) {
  const double factor = 8, low = 1, high = 4, pi = 3.14159265358979323846;
  std::vector<float> out(n_rot / 2);
  for (uint32_t i = 0; i < n_rot / 2; ++i) {
    const double wavelen = 2 * pi * std::pow(base, 2.0 * i / n_rot);
    if (wavelen < orig / high) out[i] = 1.0f;
    else if (wavelen > orig / low) out[i] = float(factor);
    else {
      const double smooth = (orig / wavelen - low) / (high - low);
      out[i] = float(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return out;
}

// LongRoPE's divisors, pair i of n: short ones near 1, long ones growing with i (slow pairs
// slowed most) as Phi-3's do, but steeper and unequal on every pair, pair 0 included, so
// that a 40-token prompt sees which set was used.
std::vector<float> longrope_factors(uint32_t n_rot, bool long_factors) {
  std::vector<float> out(n_rot / 2);
  for (uint32_t i = 0; i < n_rot / 2; ++i) out[i] = long_factors ? 1.25f * float(1 + i) : 1.0f + 0.1f * float(i);
  return out;
}

void add_f32_tensor(gguf::Writer& w, const std::string& name, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  w.add_tensor(name, TensorType::F32, {v.size()}, std::move(bytes));
}

// splitmix64: a full-period 64-bit generator that passes BigCrush and costs a few cycles.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

uint64_t stream_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the tensor name
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  SplitMix64 mix{seed ^ h};
  return mix.next();
}

// Fills n values uniform in [center - half_width, center + half_width), stored as `type`.
// Values are drawn into a small float chunk and converted by the kernel table's SIMD
// F16/BF16 conversion (bit-identical to the scalar one), which keeps this memory-bound.
std::vector<uint8_t> random_tensor(TensorType type, uint64_t n, double center, double half_width,
                                   uint64_t seed) {
  const size_t elem = type == TensorType::F32 ? 4 : 2;
  std::vector<uint8_t> bytes(n * elem);
  SplitMix64 rng{seed};
  const float scale = float(2.0 * half_width / double(1u << 24));
  const float offset = float(center - half_width);
  const kernels::Ops& ops = kernels::ops();
  constexpr size_t kChunk = 4096;  // even, so each draw fills two values of one chunk
  float chunk[kChunk];
  for (uint64_t at = 0; at < n; at += kChunk) {
    const size_t m = (size_t)std::min<uint64_t>(kChunk, n - at);
    for (size_t i = 0; i < m; i += 2) {
      const uint64_t r = rng.next();
      chunk[i] = offset + float(uint32_t(r >> 40)) * scale;
      if (i + 1 < m) chunk[i + 1] = offset + float(uint32_t(r >> 8) & 0xffffffu) * scale;
    }
    uint8_t* dst = bytes.data() + at * elem;
    if (type == TensorType::F32) std::memcpy(dst, chunk, m * 4);
    else if (type == TensorType::F16) ops.f32_to_fp16(chunk, reinterpret_cast<uint16_t*>(dst), m);
    else ops.f32_to_bf16(chunk, reinterpret_cast<uint16_t*>(dst), m);
  }
  return bytes;
}

uint32_t file_type_of(TensorType t) {  // general.file_type: "mostly <type>"
  switch (t) {
    case TensorType::F32: return 0;
    case TensorType::F16: return 1;
    case TensorType::BF16: return 32;
    default: return 0;
  }
}

void check_shape(const ModelShape& s) {
  auto bad = [&](const std::string& why) { throw Error("model shape '" + s.name + "': " + why); };
  if (s.arch == "mamba2" || s.arch == "granitehybrid") {
    if (!s.dim || !s.n_layers || !s.n_ctx || !s.ssm_d_state || !s.ssm_head_dim || !s.ssm_n_groups || !s.ssm_d_conv)
      bad("every dimension must be positive");
    if ((2 * s.dim) % s.ssm_head_dim || (2 * s.dim / s.ssm_head_dim) % s.ssm_n_groups)
      bad("the heads (2 * dim / ssm_head_dim) must split into ssm_n_groups groups");
    if (s.arch == "mamba2") return;
  }
  if (s.arch == "granitehybrid") {
    if (!s.dim || !s.n_heads || !s.n_kv_heads || !s.ffn_dim || s.n_heads % s.n_kv_heads || s.dim % s.n_heads)
      bad("the attention layers need heads that divide dim, kv heads that divide them, and an FFN");
    if (s.n_experts && (!s.n_experts_used || s.n_experts_used > s.n_experts))
      bad("expert_used_count must be 1 to expert_count");
    if (s.shared_expert_ffn_dim && !s.n_experts) bad("a shared expert needs experts");
    if (s.n_experts && s.expert_ffn_dim != s.ffn_dim) bad("granitehybrid's experts are ffn_dim wide (expert_ffn_dim)");
    return;
  }
  if (!s.dim || !s.n_layers || !s.n_heads || !s.n_kv_heads || !s.ffn_dim || !s.n_ctx)
    bad("every dimension must be positive");
  if (s.dim % s.n_heads) bad("dim " + std::to_string(s.dim) + " is not a multiple of n_heads");
  if (s.n_heads % s.n_kv_heads) bad("n_heads is not a multiple of n_kv_heads");
  if (!rope_family(s.arch) && s.arch != "mpt" && s.arch != "bert" && s.arch != "nomic-bert") bad("unknown architecture '" + s.arch + "'");  // mamba2: above
  if (rope_family(s.arch) && head_dim_of(s) % 2) bad("the head size must be even for RoPE");
  if (s.arch == "phi3" && head_dim_of(s) * s.n_heads != s.dim) bad("phi3's attention output is dim x dim");
  if (s.arch == "mpt" && !(s.max_alibi_bias > 0)) bad("an mpt shape needs max_alibi_bias > 0");
  if (s.arch == "mpt" && s.swa_window > 0) bad("mpt files have no sliding window");
  if (s.longrope_orig_ctx && s.arch != "phi3") bad("LongRoPE is for phi3 shapes");
  if (s.longrope_orig_ctx && s.n_ctx <= s.longrope_orig_ctx) bad("LongRoPE's original context must be below context_length");
  if ((s.arch == "qwen3moe" || s.arch == "gpt-oss") && !s.n_experts) bad(s.arch + " needs experts");
  if (s.arch == "gpt-oss" && (!s.swa_window || s.swa_pattern)) bad("gpt-oss slides a window on even layers, no pattern key");
  if (s.n_experts && s.arch != "qwen3moe" && s.arch != "llama" && s.arch != "gpt-oss")
    bad("experts are for qwen3moe, gpt-oss and llama (Mixtral) shapes");
  if (s.n_experts && (!s.n_experts_used || s.n_experts_used > s.n_experts || !s.expert_ffn_dim))
    bad("expert_used_count must be 1 to expert_count, with an expert width");
}

// The encoders' tensors after token_embd: token types (2, as BERT's vocabularies state
// in tokenizer.ggml.token_type_count), BERT's learned positions, the input LayerNorm, and
// post-norm blocks whose LayerNorms always have biases. BERT: Q, K, V and output with
// biases, a GELU MLP with biases. nomic-bert: one attn_qkv and the output without biases,
// a SwiGLU without biases (as nomic-embed-text's converter writes it). No output norm, no
// classifier. `bias` writes a bias when the shape has them, `norm_bias` always.
template <typename Matrix, typename Norm, typename Bias, typename NormBias>
void write_encoder(const GenerateOptions& o, Matrix& matrix, Norm& norm, Bias& bias, NormBias& norm_bias) {
  const ModelShape& s = o.shape;
  const bool nomic = s.arch == "nomic-bert";
  const uint64_t dim = s.dim, ffn = s.ffn_dim;
  matrix("token_types.weight", 2, dim);
  if (!nomic) matrix("position_embd.weight", s.n_ctx, dim);
  norm("token_embd_norm.weight");
  norm_bias("token_embd_norm.bias", dim);
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    if (nomic) {
      matrix(b + "attn_qkv.weight", 3 * dim, dim);
      matrix(b + "attn_output.weight", dim, dim);
    } else {
      for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
        matrix(b + m + ".weight", dim, dim);
        bias(b + m + ".bias", dim);
      }
    }
    norm(b + "attn_output_norm.weight");
    norm_bias(b + "attn_output_norm.bias", dim);
    matrix(b + "ffn_up.weight", ffn, dim);
    bias(b + "ffn_up.bias", ffn);
    if (nomic) matrix(b + "ffn_gate.weight", ffn, dim);
    matrix(b + "ffn_down.weight", dim, ffn);
    bias(b + "ffn_down.bias", dim);
    norm(b + "layer_output_norm.weight");
    norm_bias(b + "layer_output_norm.bias", dim);
  }
}

// The model around a vocabulary: `write_tokenizer` puts its tokenizer.* keys where a
// converter would, after the hyperparameters.
template <typename WriteTokenizer>
gguf::Writer build(const GenerateOptions& o, uint64_t n_vocab, WriteTokenizer&& write_tokenizer) {
  const ModelShape& s = o.shape;
  check_shape(s);
  if (o.type != TensorType::F32 && o.type != TensorType::F16 && o.type != TensorType::BF16)
    throw Error("kiln-gen writes F32, F16 or BF16 weights, not " + type_name(o.type));

  using gguf::Value;
  gguf::Writer w;
  const std::string a = s.arch + ".";
  const bool mpt = s.arch == "mpt", bert = s.arch == "bert" || s.arch == "nomic-bert";
  w.set("general.architecture", Value::of_string(s.arch));
  w.set("general.name", Value::of_string(s.name + " (random weights, seed " + std::to_string(o.seed) + ")"));
  w.set("general.file_type", Value::of_u32(file_type_of(o.type)));
  const uint32_t head_dim = head_dim_of(s);
  w.set(a + "context_length", Value::of_u32(s.n_ctx));
  w.set(a + "embedding_length", Value::of_u32(s.dim));
  w.set(a + "block_count", Value::of_u32(s.n_layers));
  w.set(a + "feed_forward_length", Value::of_u32(s.ffn_dim));
  w.set(a + "attention.head_count", Value::of_u32(s.n_heads));
  const bool granite = s.arch == "granitehybrid";
  const auto attends = [&](uint32_t l) { return std::count(s.attn_layers.begin(), s.attn_layers.end(), l) > 0; };
  if (s.arch == "mamba2" || granite) {
    w.set(a + "ssm.conv_kernel", Value::of_u32(s.ssm_d_conv));
    w.set(a + "ssm.inner_size", Value::of_u32(2 * s.dim));
    w.set(a + "ssm.state_size", Value::of_u32(s.ssm_d_state));
    w.set(a + "ssm.time_step_rank", Value::of_u32(2 * s.dim / s.ssm_head_dim));
    w.set(a + "ssm.group_count", Value::of_u32(s.ssm_n_groups));
  }
  if (granite) {  // per layer, 0 marking a Mamba-2 layer, as the converter writes it
    std::vector<Value> kv;
    for (uint32_t l = 0; l < s.n_layers; ++l) kv.push_back(Value::of_i32(attends(l) ? int32_t(s.n_kv_heads) : 0));
    w.set(a + "attention.head_count_kv", Value::of_array(gguf::ValueType::INT32, std::move(kv)));
  } else if (s.arch != "mamba2") {
  w.set(a + "attention.head_count_kv", Value::of_u32(s.n_kv_heads));
  }
  if (s.n_experts) {
    w.set(a + "expert_count", Value::of_u32(s.n_experts));
    w.set(a + "expert_used_count", Value::of_u32(s.n_experts_used));
    // Mixtral and Granite: the experts' width is feed_forward_length.
    if (s.arch != "llama" && !granite) w.set(a + "expert_feed_forward_length", Value::of_u32(s.expert_ffn_dim));
    if (s.shared_expert_ffn_dim) w.set(a + "expert_shared_feed_forward_length", Value::of_u32(s.shared_expert_ffn_dim));
  }
  if (s.pooling_type >= 0) w.set(a + "pooling_type", Value::of_u32(uint32_t(s.pooling_type)));
  if (bert) {  // as llama.cpp's converter writes a BertModel (or NomicBertModel)
    w.set(a + "attention.layer_norm_epsilon", Value::of_f32(s.rms_eps));
    w.set(a + "attention.causal", Value::of_bool(false));
    if (s.arch == "nomic-bert") w.set(a + "rope.freq_base", Value::of_f32(s.rope_theta));
  } else if (mpt) {
    w.set(a + "attention.layer_norm_epsilon", Value::of_f32(s.rms_eps));
    w.set(a + "attention.max_alibi_bias", Value::of_f32(s.max_alibi_bias));
    if (s.clamp_kqv > 0) w.set(a + "attention.clamp_kqv", Value::of_f32(s.clamp_kqv));
  } else if (s.arch == "mamba2") {
    w.set(a + "attention.layer_norm_rms_epsilon", Value::of_f32(s.rms_eps));
  } else {
    w.set(a + "attention.layer_norm_rms_epsilon", Value::of_f32(s.rms_eps));
    w.set(a + "rope.freq_base", Value::of_f32(s.rope_theta));
    w.set(a + "rope.dimension_count", Value::of_u32(head_dim));
    if (s.head_dim) {
      w.set(a + "attention.key_length", Value::of_u32(head_dim));
      w.set(a + "attention.value_length", Value::of_u32(head_dim));
    }
    if (s.swa_window > 0) {
      w.set(a + "attention.sliding_window", Value::of_u32(s.swa_window));
      if (s.swa_pattern > 0) w.set(a + "attention.sliding_window_pattern", Value::of_u32(s.swa_pattern));
    }
    if (s.rope_theta_swa > 0) w.set(a + "rope.freq_base_swa", Value::of_f32(s.rope_theta_swa));
    if (s.rope_linear > 0) {
      w.set(a + "rope.scaling.type", Value::of_string("linear"));
      w.set(a + "rope.scaling.factor", Value::of_f32(s.rope_linear));
    }
    if (s.longrope_orig_ctx) {
      const double orig = s.longrope_orig_ctx, scale = s.n_ctx / orig;
      w.set(a + "rope.scaling.attn_factor", Value::of_f32(float(std::sqrt(1 + std::log(scale) / std::log(orig)))));
      w.set(a + "rope.scaling.original_context_length", Value::of_u32(s.longrope_orig_ctx));
    }
    if (s.rope_yarn > 0) {
      w.set(a + "rope.scaling.type", Value::of_string("yarn"));
      w.set(a + "rope.scaling.factor", Value::of_f32(s.rope_yarn));
      w.set(a + "rope.scaling.original_context_length", Value::of_u32(s.rope_yarn_orig_ctx));
      w.set(a + "rope.scaling.yarn_beta_fast", Value::of_f32(32.0f));
      w.set(a + "rope.scaling.yarn_beta_slow", Value::of_f32(1.0f));
    }
    if (s.attn_softcap > 0) w.set(a + "attn_logit_softcapping", Value::of_f32(s.attn_softcap));
    if (s.final_softcap > 0) w.set(a + "final_logit_softcapping", Value::of_f32(s.final_softcap));
    if (granite) w.set(a + "rope.scaling.finetuned", Value::of_bool(!s.nope));
    for (const auto& [key, v] : {std::pair{"embedding_scale", s.embedding_scale}, {"residual_scale", s.residual_scale},
                                 {"attention.scale", s.attention_scale}, {"logit_scale", s.logit_scale}})
      if (v > 0) w.set(a + key, Value::of_f32(v));
  }
  w.set(a + "vocab_size", Value::of_u32((uint32_t)n_vocab));
  write_tokenizer(w);
  if (!s.tokenizer_pre.empty()) w.set("tokenizer.ggml.pre", Value::of_string(s.tokenizer_pre));
  if (s.add_eos_token) w.set("tokenizer.ggml.add_eos_token", Value::of_bool(true));

  const double half_width = o.weight_std * std::sqrt(3.0);  // uniform(-a, a) has std a/sqrt(3)
  const double residual_half_width = o.residual_std > 0 ? o.residual_std * std::sqrt(3.0) : half_width;
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const bool writes_residual =
        name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight") || name.ends_with("ssm_out.weight");
    // The converter keeps BERT's token types F32 whatever the file type (llama.cpp adds
    // the row to F32 activations and has no F32 + F16 add).
    const TensorType type = name == "token_types.weight" ? TensorType::F32 : o.type;
    w.add_tensor(name, type, {cols, rows},
                 random_tensor(type, rows * cols, 0.0, writes_residual ? residual_half_width : half_width,
                               stream_seed(o.seed, name)));
  };
  // [n_experts][rows][cols], as the converter stacks the experts' matrices.
  auto experts = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const bool writes_residual = name.ends_with("ffn_down_exps.weight");
    const double gate_up_half_width = s.expert_gate_up_std > 0 ? s.expert_gate_up_std * std::sqrt(3.0) : half_width;
    w.add_tensor(name, o.type, {cols, rows, s.n_experts},
                 random_tensor(o.type, rows * cols * s.n_experts, 0.0,
                               writes_residual ? residual_half_width : gate_up_half_width, stream_seed(o.seed, name)));
  };
  // gpt-oss: [n_experts][n] biases (F32, as a converter keeps every bias), and one sink
  // logit per head, uniform in [-1, 3]: of the order of the attention scores, so that
  // they take a visible share of each softmax.
  auto expert_bias = [&](const std::string& name, uint64_t n) {
    w.add_tensor(name, TensorType::F32, {n, s.n_experts},
                 random_tensor(TensorType::F32, n * s.n_experts, 0.0, half_width, stream_seed(o.seed, name)));
  };
  auto sinks = [&](const std::string& name) {
    w.add_tensor(name, TensorType::F32, {s.n_heads}, random_tensor(TensorType::F32, s.n_heads, 1.0, 2.0, stream_seed(o.seed, name)));
  };
  auto norm = [&](const std::string& name, uint64_t n = 0) {
    n = n ? n : s.dim;
    w.add_tensor(name, TensorType::F32, {n}, random_tensor(TensorType::F32, n, 1.0, o.norm_jitter, stream_seed(o.seed, name)));
  };
  auto norm_bias = [&](const std::string& name, uint64_t n) {
    w.add_tensor(name, TensorType::F32, {n}, random_tensor(TensorType::F32, n, 0.0, half_width, stream_seed(o.seed, name)));
  };
  auto bias = [&](const std::string& name, uint64_t n) {
    if (s.biases) norm_bias(name, n);
  };

  const uint64_t dim = s.dim, q_dim = uint64_t(s.n_heads) * head_dim,
                 kv_dim = uint64_t(s.n_kv_heads) * head_dim, ffn = s.ffn_dim;
  const bool gemma = is_gemma(s.arch), phi3 = s.arch == "phi3", gpt_oss = s.arch == "gpt-oss";
  const bool qk_norm = s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3", post_norms = s.arch == "gemma2" || s.arch == "gemma3";
  matrix("token_embd.weight", n_vocab, dim);
  if (bert) {
    write_encoder(o, matrix, norm, bias, norm_bias);
    return w;
  }
  norm("output_norm.weight");
  if (mpt) bias("output_norm.bias", dim);
  if (!o.tie_output && !gemma) matrix("output.weight", n_vocab, dim);
  if (s.rope_freqs_orig_ctx)
    add_f32_tensor(w, "rope_freqs.weight", llama3_freq_factors(head_dim, s.rope_theta, s.rope_freqs_orig_ctx));
  if (s.longrope_orig_ctx) {
    add_f32_tensor(w, "rope_factors_long.weight", longrope_factors(head_dim, true));
    add_f32_tensor(w, "rope_factors_short.weight", longrope_factors(head_dim, false));
  }
  // F32 [rows][cols] uniform in [lo, hi): the mixer's per-channel tensors, always F32.
  auto f32_uniform = [&](const std::string& name, std::vector<uint64_t> dims, double lo, double hi) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    w.add_tensor(name, TensorType::F32, std::move(dims),
                 random_tensor(TensorType::F32, n, (lo + hi) / 2, (hi - lo) / 2, stream_seed(o.seed, name)));
  };
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    if (s.arch == "mamba2" || (granite && !attends(l))) {
      const uint64_t d_inner = 2 * dim, heads = d_inner / s.ssm_head_dim, conv_dim = d_inner + 2 * s.ssm_n_groups * s.ssm_d_state;
      norm(b + "attn_norm.weight");
      matrix(b + "ssm_in.weight", d_inner + conv_dim + heads, dim);  // z, xBC, dt
      // nn.Conv1d's own init, bound 1/sqrt(fan_in = d_conv) = 0.5 (weights and bias).
      f32_uniform(b + "ssm_conv1d.weight", {s.ssm_d_conv, conv_dim}, -0.5, 0.5);
      f32_uniform(b + "ssm_conv1d.bias", {conv_dim}, -0.5, 0.5);
      // A = -exp(A_log), A in [1, 16) as Mamba-2 draws it; dt's bias makes dt =
      // softplus(. + bias) range from ~0.02 (a state that remembers) to ~1.3 (one that
      // forgets at once), wider than Mamba-2's 0.001-0.1 so that both show in a short prompt.
      f32_uniform(b + "ssm_a", {1, heads}, -16.0, -1.0);
      f32_uniform(b + "ssm_dt.bias", {heads}, -4.0, 1.0);
      f32_uniform(b + "ssm_d", {1, heads}, 1.0 - o.norm_jitter, 1.0 + o.norm_jitter);
      f32_uniform(b + "ssm_norm.weight", {d_inner / s.ssm_n_groups, s.ssm_n_groups}, 1.0 - o.norm_jitter, 1.0 + o.norm_jitter);
      matrix(b + "ssm_out.weight", dim, d_inner);
      if (!granite) continue;  // Mamba-2: the mixer is the whole block
    }
    if (mpt) {
      norm(b + "attn_norm.weight");
      bias(b + "attn_norm.bias", dim);
      matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, dim);
      bias(b + "attn_qkv.bias", q_dim + 2 * kv_dim);
      if (s.qk_norm) {
        norm(b + "attn_q_norm.weight", q_dim);
        bias(b + "attn_q_norm.bias", q_dim);
        norm(b + "attn_k_norm.weight", kv_dim);
        bias(b + "attn_k_norm.bias", kv_dim);
      }
      matrix(b + "attn_output.weight", dim, q_dim);
      bias(b + "attn_output.bias", dim);
      norm(b + "ffn_norm.weight");
      bias(b + "ffn_norm.bias", dim);
      matrix(b + "ffn_up.weight", ffn, dim);
      bias(b + "ffn_up.bias", ffn);
      matrix(b + "ffn_down.weight", dim, ffn);
      bias(b + "ffn_down.bias", dim);
      continue;
    }
    if (!granite || attends(l)) {
      norm(b + "attn_norm.weight");
      if (phi3) {
        matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, dim);
      } else {
        matrix(b + "attn_q.weight", q_dim, dim);
        bias(b + "attn_q.bias", q_dim);
        matrix(b + "attn_k.weight", kv_dim, dim);
        bias(b + "attn_k.bias", kv_dim);
        matrix(b + "attn_v.weight", kv_dim, dim);
        bias(b + "attn_v.bias", kv_dim);
      }
      if (qk_norm) {
        norm(b + "attn_q_norm.weight", head_dim);
        norm(b + "attn_k_norm.weight", head_dim);
      }
      matrix(b + "attn_output.weight", dim, q_dim);
      if (gpt_oss) {
        bias(b + "attn_output.bias", dim);
        sinks(b + "attn_sinks.weight");
      }
      if (post_norms) norm(b + "post_attention_norm.weight");
    }
    norm(b + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"));  // gpt-oss: the norm before the FFN
    if (s.n_experts) {
      matrix(b + "ffn_gate_inp.weight", s.n_experts, dim);
      experts(b + "ffn_gate_exps.weight", s.expert_ffn_dim, dim);
      experts(b + "ffn_up_exps.weight", s.expert_ffn_dim, dim);
      experts(b + "ffn_down_exps.weight", dim, s.expert_ffn_dim);
      if (gpt_oss) {
        bias(b + "ffn_gate_inp.bias", s.n_experts);
        expert_bias(b + "ffn_gate_exps.bias", s.expert_ffn_dim);
        expert_bias(b + "ffn_up_exps.bias", s.expert_ffn_dim);
        expert_bias(b + "ffn_down_exps.bias", dim);
      }
      if (s.shared_expert_ffn_dim) {
        matrix(b + "ffn_gate_shexp.weight", s.shared_expert_ffn_dim, dim);
        matrix(b + "ffn_up_shexp.weight", s.shared_expert_ffn_dim, dim);
        matrix(b + "ffn_down_shexp.weight", dim, s.shared_expert_ffn_dim);
      }
      continue;
    }
    if (phi3) {
      matrix(b + "ffn_up.weight", 2 * ffn, dim);  // gate rows, then up rows
    } else {
      matrix(b + "ffn_gate.weight", ffn, dim);
      matrix(b + "ffn_up.weight", ffn, dim);
    }
    matrix(b + "ffn_down.weight", dim, ffn);
    if (post_norms) norm(b + "post_ffw_norm.weight");
  }
  return w;
}

}  // namespace

GenerateOptions peaky_options(const std::string& shape, uint64_t seed, bool tie_output) {
  const std::optional<ModelShape> s = find_shape(shape);
  if (!s) throw Error("unknown model shape '" + shape + "'");
  GenerateOptions o;
  o.shape = *s;
  o.type = TensorType::F32;
  o.seed = seed;
  o.weight_std = 0.1;
  o.norm_jitter = 0.3;
  o.tie_output = tie_output;
  return o;
}

gguf::Writer build_model(const GenerateOptions& o, const gguf::File& vocab) {
  const gguf::Value* tokens = vocab.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf::ValueType::ARRAY || tokens->size() == 0)
    throw Error(vocab.path() + ": no tokenizer.ggml.tokens to take the vocabulary from");
  return build(o, tokens->size(), [&](gguf::Writer& w) {
    for (const auto& [key, value] : vocab.metadata())
      if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  });
}

gguf::Writer build_model(const GenerateOptions& o, const Vocab& vocab) {
  if (vocab.tokens.empty()) throw Error("the vocabulary has no tokens");
  // A file whose tokenizer would split text otherwise than its source is refused.
  if (vocab.model == "gpt2" && vocab.pre == "tokenizer.json" && o.shape.tokenizer_pre.empty())
    throw Error("the tokenizer.json's pre-tokenizer has no tokenizer.ggml.pre name (known: " +
                Pretokenizer::supported_ggml_pre() + ")");
  if (vocab.model == "llama" && vocab.scores.empty()) {
    if (vocab.merges.empty())
      throw Error("a SentencePiece vocabulary without scores or merges: give the model's tokenizer.model");
    // A tokenizer.json's SentencePiece-style BPE (Gemma's): scores from its merge ranks.
    const Vocab spm = spm_vocab_from_merges(vocab, "the tokenizer.json");
    return build(o, spm.tokens.size(), [&](gguf::Writer& w) { write_vocab_gguf(w, spm); });
  }
  return build(o, vocab.tokens.size(), [&](gguf::Writer& w) { write_vocab_gguf(w, vocab); });
}

}  // namespace kiln::gen
