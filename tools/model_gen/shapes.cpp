// The named shapes kiln-gen writes and the tests build on (find_shape, shape_names in
// generate_model.h): real models' shapes for benchmarks, and a tiny one per family whose
// distinguishing parts a short prompt exercises.
#include "model_gen/generate_model.h"

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
    // For the i-quant tests: every matrix row a whole 256-value super-block (dim and FFN
    // multiples of 256), so llama-quantize's i-quant presets need no fallback type.
    {"iquant-tiny", 256, 2, 4, 2, 768, 256, 10000.0f, 1e-5f},
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
    // Qwen3-Embedding's kind: qwen3-tiny with pooling_type 3 (the last token's hidden
    // state after the output norm) and every text ending with EOS.
    {.name = "qwen3-embedding-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 160,
     .n_ctx = 256, .rope_theta = 1e6f, .rms_eps = 1e-6f, .arch = "qwen3", .head_dim = 32, .pooling_type = 3,
     .add_eos_token = true},
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
    // Granite 4.0-H-Tiny's layout (40 layers of width 1536, attention on 4 of them with 12
    // query heads over 4 and no positional encoding, Mamba-2 with d_state 128 and heads of
    // 64 in one group, 64 experts of 512 with 6 used plus a shared one of 1024; multipliers
    // embedding 12, residual 0.22, attention 1/128, logits / 6) at the tiny width: 5
    // layers, attention on 1 and 4, 8 experts of 32 with 2 used and a shared one of 64.
    // The attention multiplier is 0.5 (against a default 1/sqrt(16) = 0.25) so that the
    // scores matter at --weight-std 0.1, and the logit divisor 3.
    {.name = "granitehybrid-tiny", .dim = 64, .n_layers = 5, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 32,
     .n_ctx = 1u << 20, .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "granitehybrid", .n_experts = 8,
     .n_experts_used = 2, .expert_ffn_dim = 32, .ssm_d_state = 16, .ssm_head_dim = 16, .ssm_n_groups = 1,
     .attn_layers = {1, 4}, .shared_expert_ffn_dim = 64, .embedding_scale = 12.0f, .residual_scale = 0.22f,
     .attention_scale = 0.5f, .logit_scale = 3.0f, .nope = true},
    // Granite 4.0-H-Micro's kind: the same hybrid with a dense SwiGLU FFN (no experts).
    {.name = "granitehybrid-dense-tiny", .dim = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 1, .ffn_dim = 96,
     .n_ctx = 1u << 20, .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "granitehybrid", .ssm_d_state = 16,
     .ssm_head_dim = 16, .ssm_n_groups = 2, .attn_layers = {2}, .embedding_scale = 12.0f, .residual_scale = 0.22f,
     .attention_scale = 0.5f, .logit_scale = 3.0f, .nope = true},
    // For benchmarks: Granite 4.0-H-Tiny at width 1024 and 24 layers (attention on every
    // sixth: 5, 11, 17, 23), 32 experts of 512 with 6 used and a shared one of 1024:
    // ~1.4B weights besides the embeddings, ~0.44B of them read per token.
    {.name = "granitehybrid-1.4b-a0.4b", .dim = 1024, .n_layers = 24, .n_heads = 8, .n_kv_heads = 2, .ffn_dim = 512,
     .n_ctx = 1u << 20, .rope_theta = 10000.0f, .rms_eps = 1e-5f, .arch = "granitehybrid", .n_experts = 32,
     .n_experts_used = 6, .expert_ffn_dim = 512, .ssm_d_state = 128, .ssm_head_dim = 64, .ssm_n_groups = 1,
     .attn_layers = {5, 11, 17, 23}, .shared_expert_ffn_dim = 1024, .embedding_scale = 12.0f,
     .residual_scale = 0.22f, .attention_scale = 0.0078125f, .logit_scale = 6.0f, .nope = true},
    // BERT (bge-small-en's layout: post-norm blocks, learned positions, token types, GELU,
    // every bias, non-causal attention, CLS pooling, LayerNorm eps 1e-12) at the tiny width.
    {.name = "bert-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 160, .n_ctx = 512,
     .rms_eps = 1e-12f, .arch = "bert", .biases = true, .pooling_type = 2},
    // For benchmarks: bge-small-en-v1.5's shape (33M weights; with the BGE vocabulary).
    {.name = "bge-small", .dim = 384, .n_layers = 12, .n_heads = 12, .n_kv_heads = 12, .ffn_dim = 1536, .n_ctx = 512,
     .rms_eps = 1e-12f, .arch = "bert", .biases = true, .pooling_type = 2},
    // nomic-embed-text v1.5's layout (rotary positions with base 1000, fused QKV, SwiGLU,
    // no biases but the LayerNorms', mean pooling) at the tiny width.
    {.name = "nomic-bert-tiny", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 160,
     .n_ctx = 2048, .rope_theta = 1000.0f, .rms_eps = 1e-12f, .arch = "nomic-bert", .pooling_type = 1},
};

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

}  // namespace kiln::gen
