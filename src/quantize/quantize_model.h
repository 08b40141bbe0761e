#pragma once
// Rewrites an F32/F16/BF16 GGUF model with quantized weights: the work behind
// `kiln quantize`. Types come from quantize/mix.h, the bytes from the scalar reference
// quantizers (bit-exact with ggml), spread over threads by rows. Metadata is copied, with
// general.file_type and general.quantization_version set as llama-quantize sets them; the
// tensors keep their order. With an importance matrix (kiln/imatrix.h) each matrix is
// fitted with its importance vector (an expert's own for 3-D tensors) through
// kernels::ref::quantize_chunk, and the output names it in llama-quantize's
// quantize.imatrix.* keys.
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "quantize/mix.h"

namespace kiln::quantize {

// One tensor, as the progress callbacks see it.
struct TensorStep {
  size_t index = 0;  // 0-based position in the file
  size_t count = 0;  // tensors in the file
  std::string name;
  std::vector<uint64_t> dims;
  TensorType from = TensorType::F32, to = TensorType::F32;
  bool fell_back = false;
  std::string note;        // why it fell back
  uint64_t bytes_in = 0;            // of the whole input tensor
  uint64_t bytes_out = 0;           // of the whole output tensor (set when finished)
  uint64_t input_bytes_before = 0;  // input tensor bytes of the tensors before this one
  uint64_t input_bytes_total = 0;   // input tensor bytes of the whole file
  bool weighted = false;            // quantized with an importance vector (set when finished)
};

struct Progress {
  std::function<void(const TensorStep&)> tensor_started;   // may be empty
  std::function<void(const TensorStep&)> tensor_finished;  // may be empty
};

struct Summary {
  size_t n_tensors = 0;
  size_t n_quantized = 0;  // tensors converted to a quantized type
  size_t n_fell_back = 0;  // matrices whose rule type did not fit their rows
  size_t n_weighted = 0;   // matrices quantized with an importance vector
  uint64_t bytes_in = 0, bytes_out = 0;
  std::map<TensorType, size_t> output_types;  // tensors per type in the output
};

// Reads `input`, writes `output`. n_threads 0 means std::thread::hardware_concurrency().
// imatrix: an importance matrix file, or empty. Throws kiln::Error naming the file or
// tensor: unreadable or non-float input, a preset that cannot apply to this model, a bad
// importance matrix or one whose entry does not fit its tensor, or a write failure.
Summary quantize_model(const std::string& input, const std::string& output, const Preset& preset,
                       unsigned n_threads, const Progress& progress = {}, const std::string& imatrix = {},
                       const TypeOverrides& overrides = {});

}  // namespace kiln::quantize
