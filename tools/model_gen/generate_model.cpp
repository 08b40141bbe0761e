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

const ModelShape kShapes[] = {
    // TinyLlama-1.1B (Llama-2 architecture, GQA 32:4).
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048, 10000.0f, 1e-5f},
    // Karpathy's stories260K: the shape of the default test model, with noise weights.
    {"stories260k-shape", 64, 5, 8, 4, 172, 512, 10000.0f, 1e-5f},
    // For tests: GQA 4:2, head size 18 and FFN 140 so that no SIMD width divides the
    // row lengths and every kernel's tail path runs.
    {"tiny", 72, 2, 4, 2, 140, 256, 10000.0f, 1e-5f},
    // MPT-7B (ALiBi, fused QKV, LayerNorm and GELU MLP without biases, tied output).
    {"mpt-7b", 4096, 32, 32, 32, 16384, 2048, 10000.0f, 1e-5f, "mpt", 8.0f, 0.0f, false, false},
    // For tests: an MPT with every optional bias and clamp_kqv (kiln-gen --qk-norm adds
    // qk_ln), 6 heads so that ALiBi's slopes for a head count that is not a power of two
    // (m1) are used, head size 12 and FFN 260 for SIMD tails. clamp_kqv 1.0 cuts ~20% of
    // the Q/K/V values at --weight-std 0.1.
    {"mpt-tiny", 72, 3, 6, 6, 260, 128, 10000.0f, 1e-5f, "mpt", 8.0f, 1.0f, true, false},
    // One tiny model per family for the llama.cpp references in tests/data/families: each
    // has its family's distinguishing parts, GQA, and a head size no SIMD width divides or
    // one that differs from dim / heads. Real hyperparameters where they are structural
    // (RoPE bases, eps); windows and soft-caps small enough to act on a 24-token prompt at
    // --weight-std 0.1.
    // Qwen2: Q/K/V biases, RoPE halves, base 1e6.
    {.name = "qwen2-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "qwen2", .biases = true},
    // Qwen3: per-head Q/K RMSNorm, heads x head size (4 x 32) wider than dim.
    {.name = "qwen3-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "qwen3", .head_dim = 32},
    // Qwen3-30B-A3B's layout (128 experts, 8 used, expert width 768 of a 2048 model)
    // scaled down: 8 experts, 2 used, width 48.
    // Mixtral 8x7B's layout (a llama file with 8 experts, 2 used) at the tiny width.
    {.name = "mixtral-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-5f, .arch = "llama", .n_experts = 8, .n_experts_used = 2, .expert_ffn_dim = 160},
    // Qwen3-30B-A3B's layout at ~1.3B weights with about its share of them active per
    // token: 128 experts, 8 used (6% of the expert weights), head size 128, GQA 16:4.
    {.name = "qwen3moe-1.3b-a0.16b", .dim = 1024, .n_layers = 12, .n_heads = 16, .n_kv_heads = 4, .ffn_dim = 3072,
     .n_ctx = 4096, .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "qwen3moe", .head_dim = 128, .n_experts = 128,
     .n_experts_used = 8, .expert_ffn_dim = 256},
    {.name = "qwen3moe-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "qwen3moe", .head_dim = 32, .n_experts = 8, .n_experts_used = 2,
     .expert_ffn_dim = 48},
    // gpt-oss-20b's layout (24 layers of width 2880, 64 query heads of 64 over 8 KV heads,
    // 32 experts of width 2880 with 4 used, window 128 on even layers, base 150000, YaRN x32
    // of 4096) at the tiny width: head size 32 on 4 heads over 2, 8 experts of 64 with 2
    // used, window 6 (the prompts are longer), YaRN x32 of an original context of 64 so
    // that its ramp acts within the prompt. The experts' gate and up matrices have std 0.5
    // so that the SwiGLU's clamp at 7 cuts some activations.
    {.name = "gpt-oss-tiny", .dim = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 64, .n_ctx = 2048,
     .rope_theta = 150000.0f, .rms_eps = 1e-5f, .arch = "gpt-oss", .biases = true, .swa_window = 6, .head_dim = 32,
     .n_experts = 8, .n_experts_used = 2, .expert_ffn_dim = 64, .rope_yarn = 32.0f, .rope_yarn_orig_ctx = 64,
     .expert_gate_up_std = 0.5f, .tokenizer_pre = "gpt-4o"},
    // gpt-oss-20b scaled to ~1.2B weights besides the embeddings, with its share active (4
    // of 32 experts: 12.5% of the expert weights, 0.18B of the block weights a token): width
    // 1024, 12 layers, 16 query heads of 64 over 2 (8:1 as the real model), window 128,
    // YaRN x32 of 128 in a context of 4096. For benchmarks; no test runs it.
    {.name = "gpt-oss-1.2b-a0.2b", .dim = 1024, .n_layers = 12, .n_heads = 16, .n_kv_heads = 2, .ffn_dim = 1024,
     .n_ctx = 4096, .rope_theta = 150000.0f, .rms_eps = 1e-5f, .arch = "gpt-oss", .biases = true, .swa_window = 128,
     .head_dim = 64, .n_experts = 32, .n_experts_used = 4, .expert_ffn_dim = 1024, .rope_yarn = 32.0f,
     .rope_yarn_orig_ctx = 128, .tokenizer_pre = "gpt-4o"},
    // Llama 3.1: base 500000, rope_freqs.weight (kiln-gen --tied for Llama 3.2's tied
    // output). The factors are computed for an original context of 64 instead of 8192, so
    // that they act on pairs that turn noticeably within a short prompt.
    {.name = "llama3-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 192, .n_ctx = 256,
     .rope_theta = 500000.0f, .rms_eps = 1e-5f, .arch = "llama", .rope_freqs_orig_ctx = 64},
    // Mistral 7B v0.1: a Llama with GQA 4:1 and attention.sliding_window on every layer.
    // llama.cpp's llama architecture ignores the window, so it is wider than the 40
    // positions the reference covers: the two agree only where the window masks nothing.
    {.name = "mistral-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "llama", .swa_window = 48},
    // Gemma: GeGLU, embeddings x sqrt(dim), multi-query attention, head size 32 (dim 64 / 4 heads is 16).
    {.name = "gemma-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 10000.0f, .rms_eps = 1e-6f, .arch = "gemma", .head_dim = 32},
    // Gemma 2: post-norms, window 6 on every other layer, attention and final soft-caps.
    {.name = "gemma2-tiny", .dim = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 10000.0f, .rms_eps = 1e-6f, .arch = "gemma2", .swa_window = 6, .swa_pattern = 2, .head_dim = 32,
     .attn_softcap = 1.5f, .final_softcap = 3.0f},
    // Gemma 3: per-head Q/K norms, post-norms, window 6 with every 3rd layer global, local
    // RoPE base 10000 unscaled, global 1e6 with linear scaling x8.
    {.name = "gemma3-tiny", .dim = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "gemma3", .swa_window = 6, .swa_pattern = 3, .head_dim = 32,
     .rope_theta_swa = 10000.0f, .rope_linear = 8.0f},
    // Phi-3: fused QKV and gate/up, RoPE halves, GQA (as Phi-3 medium), untied output.
    {.name = "phi3-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160, .n_ctx = 256,
     .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "phi3"},
    // Phi-3 128k: phi3-tiny with LongRoPE for an original context of 256 in 2048 (x8; the
    // real x32 of 4096 in 131072 would make a test's contexts large), so that llama.cpp,
    // which rounds contexts up to multiples of 256, runs it with either set of factors.
    {.name = "phi3-128k-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160,
     .n_ctx = 2048, .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "phi3", .longrope_orig_ctx = 256},
    // Mamba-2 (state-spaces/mamba2-*: d_state 128, heads of 64, one group, conv 4, expand
    // 2; the converter's context_length 2^20). The tiny one: 8 heads of 16 in 2 groups,
    // d_state 16, 3 layers. The ~1B one is mamba2-1.3b (width 2048, 64 heads) with 36 of
    // its 48 layers.
    {.name = "mamba2-tiny", .dim = 64, .n_layers = 3, .n_ctx = 1u << 20, .rms_eps = 1e-5f, .arch = "mamba2",
     .ssm_d_state = 16, .ssm_head_dim = 16, .ssm_n_groups = 2},
    {.name = "mamba2-1b", .dim = 2048, .n_layers = 36, .n_ctx = 1u << 20, .rms_eps = 1e-5f, .arch = "mamba2",
     .ssm_d_state = 128, .ssm_head_dim = 64, .ssm_n_groups = 1},
};

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
  if (s.arch == "mamba2") {
    if (!s.dim || !s.n_layers || !s.n_ctx || !s.ssm_d_state || !s.ssm_head_dim || !s.ssm_n_groups || !s.ssm_d_conv)
      bad("every dimension must be positive");
    if ((2 * s.dim) % s.ssm_head_dim || (2 * s.dim / s.ssm_head_dim) % s.ssm_n_groups)
      bad("the heads (2 * dim / ssm_head_dim) must split into ssm_n_groups groups");
    return;
  }
  if (!s.dim || !s.n_layers || !s.n_heads || !s.n_kv_heads || !s.ffn_dim || !s.n_ctx)
    bad("every dimension must be positive");
  if (s.dim % s.n_heads) bad("dim " + std::to_string(s.dim) + " is not a multiple of n_heads");
  if (s.n_heads % s.n_kv_heads) bad("n_heads is not a multiple of n_kv_heads");
  if (!rope_family(s.arch) && s.arch != "mpt") bad("unknown architecture '" + s.arch + "'");  // mamba2: above
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

}  // namespace

std::optional<ModelShape> find_shape(const std::string& name) {
  for (const ModelShape& s : kShapes)
    if (s.name == name) return s;
  return std::nullopt;
}

std::vector<std::string> shape_names() {
  std::vector<std::string> names;
  for (const ModelShape& s : kShapes) names.push_back(s.name);
  return names;
}

namespace {

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
  const bool mpt = s.arch == "mpt";
  w.set("general.architecture", Value::of_string(s.arch));
  w.set("general.name", Value::of_string(s.name + " (random weights, seed " + std::to_string(o.seed) + ")"));
  w.set("general.file_type", Value::of_u32(file_type_of(o.type)));
  const uint32_t head_dim = head_dim_of(s);
  w.set(a + "context_length", Value::of_u32(s.n_ctx));
  w.set(a + "embedding_length", Value::of_u32(s.dim));
  w.set(a + "block_count", Value::of_u32(s.n_layers));
  w.set(a + "feed_forward_length", Value::of_u32(s.ffn_dim));
  w.set(a + "attention.head_count", Value::of_u32(s.n_heads));
  if (s.arch == "mamba2") {
    w.set(a + "ssm.conv_kernel", Value::of_u32(s.ssm_d_conv));
    w.set(a + "ssm.inner_size", Value::of_u32(2 * s.dim));
    w.set(a + "ssm.state_size", Value::of_u32(s.ssm_d_state));
    w.set(a + "ssm.time_step_rank", Value::of_u32(2 * s.dim / s.ssm_head_dim));
    w.set(a + "ssm.group_count", Value::of_u32(s.ssm_n_groups));
  } else {
  w.set(a + "attention.head_count_kv", Value::of_u32(s.n_kv_heads));
  }
  if (s.n_experts) {
    w.set(a + "expert_count", Value::of_u32(s.n_experts));
    w.set(a + "expert_used_count", Value::of_u32(s.n_experts_used));
    if (s.arch != "llama") w.set(a + "expert_feed_forward_length", Value::of_u32(s.expert_ffn_dim));  // Mixtral: feed_forward_length
  }
  if (mpt) {
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
  }
  w.set(a + "vocab_size", Value::of_u32((uint32_t)n_vocab));
  write_tokenizer(w);
  if (!s.tokenizer_pre.empty()) w.set("tokenizer.ggml.pre", Value::of_string(s.tokenizer_pre));

  const double half_width = o.weight_std * std::sqrt(3.0);  // uniform(-a, a) has std a/sqrt(3)
  const double residual_half_width = o.residual_std > 0 ? o.residual_std * std::sqrt(3.0) : half_width;
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    const bool writes_residual =
        name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight") || name.ends_with("ssm_out.weight");
    w.add_tensor(name, o.type, {cols, rows},
                 random_tensor(o.type, rows * cols, 0.0, writes_residual ? residual_half_width : half_width,
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
  auto bias = [&](const std::string& name, uint64_t n) {
    if (s.biases)
      w.add_tensor(name, TensorType::F32, {n}, random_tensor(TensorType::F32, n, 0.0, half_width, stream_seed(o.seed, name)));
  };

  const uint64_t dim = s.dim, q_dim = uint64_t(s.n_heads) * head_dim,
                 kv_dim = uint64_t(s.n_kv_heads) * head_dim, ffn = s.ffn_dim;
  const bool gemma = is_gemma(s.arch), phi3 = s.arch == "phi3", gpt_oss = s.arch == "gpt-oss";
  const bool qk_norm = s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3", post_norms = s.arch == "gemma2" || s.arch == "gemma3";
  matrix("token_embd.weight", n_vocab, dim);
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
    if (s.arch == "mamba2") {
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
      continue;
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
