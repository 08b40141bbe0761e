#pragma once
// BF16 weights in the packed layout (kernels/packed.h) multiply activations rounded to
// bf16, two elements of k at a time, exactly as AVX512-BF16's vdpbf16ps does: for each
// output, acc += w_odd * x_odd, then acc += w_even * x_even, each a fused multiply-add
// (the product of two bf16 is exact in f32) rounded to nearest even, subnormal inputs
// read as zero and subnormal results flushed to zero. That instruction does twice the
// multiply-adds of an f32 FMA per cycle (Zen 5: 394 against 213 GFLOP/s a core), and
// llama.cpp rounds the activations of BF16 weights to bf16 too. Checked on a Zen 5
// against this definition: 3.2 million lanes of random bits and of model-like values,
// no difference (the other orders and a single rounding differ in 1-2% of lanes).
// Every table computes these bits; the ones without the instruction use two FMAs per
// pair, which differ from it only where a partial sum falls below 2^-126 (the
// instruction flushes it to zero), which weights and activations of a model never reach.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kernels.h"
#include "kiln/tensor_type.h"

namespace kiln::kernels::bf16_dot {

// A bf16 with the exponent field 0 (a subnormal) as the signed zero the instruction reads.
inline uint16_t flush_subnormal(uint16_t h) { return (h & 0x7f80) == 0 ? uint16_t(h & 0x8000) : h; }

// An activation as the dot product reads it: rounded to nearest even, NaN kept (quieted),
// a subnormal result flushed.
inline uint16_t activation(float x) { return flush_subnormal(f32_to_bf16(x)); }

// One pair: acc + w_odd x_odd, then + w_even x_even, as the instruction (see above).
inline float step(float acc, uint16_t w_even, uint16_t w_odd, uint16_t x_even, uint16_t x_odd) {
  const auto flush = [](float v) { return std::fabs(v) < 0x1p-126f ? std::copysign(0.0f, v) : v; };
  acc = flush(std::fma(bf16_to_f32(flush_subnormal(w_odd)), bf16_to_f32(flush_subnormal(x_odd)), flush(acc)));
  return flush(std::fma(bf16_to_f32(flush_subnormal(w_even)), bf16_to_f32(flush_subnormal(x_even)), acc));
}

// The reference: y = W x over packed BF16 weights (rows [a.r0, a.r1), a.k even) for the
// float activations a.x, each output one chain of step() over the pairs of k in order.
void reference_gemm(const GemmArgs& a);

}  // namespace kiln::kernels::bf16_dot
