#pragma once
// Which type each tensor of a model gets under a `kiln quantize` preset.
//
// The K presets (Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K) are llama-quantize's "mixes":
// most matrices get the preset's base type, but output.weight (or token_embd when the
// embeddings are tied), attn_v and ffn_down get more bits by layer position, and matrices
// whose rows are not whole 256-value super-blocks fall back to a legacy 32-value type.
// choose_types() reproduces the rules of llama.cpp's src/llama-quant.cpp with no importance
// matrix for every architecture kiln runs (llama and Mixtral, qwen2, qwen3, qwen3moe, gemma,
// gemma2, gemma3, phi3, mpt), so kiln and llama-quantize write the same types (and, the
// quantizers being bit-exact, the same bytes). The rules hardly depend on the family: a
// fused attn_qkv counts as a value projection, tied embeddings make token_embd the output
// projection, llama and qwen2 have a 70B size whose value matrices get more bits, a
// mixture of experts' ffn_down takes its position from the layer in its name, and a model
// of exactly eight experts gets Q8_0 key/value projections (in every preset, the legacy
// ones too) and Q5_K attn_output in the lower mixes.
//
// The legacy presets (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): every 2-D tensor gets the base type
// when its rows are whole blocks, and the output projection llama-quantize's Q6_K (Q8_0
// for Q8_0 or rows that are not whole super-blocks), as llama-quantize does. Where
// llama-quantize refuses a model (rows that are not whole 32-value blocks), kiln keeps
// those tensors' type instead.
//
// The i-quant and ternary presets (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS,
// IQ3_XS, IQ3_S, IQ3_M, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0) are mixes too, with llama-quantize's
// rules for each (src/quantize/mix_iq.cpp): the lowest-bit ones give value projections,
// the first ffn_down matrices and the embeddings K types, the IQ3 ones step attention and
// FFN matrices up or down, IQ4 gives grouped-query value matrices Q5_K. Matrices whose rows
// are not whole 256-value blocks fall back to IQ4_NL (Q4_0 for the ternary types).
//
// MXFP4_MOE (gpt-oss's format): a mixture of experts' stacked 3-D matrices (more than one
// expert) get MXFP4, every other matrix llama-quantize quantizes Q8_0, the output
// projection included. Rows that are not whole 32-value blocks are refused, naming the
// tensor, as llama-quantize refuses them (it has no fallback for either type).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor_type.h"

namespace kiln::quantize {

// llama.cpp's LLAMA_FTYPE_* values, written to general.file_type.
enum class FileType : uint32_t {
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 7,
  Q5_0 = 8,
  Q5_1 = 9,
  Q2_K = 10,
  Q3_K_S = 11,
  Q3_K_M = 12,
  Q3_K_L = 13,
  Q4_K_S = 14,
  Q4_K_M = 15,
  Q5_K_S = 16,
  Q5_K_M = 17,
  Q6_K = 18,
  IQ2_XXS = 19,
  IQ2_XS = 20,
  IQ3_XS = 22,
  IQ3_XXS = 23,
  IQ1_S = 24,
  IQ4_NL = 25,
  IQ3_S = 26,
  IQ3_M = 27,
  IQ2_S = 28,
  IQ2_M = 29,
  IQ4_XS = 30,
  IQ1_M = 31,
  TQ1_0 = 36,
  TQ2_0 = 37,
  MXFP4_MOE = 38,
};

struct Preset {
  std::string_view name;  // as llama-quantize spells it
  FileType file_type;
  TensorType base_type;   // what most matrices get
  bool llama_mix;         // llama-quantize's per-tensor rules (the K and i-quant mixes; MXFP4_MOE has its own)
};

// The preset of that name, case-insensitive; Q3_K, Q4_K and Q5_K are aliases of the _M
// mixes as in llama-quantize. nullptr if unknown.
const Preset* find_preset(std::string_view name);
// "Q8_0, Q4_0, ..., Q6_K" for messages and --help.
std::string preset_names();

// What the rules need to know about the model (from its GGUF metadata).
struct ModelFacts {
  std::string arch;         // general.architecture
  uint32_t n_layers = 0;    // <arch>.block_count
  uint32_t n_heads = 0;     // <arch>.attention.head_count
  uint32_t n_kv_heads = 0;  // <arch>.attention.head_count_kv (n_heads if absent)
  uint32_t n_experts = 0;   // <arch>.expert_count (0 if absent)
};

struct TensorDesc {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] is the row length, as in GGUF
  TensorType type;
};

struct TypeChoice {
  TensorType type;     // the type to write (== the input type: copied unchanged)
  bool fell_back = false;  // the rule's type did not fit the row length
  std::string note;    // why, for fallbacks: "rows of 64 are not whole Q4_K blocks"
};

// One choice per tensor, in the order given. has_imatrix: an importance matrix will be
// used (llama-quantize's rules then differ for Q4_0/Q5_0's first ffn_down layers, IQ3_XXS,
// IQ4_NL and IQ4_XS). Throws kiln::Error (naming the tensor) where llama-quantize would
// refuse, or kiln has no rules for: a mix on an architecture kiln does not run, or a
// tensor whose type needs an importance matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS) without one.
// llama-quantize's --pure (every tensor it quantizes gets the preset's base type: no mix
// rules, no fallbacks), --output-tensor-type and --token-embedding-type (that type for
// output.weight / token_embd.weight, whatever the preset; without --pure a tied token_embd
// takes the output type, as it is the output projection). A type whose blocks do not tile
// a tensor's rows is refused, naming the tensor (llama-quantize has no fallback there).
struct TypeOverrides {
  bool pure = false;
  std::optional<TensorType> output_type, token_embd_type;
};

std::vector<TypeChoice> choose_types(const Preset& preset, const ModelFacts& model,
                                     const std::vector<TensorDesc>& tensors, bool has_imatrix = false,
                                     const TypeOverrides& overrides = {});

}  // namespace kiln::quantize
