#pragma once
// Ops::gemm_chain. A prefill's attention runs Q K^T and P V as gemms on keys and values
// packed as F32 records, every output one FMA chain over k (gemm_float_packed.h); a decode
// step has a few query rows (the heads sharing a KV head) and reads each key and value
// once, so packing them would cost as much as the products. Here the lanes run across the
// activation rows instead: each output is still one chain over k in order, on the file
// layout as stored, with the packed gemm's bits at the file tile's cost (one vector FMA
// per weight element and kLanes rows). Written over the vector traits V; each ISA's table
// instantiates it (vector_ops.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// Halves to floats (the table's fp16_to_f32 / bf16_to_f32: VectorOps::from_halves).
using HalvesToFloats = void (*)(const uint16_t* in, float* out, size_t n);

template <VectorTraits V, HalvesToFloats kFromFp16, HalvesToFloats kFromBf16>
class ChainGemm {
  using F = typename V::F;
  static constexpr size_t W = V::kLanes;
  static constexpr size_t kChunk = 256;  // elements of k a pass: activations [kChunk][W] stay in L1
  static constexpr size_t kRows = 8;     // weight rows a pass: 8 independent chains

  // Elements [i0, i0 + n) of a file-layout row as floats (n <= kChunk).
  static void widen(TensorType t, const char* row, size_t i0, size_t n, float* out) {
    const uint16_t* halves = reinterpret_cast<const uint16_t*>(row) + i0;
    if (t == TensorType::F32) std::copy_n(reinterpret_cast<const float*>(row) + i0, n, out);
    else if (t == TensorType::F16) kFromFp16(halves, out, n);
    else kFromBf16(halves, out, n);
  }

 public:
  static void run(const GemmArgs& a) {
    const size_t rows = a.r1 - a.r0;
    if (rows == 0 || a.n_batch == 0) return;
    alignas(64) float xt[kChunk * W];       // activations transposed: element i of row b at [i][b]
    alignas(64) float wf[kRows * kChunk];   // kRows weight rows' elements of this pass as floats
    thread_local std::vector<float> sums;  // [rows][W]: the chains between passes over k
    const size_t groups = (rows + kRows - 1) / kRows;
    if (sums.size() < groups * kRows * W) sums.resize(groups * kRows * W);
    for (size_t b0 = 0; b0 < a.n_batch; b0 += W) {
      const size_t nb = a.n_batch - b0 < W ? a.n_batch - b0 : W;
      std::fill(sums.begin(), sums.begin() + groups * kRows * W, 0.0f);
      for (size_t i0 = 0; i0 < a.k; i0 += kChunk) {
        const size_t n = a.k - i0 < kChunk ? a.k - i0 : kChunk;
        for (size_t i = 0; i < n; ++i)
          for (size_t b = 0; b < W; ++b) xt[i * W + b] = b < nb ? a.x[(b0 + b) * a.ldx + i0 + i] : 0.0f;
        for (size_t g = 0; g < groups; ++g) {
          const size_t r = a.r0 + g * kRows, nr = a.r1 - r < kRows ? a.r1 - r : kRows;
          for (size_t t = 0; t < kRows; ++t) {
            if (t < nr) widen(a.w_type, static_cast<const char*>(a.w) + (r + t) * a.w_row_bytes, i0, n, wf + t * kChunk);
            else std::fill(wf + t * kChunk, wf + t * kChunk + n, 0.0f);  // computed, never stored
          }
          float* s = sums.data() + g * kRows * W;
          F acc[kRows];
#pragma GCC unroll 8
          for (size_t t = 0; t < kRows; ++t) acc[t] = V::load(s + t * W);
          for (size_t i = 0; i < n; ++i) {
            const F xv = V::load(xt + i * W);
#pragma GCC unroll 8
            for (size_t t = 0; t < kRows; ++t) acc[t] = V::fmadd(V::set1(wf[t * kChunk + i]), xv, acc[t]);
          }
#pragma GCC unroll 8
          for (size_t t = 0; t < kRows; ++t) V::store(s + t * W, acc[t]);
        }
      }
      for (size_t r = 0; r < rows; ++r)
        for (size_t b = 0; b < nb; ++b) a.y[(b0 + b) * a.ldy + a.r0 + r] = sums[r * W + b];
    }
  }
};

template <VectorTraits V, HalvesToFloats kFromFp16, HalvesToFloats kFromBf16>
void gemm_chain(const GemmArgs& a) {
  ChainGemm<V, kFromFp16, kFromBf16>::run(a);
}

}  // namespace kiln::kernels::x86
