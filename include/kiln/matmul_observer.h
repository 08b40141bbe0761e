#pragma once
// A window on the forward pass for tools that study what goes into the model's weights,
// such as `kiln imatrix` (include/kiln/imatrix.h): Session::set_matmul_observer installs
// one, and every product of a weight matrix with activations is shown to it before it is
// computed. Without one the forward pass pays a pointer test per product.
#include <cstddef>
#include <cstdint>

namespace kiln {

namespace gguf {
struct TensorInfo;
}

class MatmulObserver {
 public:
  virtual ~MatmulObserver() = default;
  // One product W x: `weight` is the GGUF tensor W comes from, named as the file names
  // it (a fused tensor cut into several matrices, such as attn_qkv, is shown once for
  // the one input they all read); `expert` is W's index in a 3-D tensor of experts, -1
  // for a 2-D weight; x holds `rows` input rows of weight.dims[0] floats each, one after
  // another. For an expert, the rows are those of the tokens routed to it, and only
  // experts some token chose are shown. Called on the thread that runs the forward pass.
  virtual void on_matmul(const gguf::TensorInfo& weight, int64_t expert, const float* x, size_t rows) = 0;
};

}  // namespace kiln
