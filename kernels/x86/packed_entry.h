#pragma once
// What the x86 tables do for packed weights (kernels/packed.h) apart from the kernels
// themselves: which weights pack, the activation buffer sizes, the conversion of a range
// of activation rows, and the gemm that converts them itself when its caller did not.
// Written once over a vector traits struct V (kernels/x86/avx2/vec.h,
// kernels/x86/avx512/vec.h), whose quantize_q8_32 and prepare_q8_256 do the conversion;
// V has internal linkage, so every instantiation stays in its ISA's translation unit.
#include <cstddef>
#include <cstdint>

#include "kernels/bf16_dot.h"
#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// Stack space of the path that converts activations itself (no x_prepared): at least
// one row, which bounds the k that packing accepts (~130k, beyond any model's width).
inline constexpr size_t kPreparedStackBytes = 160 * 1024;

// The types the x86 packed kernels read. Explicit rather than "whatever packed.h lays
// out", so a type added to the layout later stays unpacked until it has kernels.
constexpr bool has_packed_kernels(TensorType t) {
  switch (t) {
    case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0:
    case TensorType::Q5_1: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
    case TensorType::Q3_K: case TensorType::Q2_K: return true;
    case TensorType::IQ4_NL: case TensorType::IQ4_XS: return true;  // kernels/x86/iquant_*
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: return true;  // gemm_float_packed.h
    default: return false;
  }
}

template <VectorTraits V>
struct PackedActivations {
  static size_t packed_bytes(TensorType t, size_t rows, size_t k) {
    using namespace packed;
    if (!has_packed_kernels(t) || k % record_elements(t) != 0 || act_row_bytes(act_format(t), k) > kPreparedStackBytes)
      return 0;
    return tensor_bytes(t, rows, k);
  }

  static size_t prepared_bytes(TensorType w_type, size_t k, size_t n_batch) {
    return has_packed_kernels(w_type) ? packed::act_row_bytes(packed::act_format(w_type), k) * n_batch : 0;
  }

  static void prepare(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out) {
    if (!has_packed_kernels(w_type)) return;
    const packed::ActFormat f = packed::act_format(w_type);
    const size_t stride = packed::act_row_bytes(f, k);
    for (size_t b = b0; b < b1; ++b) {
      void* row = static_cast<uint8_t*>(out) + b * stride;
      if (f == packed::ActFormat::q8_32) {
        int8_t* q = static_cast<int8_t*>(row);
        float* d = reinterpret_cast<float*>(q + k);
        V::quantize_q8_32(x + b * ldx, k / 32, q, d, reinterpret_cast<int32_t*>(d + k / 32));
      }
      else if (f == packed::ActFormat::q8_256) V::prepare_q8_256(x + b * ldx, k, row);
      else if (f == packed::ActFormat::bf16) to_bf16_activations(x + b * ldx, k, row);
    }
  }

  // As bf16_dot::activation, kLanes at a time: bf16 for the dot instruction, else the
  // floats they stand for (FMA pairs then broadcast them without unpacking).
  static void to_bf16_activations(const float* x, size_t k, void* out) {
    alignas(64) uint16_t h[V::kLanes];
    const bool as_bf16 = V::bf16_dot_instruction();
    for (size_t i = 0; i < k; i += V::kLanes) {
      const size_t n = k - i < V::kLanes ? k - i : V::kLanes;
      V::store_h(h, V::to_bf16(n == V::kLanes ? V::load(x + i) : V::load_tail(x + i, n)));
      for (size_t j = 0; j < V::kLanes; ++j) h[j] = bf16_dot::flush_subnormal(h[j]);
      if (as_bf16) {
        __builtin_memcpy(static_cast<uint16_t*>(out) + i, h, n * 2);
      } else {
        float* f = static_cast<float*>(out) + i;
        n == V::kLanes ? V::store(f, V::from_bf16(V::load_h(h))) : V::store_tail(f, V::from_bf16(V::load_h(h)), n);
      }
    }
  }

  // gemm on packed weights, a.w_packed set: run(a, act, b0, b1) multiplies batch rows
  // [b0, b1) whose prepared activations start at act. Without a.x_prepared the rows are
  // converted here, as many at a time as fit onto the stack.
  template <void (*run)(const GemmArgs& a, const void* act, size_t b0, size_t b1)>
  static void gemm(const GemmArgs& a) {
    if (a.r0 >= a.r1 || a.n_batch == 0) return;
    if (a.x_prepared) return run(a, a.x_prepared, 0, a.n_batch);
    alignas(64) uint8_t buf[kPreparedStackBytes];
    const size_t stride = packed::act_row_bytes(packed::act_format(a.w_type), a.k);
    if (stride == 0 || stride > sizeof(buf)) return;  // packed_bytes() refused such weights
    const size_t rows = sizeof(buf) / stride;
    for (size_t b0 = 0; b0 < a.n_batch; b0 += rows) {
      const size_t b1 = b0 + rows < a.n_batch ? b0 + rows : a.n_batch;
      prepare(a.w_type, a.x + b0 * a.ldx, a.ldx, a.k, 0, b1 - b0, buf);
      run(a, buf, b0, b1);
    }
  }
};

}  // namespace kiln::kernels::x86
