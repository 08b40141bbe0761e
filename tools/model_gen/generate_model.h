#pragma once
// GGUF files of every family kiln runs (llama, qwen2, qwen3, qwen3moe, gemma, gemma2,
// gemma3, phi3, mpt, gpt-oss, mamba2, granitehybrid, bert) with seeded random weights of a real model's shape: the benchmark stand-in for
// models we cannot ship, tiny models tests build on the fly, and the files llama.cpp's
// reference logits were computed on (tests/data/families).
// Used by tools/kiln-gen.cpp and tests (library kiln_model_gen, outside the engine); the numbers are noise, the shapes and the file
// layout are exactly what a converted checkpoint of that shape would have.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/tensor_type.h"
#include "kiln/tokenizer.h"

namespace kiln::gen {

struct ModelShape {
  std::string name;
  uint32_t dim = 0;         // embedding_length
  uint32_t n_layers = 0;    // block_count
  uint32_t n_heads = 0;     // attention.head_count
  uint32_t n_kv_heads = 0;  // attention.head_count_kv
  uint32_t ffn_dim = 0;     // feed_forward_length
  uint32_t n_ctx = 0;       // context_length
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;         // of every norm (RMSNorm, or MPT's LayerNorm)
  std::string arch = "llama";    // general.architecture: the family whose layout is written
  // MPT only.
  float max_alibi_bias = 0.0f;   // attention.max_alibi_bias
  float clamp_kqv = 0.0f;        // attention.clamp_kqv (0: not written)
  // mpt: every optional bias (norms, QKV, attention output, FFN); qwen2: the Q/K/V biases.
  bool biases = false;
  bool qk_norm = false;          // mpt: attn_q_norm / attn_k_norm (LayerNorms over Q and K)
  // RoPE families: attention.sliding_window (0: not written) and, when not 0,
  // attention.sliding_window_pattern (every Nth layer global).
  uint32_t swa_window = 0;
  uint32_t swa_pattern = 0;
  // RoPE families.
  uint32_t head_dim = 0;         // attention.key_length/value_length when not 0 (else dim / n_heads)
  float attn_softcap = 0.0f;     // gemma2: attn_logit_softcapping (0: not written)
  float final_softcap = 0.0f;    // gemma2/3: final_logit_softcapping (0: not written)
  float rope_theta_swa = 0.0f;   // rope.freq_base_swa (0: not written)
  float rope_linear = 0.0f;      // rope.scaling.type linear with this factor (0: not written)
  // When not 0: rope_freqs.weight with Llama 3.1's rule (factor 8, low/high frequency
  // factors 1 and 4) for this original context (Llama 3.1: 8192).
  uint32_t rope_freqs_orig_ctx = 0;
  // phi3, when not 0: LongRoPE as Phi-3 128k's converter writes it, for this original
  // context (rope.scaling.original_context_length; Phi-3: 4096, context_length 131072):
  // rope_factors_short/long.weight and rope.scaling.attn_factor
  // sqrt(1 + ln(context_length / original) / ln(original)).
  uint32_t longrope_orig_ctx = 0;
  // Mixture of experts (qwen3moe): expert_count, expert_used_count and
  // expert_feed_forward_length; each block's FFN is ffn_gate_inp and the 3-D
  // ffn_{gate,up,down}_exps instead of the dense matrices. 0: dense.
  uint32_t n_experts = 0, n_experts_used = 0, expert_ffn_dim = 0;
  // When not 0: rope.scaling.type yarn with this factor, for this original context
  // (rope.scaling.original_context_length), and the beta keys a converter writes (32, 1).
  float rope_yarn = 0.0f;
  uint32_t rope_yarn_orig_ctx = 0;
  // gpt-oss: standard deviation of the experts' gate and up matrices (0: weight_std), so
  // that a test's activations reach the clamped SwiGLU's limit.
  float expert_gate_up_std = 0.0f;
  // When not empty: tokenizer.ggml.pre, whatever the vocabulary's source says (gpt-oss's
  // converter writes "gpt-4o", the name of o200k's split, for every gpt-oss file).
  std::string tokenizer_pre = "";
  // mamba2: Mamba-2 blocks (no attention, no FFN; n_heads, n_kv_heads and ffn_dim 0, as
  // the converter writes them). d_inner = 2 * dim (Mamba-2's expand), ssm heads of
  // ssm_head_dim, B and C shared by ssm_n_groups groups of heads.
  uint32_t ssm_d_state = 0, ssm_head_dim = 0, ssm_n_groups = 0, ssm_d_conv = 4;
  // granitehybrid: the layers that attend (those past --layers are dropped with their
  // blocks); the others are Mamba-2 layers of the ssm_*
  // shape above. Every block has an FFN: experts when n_experts (their width is ffn_dim,
  // as the converter writes it) with a shared expert of shared_expert_ffn_dim, else dense.
  // Granite's multipliers (0: not written); nope: rope.scaling.finetuned false.
  std::vector<uint32_t> attn_layers = {};
  uint32_t shared_expert_ffn_dim = 0;
  float embedding_scale = 0.0f, residual_scale = 0.0f, attention_scale = 0.0f, logit_scale = 0.0f;
  bool nope = false;
  // <arch>.pooling_type when >= 0 (1 mean, 2 cls, 3 last): an embedding model's.
  int32_t pooling_type = -1;
  // tokenizer.ggml.add_eos_token true whatever the vocabulary's source says: decoder
  // embedders (Qwen3-Embedding) end every text with EOS, whose hidden state is pooled.
  bool add_eos_token = false;
};

// The named shapes ("tinyllama-1.1b", "stories260k-shape", "tiny", "mpt-7b", "mpt-tiny",
// and a tiny one per family: "qwen2-tiny", "llama3-tiny", ...); nullopt if unknown.
std::optional<ModelShape> find_shape(const std::string& name);
std::vector<std::string> shape_names();

struct GenerateOptions {
  ModelShape shape;
  TensorType type = TensorType::F16;  // of the 2-D weights; norm weights are always F32
  uint64_t seed = 1;
  // Weights are uniform with this standard deviation: 0.02 is the usual init scale of
  // Llama-family checkpoints, small enough that the residual stream stays well-behaved.
  double weight_std = 0.02;
  // Norm weights are 1 + uniform(-norm_jitter, norm_jitter); 0 gives the 1.0 of a fresh
  // model. Tests use a jitter so that a runtime ignoring the norm weights is caught.
  // Biases (shape.biases) are uniform with weight_std, around 0.
  double norm_jitter = 0.0;
  // Standard deviation of the matrices that write into the residual stream (attn_output,
  // ffn_down); <= 0: weight_std. GPT-2's init scales them down with depth; a small value
  // makes each block a small correction, so a file of the first few blocks (same seed,
  // fewer --layers) predicts much as the whole model does: a self-speculative draft pair.
  double residual_std = 0.0;
  bool tie_output = false;  // omit output.weight (the runtime then reuses token_embd); Gemma always does
};

// What the family tests build on: a named shape with F32 weights, matrices of std 0.1 and
// norm weights 1 +- 0.3 (large enough that an error in any part moves the logits), seeded.
// Throws kiln::Error for an unknown shape.
GenerateOptions peaky_options(const std::string& shape, uint64_t seed, bool tie_output = false);

// Builds the file in memory: <arch>.* hyperparameters from the shape, every tokenizer.*
// key copied from `vocab` (whose token list fixes n_vocab), random weights. Each tensor
// gets its own stream derived from (seed, tensor name), so a tensor's values do not
// depend on the order or number of the others (--layers 1 is a prefix of the full model).
// Throws kiln::Error for a bad shape, type or vocabulary.
gguf::Writer build_model(const GenerateOptions& options, const gguf::File& vocab);
// The same with the tokenizer.* keys of `vocab` (write_vocab_gguf): a vocabulary read
// from a tokenizer.json or tokenizer.model file; a tokenizer.json's SentencePiece-style
// BPE (Gemma's) gets scores from its merges (spm_vocab_from_merges). One a GGUF cannot
// state (a split with no tokenizer.ggml.pre name, merges that scores cannot restate)
// throws kiln::Error.
gguf::Writer build_model(const GenerateOptions& options, const Vocab& vocab);

}  // namespace kiln::gen
