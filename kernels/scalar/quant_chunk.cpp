// ref::quantize_chunk: ggml_quantize_chunk's choice of quantizer for each type (see
// kernels/quant_iq.h), and which types need importance weights.
#include <cstring>
#include <string>

#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::ref {
namespace {

using ChunkQuantizer = void (*)(const float*, void*, size_t, size_t, const float*);

// The types whose quantizer uses the importance.
ChunkQuantizer chunk_quantizer(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: return quantize_q4_0;
    case TensorType::Q4_1: return quantize_q4_1;
    case TensorType::Q5_0: return quantize_q5_0;
    case TensorType::Q5_1: return quantize_q5_1;
    case TensorType::Q2_K: return quantize_q2_K;
    case TensorType::Q3_K: return quantize_q3_K;
    case TensorType::Q4_K: return quantize_q4_K;
    case TensorType::Q5_K: return quantize_q5_K;
    case TensorType::Q6_K: return quantize_q6_K;
    case TensorType::IQ4_NL: return quantize_iq4_nl;
    case TensorType::IQ4_XS: return quantize_iq4_xs;
    case TensorType::IQ2_XXS: return quantize_iq2_xxs;
    case TensorType::IQ2_XS: return quantize_iq2_xs;
    case TensorType::IQ2_S: return quantize_iq2_s;
    case TensorType::IQ3_XXS: return quantize_iq3_xxs;
    case TensorType::IQ3_S: return quantize_iq3_s;
    case TensorType::IQ1_S: return quantize_iq1_s;
    case TensorType::IQ1_M: return quantize_iq1_m;
    default: return nullptr;
  }
}

}  // namespace

bool quantize_requires_importance(TensorType type) {
  return type == TensorType::IQ2_XXS || type == TensorType::IQ2_XS || type == TensorType::IQ1_S;
}

void quantize_chunk(TensorType type, const float* src, void* dst, size_t n_rows, size_t n_per_row,
                    const float* importance) {
  const TypeInfo* info = type_info(static_cast<uint32_t>(type));
  const std::string name = info ? type_name(type) : "type " + std::to_string(uint32_t(type));
  if (!info || type == TensorType::Q8_K) throw Error("quantize_chunk: cannot write " + name);
  if (n_per_row % info->block_size != 0)
    throw Error("quantize_chunk: rows of " + std::to_string(n_per_row) + " values are not whole " + name + " blocks of " +
                std::to_string(info->block_size));
  if (quantize_requires_importance(type) && !importance)
    throw Error("quantize_chunk: " + name + " needs importance weights (an imatrix)");
  const size_t n = n_rows * n_per_row;
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case TensorType::F16:
    case TensorType::BF16: {
      auto* out = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = type == TensorType::F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    }
    default: break;
  }
  if (ChunkQuantizer q = chunk_quantizer(type)) return q(src, dst, n_rows, n_per_row, importance);
  // The rest ignore importance (Q8_0, MXFP4, TQ1_0, TQ2_0): their one quantizer over the
  // whole chunk.
  const QuantTraits* t = quant_traits(type);
  if (!t || !t->can_quantize) throw Error("quantize_chunk: cannot write " + name);
  quantize_row(type, src, dst, n);
}

}  // namespace kiln::kernels::ref
