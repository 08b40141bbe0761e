#pragma once
// A loaded model: hyperparameters, typed views of the weights (in place in the mmap'd
// GGUF), and its tokenizer. Architectures are data: each file in src/families/ maps one
// family's GGUF keys and tensor names into this one shape, and the runtime reads flags.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/rope.h"
#include "kiln/tensor_type.h"
#include "kiln/tokenizer.h"

namespace kiln {

// A 2-D weight [rows][cols] (cols contiguous) living inside the GGUF mapping, or, when
// `packed`, in the kernels' interleaved layout that Model::load made of it.
struct WeightView {
  const gguf::TensorInfo* info = nullptr;
  TensorType type = TensorType::F32;
  const void* data = nullptr;
  uint64_t rows = 0, cols = 0;
  uint64_t row_bytes = 0;  // of the file layout
  bool packed = false;
  explicit operator bool() const { return data != nullptr; }
};

// Optional tensors (biases, Q/K norms, the gate of a gated FFN) are empty views when a
// family does not have them; a fused QKV matrix is seen as three row ranges wq, wk, wv.
struct LayerWeights {
  WeightView attn_norm, attn_norm_b;  // [dim]; the bias only with LayerNorm
  WeightView wq, wk, wv, wo;     // [n_heads*head_dim][dim], [n_kv*head_dim][dim] x2, [dim][n_heads*head_dim]
  WeightView bq, bk, bv, bo;     // [n_heads*head_dim], [n_kv*head_dim] x2, [dim]
  // Q/K norms: [n_heads*head_dim] / [n_kv*head_dim] normalize a token's whole Q and K row
  // (MPT's qk_ln); [head_dim] each head on its own (Qwen3, Gemma 3). The width says which.
  WeightView q_norm, q_norm_b;
  WeightView k_norm, k_norm_b;
  WeightView attn_post_norm;     // [dim]: norms the attention output before the residual (Gemma 2/3)
  WeightView ffn_norm, ffn_norm_b;  // [dim]
  WeightView w_gate, w_up;       // [ffn][dim]; no gate when ffn is Ffn::gelu
  WeightView b_up;               // [ffn]
  WeightView w_down;             // [dim][ffn]
  WeightView b_down;             // [dim]
  WeightView ffn_post_norm;      // [dim]: norms the FFN output before the residual (Gemma 2/3)
  // Mixture of experts (ModelConfig::n_experts > 0) instead of w_gate/w_up/w_down: the
  // router [n_experts][dim], and each expert's matrices as views into the file's 3-D
  // ffn_{gate,up,down}_exps tensors ([expert_ffn][dim], [dim][expert_ffn]). Experts stay
  // in the file mapping: a token reads only the rows of the experts it is routed to.
  WeightView ffn_gate_inp;
  std::vector<WeightView> gate_exps, up_exps, down_exps;
  // Optional, F32 (gpt-oss): the router's bias [n_experts], and each expert's biases as
  // one 2-D tensor, row e for expert e: [n_experts][expert_ffn] (gate, up), [n_experts][dim] (down).
  WeightView ffn_gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
  // Attention sinks (gpt-oss): one learned logit per query head [n_heads], F32, that joins
  // the denominator of every softmax of that head's attention (a key with no value).
  WeightView attn_sinks;
  // Mamba-2 mixer (Mixer::ssm) instead of attention, in the paper's names: the
  // in-projection [2*d_inner + 2*n_groups*d_state + n_heads][dim] gives z, xBC (x, B, C)
  // and dt; the depthwise causal conv over xBC [conv_dim][d_conv] and its bias; per head
  // dt's bias, A (negative: the converter stores -exp(A_log)) and D, [n_heads] each; the
  // gated RMSNorm's weight [d_inner]; the out-projection [dim][d_inner]. A block without
  // ffn_norm has no FFN sublayer (Mamba-2's blocks are the mixer alone).
  WeightView ssm_in, ssm_conv1d, ssm_conv1d_b, ssm_dt_b, ssm_a, ssm_d, ssm_norm, ssm_out;
  // A shared expert (Granite 4.0-H, ModelConfig::shared_expert_ffn_dim > 0): a SwiGLU FFN
  // every token runs beside its routed experts, its output added to theirs ungated:
  // [shexp_ffn][dim] gate and up, [dim][shexp_ffn] down.
  WeightView gate_shexp, up_shexp, down_shexp;
  // Post-norm blocks (BERT): LayerNorms taken after each residual sum instead of before
  // each sublayer, [dim] with biases: x = norm(x + attn(x)), then x = norm(x + ffn(x)).
  // Such a block has no attn_norm or ffn_norm.
  WeightView attn_out_norm, attn_out_norm_b;
  WeightView layer_out_norm, layer_out_norm_b;
};

// What varies between families, as data the one forward pass reads.
enum class Norm { rms, layer };          // RMSNorm x/rms(x)*w, or LayerNorm (x-mean)/std*w + b
// down(silu(gate x) * up x), down(gelu(up x + b)) + b, or down(gelu(gate x) * up x) (GeGLU, Gemma);
// swiglu_clamped (gpt-oss): g = min(gate x, L), u = clamp(up x, -L, L), down(g sigmoid(a g) (u + 1))
// with a = ModelConfig::swiglu_alpha, L = swiglu_limit.
enum class Ffn { swiglu, gelu, geglu, swiglu_clamped };
// rotary Q/K, ALiBi biases on the attention scores, nothing (NoPE: the attention layers
// of a hybrid whose recurrent layers carry the order, Granite 4.0-H), or a learned table
// of absolute positions added to the input embeddings (BERT: Model::pos_embd).
enum class Positions { rope, alibi, none, learned };
// How an embedding model turns a text's per-token hidden states into one vector
// (<arch>.pooling_type, llama.cpp's numbering 0-3): none (every token's), the mean over
// the text, the first token's ([CLS]) or the last token's (decoder embedders).
enum class Pooling { none = 0, mean = 1, cls = 2, last = 3 };
// What mixes tokens in a block: causal self-attention over the KV cache, or a Mamba-2
// selective state-space layer over a recurrent state carried per sequence.
enum class Mixer { attention, ssm };

struct ModelConfig {
  std::string arch;              // general.architecture
  std::string name;              // general.name (or the file name)
  uint32_t n_ctx_train = 0;      // <arch>.context_length
  uint32_t dim = 0;              // embedding_length
  uint32_t n_layers = 0;         // block_count
  uint32_t ffn_dim = 0;          // feed_forward_length
  uint32_t n_heads = 0;          // attention.head_count
  uint32_t n_kv_heads = 0;       // attention.head_count_kv (GQA/MQA)
  uint32_t head_dim = 0;         // dim / n_heads unless attention.key_length says otherwise
  uint32_t n_rot = 0;            // rope.dimension_count
  float rope_theta = 10000.0f;   // rope.freq_base
  bool rope_neox = false;        // rotate halves instead of adjacent pairs
  RopeScaling rope_scaling = RopeScaling::None;  // rope.scaling.type (linear if only a factor is given)
  float rope_scale = 1.0f;       // rope.scaling.factor (or the older rope.scale_linear)
  uint32_t rope_orig_ctx = 0;    // rope.scaling.original_context_length (0: not given)
  float rope_attn_factor = 1.0f; // rope.scaling.attn_factor
  std::vector<float> rope_freq_factors;  // rope_freqs.weight: theta_i / factor_i (Llama 3.1),
                                         // or rope_factors_short.weight (Phi-3 LongRoPE)
  // rope_factors_long.weight (Phi-3 128k, Phi-3.5: LongRoPE): the divisors used instead of
  // the short ones by a session whose context exceeds the original context
  // (rope_orig_ctx, else n_ctx_train), as llama.cpp chooses. Empty: no LongRoPE.
  std::vector<float> rope_freq_factors_long;
  float rms_eps = 1e-5f;         // eps of every norm: attention.layer_norm_rms_epsilon (or layer_norm_epsilon)
  Norm norm = Norm::rms;
  Ffn ffn = Ffn::swiglu;
  Positions positions = Positions::rope;
  // attention.causal: false lets each token attend to every token of its own sequence
  // (BERT's encoder), not only to those before it.
  bool causal = true;
  // pooling_type: what an embedding of a text is, unless the caller says otherwise (absent: none).
  Pooling pooling = Pooling::none;
  float max_alibi_bias = 0.0f;   // attention.max_alibi_bias: slopes 2^(-max_bias * i / n_heads) (Press et al. 2022)
  float clamp_kqv = 0.0f;        // attention.clamp_kqv: Q, K, V clamped to [-c, c] (0: off)
  float embed_scale = 1.0f;      // token embeddings are multiplied by it (Gemma: sqrt(dim))
  float attn_scale = 0.0f;       // scores are (q . k) * attn_scale; 0: 1/sqrt(head_dim)
  // Granite's multipliers (muP-style training): every sublayer's output (mixer and FFN) is
  // multiplied by residual_scale before it joins the residual stream, and the logits are
  // divided by logit_scale. 1: off.
  float residual_scale = 1.0f;
  float logit_scale = 1.0f;
  // Soft-capping (Gemma 2): s -> cap * tanh(s / cap) on the scaled attention scores before
  // the softmax, and on the final logits. 0: off.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // Sliding-window layers rotate with their own base and no scaling when this is set
  // (Gemma 3: 10000 local, 1M global; rope.freq_base_swa). 0: every layer as rope_theta.
  float rope_theta_swa = 0.0f;
  // Sliding-window attention, per layer: a query at position p sees keys in (p - W, p];
  // 0 = global. From attention.sliding_window (every layer, as Mistral) and, when given,
  // attention.sliding_window_pattern (which layers slide). Empty: no windows.
  std::vector<uint32_t> swa_window;
  uint32_t n_vocab = 0;
  // Mixture of experts: expert_count experts of expert_feed_forward_length each, of which
  // expert_used_count run per token, chosen by the router's top scores; their outputs are
  // summed weighted by the softmax of the router logits, renormalized over the chosen
  // ones (Qwen3-MoE, Mixtral) unless expert_weights_norm says otherwise. 0: dense.
  uint32_t n_experts = 0, n_experts_used = 0, expert_ffn_dim = 0;
  bool expert_weights_norm = true;
  // gpt-oss: the experts are ranked by their router logits and weighted by the softmax of
  // the chosen ones' logits only (llama.cpp's "softmax weight" gating; the same numbers as
  // a softmax over all renormalized over the chosen, computed without the detour).
  bool expert_softmax_chosen = false;
  // expert_shared_feed_forward_length: the width of a shared expert that runs for every
  // token beside the routed ones (LayerWeights::gate_shexp...). 0: none.
  uint32_t shared_expert_ffn_dim = 0;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;  // Ffn::swiglu_clamped only
  // The mixer of each layer ([n_layers]; empty: attention everywhere). Hybrid families mark
  // their layers one by one, so nothing here assumes a whole model is one kind.
  std::vector<Mixer> layer_mixer;
  // Mamba-2 (Dao & Gu 2024) layers: ssm.conv_kernel (d_conv), inner_size (d_inner),
  // state_size (d_state), time_step_rank (the number of SSM heads, each d_inner / n_heads
  // wide) and group_count (n_groups: heads share B and C within a group, and the gated
  // norm is taken per group). 0 without SSM layers.
  uint32_t ssm_d_conv = 0, ssm_d_inner = 0, ssm_d_state = 0, ssm_n_heads = 0, ssm_n_groups = 0;
  bool is_ssm(size_t layer) const { return layer < layer_mixer.size() && layer_mixer[layer] == Mixer::ssm; }
  uint32_t ssm_head_dim() const { return ssm_n_heads ? ssm_d_inner / ssm_n_heads : 0; }
  uint32_t ssm_conv_dim() const { return ssm_d_inner + 2 * ssm_n_groups * ssm_d_state; }  // x, B, C
  // <arch>.* metadata keys the architecture file never read (kiln info lists them): what
  // a file says that kiln does not act on.
  std::vector<std::string> ignored_keys;
  TensorType weight_type = TensorType::F32;  // the type most weight bytes have
};

struct LoadParams {
  // Copy the matrices into the kernels' preferred layout in huge pages (faster tokens,
  // slower load); false keeps them in the file mapping, as does KILN_PACK=0.
  bool repack = true;
  // Also copy every expert matrix into that layout (MoE files). Off by default: all the
  // experts' bytes then live in memory twice over while loading, and resident memory holds
  // every expert, not just the pages the routing has touched; decode reads them faster.
  bool repack_experts = false;
  // Called once everything the loader reads at load has been read, right before the file
  // is checked for changes since it was opened (gguf::File::check_unchanged). Tests
  // change the file here.
  std::function<void()> after_read;
};

class Model {
 public:
  // Opens, validates and maps the file; throws kiln::Error naming file and field.
  static std::unique_ptr<Model> load(const std::string& path, const LoadParams& params = {});
  // A llama2.c checkpoint (legacy, version 1 or 2) with the tokenizer it was trained
  // with: the same model as its GGUF conversion (version 2's int8 weights dequantized).
  static std::unique_ptr<Model> load_llama2c(const std::string& path, std::unique_ptr<Tokenizer> tokenizer,
                                             const LoadParams& params = {});
  // True if `path` is a llama2.c checkpoint rather than a GGUF.
  static bool is_llama2c(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Use another tokenizer (e.g. a tokenizer.model file); its vocabulary must fit the model.
  // The identity changes with it: token ids saved under one vocabulary mean other text
  // under another.
  void replace_tokenizer(std::unique_ptr<Tokenizer> tokenizer);

  // 64-bit fingerprint of what a saved KV cache depends on: architecture and
  // hyperparameters, every tensor's name/type/shape and a sample of its bytes in the file
  // (first, middle and last 4 KiB), and the vocabulary. Any two different weight files
  // (another quantization, another seed, a fine-tune touching the sampled bytes) differ.
  // The weights' part is computed once, on the first call (thread-safe): ~600 samples of
  // a 600 MiB model take ~12 ms from the page cache but up to seconds of seeks from a
  // cold disk, which `kiln info` and runs that never save a session should not pay.
  uint64_t identity() const;
  std::string identity_hex() const;  // 16 lowercase hex digits

  WeightView token_embd;         // [n_vocab][dim]
  WeightView output_norm;        // [dim]
  WeightView output_norm_b;      // [dim], LayerNorm families only (optional)
  WeightView output;             // [n_vocab][dim], token_embd when the file ties them;
                                 // empty for an encoder without a classifier (BERT)
  // BERT's input: token_embd + token_types row 0 (every token is "sentence A", as in
  // llama.cpp) + position_embd row pos, then LayerNorm token_embd_norm (+ bias).
  WeightView token_types;        // [n_token_types][dim]
  WeightView pos_embd;           // [n_ctx_train][dim]: Positions::learned
  WeightView token_embd_norm, token_embd_norm_b;  // [dim]
  std::vector<LayerWeights> layers;

  uint64_t n_params() const;     // elements of all tensors
  uint64_t weight_bytes() const; // bytes of all tensors
  uint64_t packed_bytes() const; // bytes of weights repacked for the kernels at load
  // Weight bytes one decoded token reads from memory: every matrix, one row of the
  // embedding table (all of it when it is also the classifier), only the routed experts.
  // Speed of a memory-bound decode step = bandwidth / this (the roofline bench/ reports).
  uint64_t decode_bytes_per_token() const;

  // Internal: used by architecture files.
  ModelConfig& mutable_config() { return config_; }
  WeightView weight(const std::string& name, std::vector<uint64_t> expect_dims, bool required = true) const;

 private:
  void pack_weights(bool experts);
  uint64_t hash_weights() const;

  // One anonymous mapping holds every packed weight (huge pages where the OS allows).
  struct PackedArena {
    void* base = nullptr;
    size_t bytes = 0;
    ~PackedArena();
  };
  PackedArena packed_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelConfig config_;
  mutable std::once_flag weights_hash_once_;
  mutable uint64_t weights_hash_ = 0;  // the identity's part that a new tokenizer does not change
  uint64_t vocab_hash_ = 0;
};

}  // namespace kiln
