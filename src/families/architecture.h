#pragma once
// The registry of model families. Each family's file (src/families/<arch>.cpp) reads its
// hyperparameters and tensors into the shared ModelConfig / LayerWeights shape; nothing
// else in kiln switches on an architecture's name.
#include <string>
#include <vector>

#include "kiln/model.h"

namespace kiln {

struct Architecture {
  const char* name;  // general.architecture
  void (*load)(Model& model);
};

const Architecture* find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Parts of a fused tensor as views of their own (no copy): rows [r0, r0 + n) of a 2-D
// weight, e.g. Q, K and V of attn_qkv; elements [i0, i0 + n) of a 1-D F32 one (its bias).
WeightView row_range(const WeightView& w, uint64_t r0, uint64_t n);
WeightView element_range(const WeightView& w, uint64_t i0, uint64_t n);

// RoPE metadata (src/families/rope_metadata.cpp; the tables are the runtime's).
// Reads <prefix>rope.scaling.{type,factor,original_context_length,attn_factor} (or the
// older rope.scale_linear) and the rope_freqs.weight tensor into `c`, whose n_rot must be
// set. Throws kiln::Error naming the file and the key or tensor.
void read_rope_scaling(const gguf::File& f, const std::string& prefix, ModelConfig& c);

// Phi-3's LongRoPE: rope_factors_short.weight into c.rope_freq_factors and
// rope_factors_long.weight into c.rope_freq_factors_long (both or neither; not with
// rope_freqs.weight). The attention factor is rope.scaling.attn_factor, which
// read_rope_scaling has read: the converter computes it, llama.cpp reads it as given.
void read_longrope_factors(const gguf::File& f, ModelConfig& c);

// <prefix>attention.sliding_window (a window for every layer) and the optional
// <prefix>attention.sliding_window_pattern into c.swa_window (needs c.n_layers): a number
// N (every Nth layer global, llama.cpp's gemma rule) or an array of per-layer booleans
// (true: sliding). Leaves it empty when the file has no window. The defaults stand for
// absent keys (Gemma 2 slides 4096 on every other layer unless told otherwise; pattern 0:
// every layer). src/families/sliding_window.cpp.
void read_sliding_window(const gguf::File& f, const std::string& prefix, ModelConfig& c, uint32_t default_window = 0,
                         uint32_t default_pattern = 0);
// Layer l of a pattern of N slides unless it is the last of its group of N (N 0: all slide).
inline bool swa_pattern_slides(uint32_t l, uint32_t n) { return n == 0 || l % n < n - 1; }

// Architectures (one line each in src/families/registry.cpp).
void load_llama(Model& model);
void load_mpt(Model& model);
void load_qwen2(Model& model);
void load_qwen3(Model& model);
void load_qwen3moe(Model& model);
void load_gemma(Model& model);
void load_gemma2(Model& model);
void load_gemma3(Model& model);
void load_phi3(Model& model);
void load_gpt_oss(Model& model);
void load_mamba2(Model& model);
void load_granite_hybrid(Model& model);
void load_bert(Model& model);
void load_nomic_bert(Model& model);

// The block shape every family states the same way: <prefix>context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count(_kv).
void read_block_shape(const gguf::File& f, const std::string& prefix, ModelConfig& c);
// Per-layer data is sized before the layers' tensors are looked up: a block count that no
// file could hold tensors for must not reach those allocations (it throws kiln::Error).
void check_layer_count(const gguf::File& f, const ModelConfig& c);
// model.layers sized to block_count, after check_layer_count.
void resize_layers(Model& model);

// Shared by the RoPE families (src/families/transformer.cpp), after read_block_shape:
// attention.layer_norm_rms_epsilon, rope.freq_base, attention.key_length (head size, may
// differ from dim / heads) and value_length, rope.dimension_count, RoPE scaling and
// rope_freqs.weight. Not the sliding window: families differ in what they make of it.
void read_rope_attention(const gguf::File& f, const std::string& prefix, ModelConfig& c);
// token_embd (sets n_vocab; checked against <arch>.vocab_size), output_norm, and
// output.weight, or token_embd for it when the file has none or the family always ties.
void read_embeddings(Model& model, bool always_tied = false);
// Pre-norm blocks: attn_norm; attn_qkv (rows Q, K, V) or attn_q/k/v, each with an optional
// bias; attn_output (+ optional bias); optional attn_sinks; ffn_norm; ffn_gate/ffn_up/ffn_down
// (experts: with optional F32 biases of the router and of each expert's matrices). The options
// add what some families require.
struct BlockOptions {
  bool qk_norm = false;        // attn_q_norm / attn_k_norm, [head_dim]: RMSNorm per head
  bool post_norms = false;     // post_attention_norm / post_ffw_norm on each sublayer's output
  bool fused_gate_up = false;  // ffn_up holds the gate's rows then the up rows; no ffn_gate
  bool experts = false;        // ffn_gate_inp and ffn_{gate,up,down}_exps instead of the dense FFN
  // The name of the norm before the FFN: gpt-oss's converter writes post_attention_norm
  // (the checkpoint's post_attention_layernorm, which is that norm, not a post-norm).
  const char* ffn_norm = "ffn_norm";
};
// <prefix>expert_count, expert_used_count, expert_feed_forward_length (default: the FFN
// width) and expert_weights_norm into `c`; checked (used within count, count bounded).
void read_expert_shape(const gguf::File& f, const std::string& prefix, ModelConfig& c);
void read_blocks(Model& model, const BlockOptions& options);
// The two halves of one such block l, for families whose layers are not all alike (a
// hybrid's attention layers): the attention's tensors (after attn_norm, which the caller
// reads), and ffn_norm with the FFN or experts.
void read_block_attention(const Model& model, uint32_t l, LayerWeights& L, const BlockOptions& options);
void read_block_ffn(const Model& model, uint32_t l, LayerWeights& L, const BlockOptions& options);
// Mamba-2 layers (src/families/mamba2.cpp): <prefix>ssm.{conv_kernel, inner_size,
// state_size, time_step_rank, group_count} into c, checked; and layer l's mixer tensors
// (blk.l.ssm_*) into L. Hybrid families call these for their SSM layers.
void read_ssm_shape(const gguf::File& f, const std::string& prefix, ModelConfig& c);
// <arch>.context_length, embedding_length (not 0) and block_count, which recurrent
// families read without the attention keys read_blocks' families take with them.
void read_trunk_shape(const gguf::File& f, ModelConfig& c);
void read_ssm_layer(const Model& model, uint32_t l, LayerWeights& L);
// BERT-style encoders (src/families/bert.cpp): token (+ type) embeddings LayerNormed,
// post-norm blocks, non-causal attention, no classifier. Positions are learned
// (position_embd, BERT) or rotary (NEOX halves, nomic-bert); the FFN a GELU MLP with
// biases (BERT) or a SwiGLU without (nomic-bert).
struct EncoderOptions {
  bool rope = false;
  bool swiglu = false;
};
void read_bert_encoder(Model& model, const EncoderOptions& options);
// The Gemma family's common part (src/families/gemma.cpp): shape and RoPE (halves), embeddings
// scaled by sqrt(dim), GeGLU, classifier always tied, the blocks with `options`.
void read_gemma(Model& model, const BlockOptions& options);
// The query scale of the 27B models, recognized by their layer count (gemma.cpp says why).
void gemma_query_scale(ModelConfig& c, uint32_t n_layers_27b);

}  // namespace kiln
