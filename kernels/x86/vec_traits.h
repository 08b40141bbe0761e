#pragma once
// The interface of the x86 vector traits (kernels/x86/avx2/vec.h: 8 lanes,
// kernels/x86/avx512/vec.h: 16 lanes) that the shared kernel bodies in kernels/x86/*.h
// are written over, stated once here and checked by the concept below. What each member
// means; how each ISA does it (and why) is in its own vec.h.
//
//   F, H, I                 float vector, vector of kLanes halves (fp16/bf16), integer vector;
//                           arithmetic (+ - * /, & | ^) is the vector operators, which is
//                           exactly how the intrinsics are defined
//   load, store, set1, fmadd, fmsub, max      unaligned, and a*b+c / a*b-c fused
//   load_tail(p, n), store_tail(p, v, n)      the first n <= kLanes floats, other lanes 0;
//                                             never touch memory past them
//   keep(v, n)              v with lanes [n, kLanes) set to +0
//   hsum(v), hsums<N>(v, out)                 horizontal sums by one fixed tree, the same for
//                                             every caller (hsums: of N vectors, bit-equal to hsum)
//   max_with_tail(v, p, n)  the largest of v's lanes and p[0, n), n < kLanes
//   exp(v)                  e^v to ~2 ulp; 0 below the float range, inf above
//   rotate_pairs(x, cs)     RoPE of adjacent pairs of x by the (cos, sin) pairs of cs: X*C -/+
//                           swap(X)*S on even/odd lanes, which is exactly fmaddsub
//   split_cos_sin(lo, hi, c, s)               2 kLanes interleaved (cos, sin) into cosines, sines
//   i8_to_f32(p)            kLanes signed bytes as floats
//   nibbles_to_f32(p, lo, hi)                 kLanes bytes as floats of (low nibble - 8), (high - 8)
//   load_h, store_h, load_h_tail, store_h_tail                kLanes halves, and tails as floats'
//   from_fp16, to_fp16, from_bf16, to_bf16    conversions (fp16 and bf16 round to nearest even;
//                                             bf16 keeps NaN payloads, quieted)
//   load_i, set1_i8, shl16<N>, shr16<N>       integer vectors; shifts of 16-bit lanes
//   set1_i32, bf16_even(i), bf16_odd(i)       a 32-bit lane everywhere; the low and high bf16
//                                             of each 32-bit lane as floats
//   bf16_dot_instruction()  whether packed BF16 weights are multiplied by vdpbf16ps now (then
//                           their activations are prepared as bf16, else as floats)
//   quantize_q8_32(x, n_blocks, q, d, s)      blocks of 32 as ggml's Q8_0 activations: d the fp16
//                                             rounded amax / 127, q = x / d rounded half away
//                                             from zero, s = sum(q)
//   prepare_q8_256(x, k, row)                 one row as ggml's Q8_K activations (kernels/packed.h)
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace kiln::kernels::x86 {

template <class V>
concept VectorTraits = requires(typename V::F f, typename V::H h, typename V::I i, const float* cp, float* p,
                                const uint16_t* ch, uint16_t* hp, const int8_t* q8, const uint8_t* u8, size_t n,
                                int8_t* q, int32_t* s, const typename V::F* fs) {
  { V::kLanes } -> std::convertible_to<size_t>;
  { V::load(cp) } -> std::same_as<typename V::F>;
  V::store(p, f);
  { V::set1(1.0f) } -> std::same_as<typename V::F>;
  { V::fmadd(f, f, f) } -> std::same_as<typename V::F>;
  { V::fmsub(f, f, f) } -> std::same_as<typename V::F>;
  { V::max(f, f) } -> std::same_as<typename V::F>;
  { V::load_tail(cp, n) } -> std::same_as<typename V::F>;
  V::store_tail(p, f, n);
  { V::keep(f, n) } -> std::same_as<typename V::F>;
  { V::hsum(f) } -> std::same_as<float>;
  V::template hsums<2>(fs, p);
  { V::max_with_tail(f, cp, n) } -> std::same_as<float>;
  { V::exp(f) } -> std::same_as<typename V::F>;
  { V::rotate_pairs(f, f) } -> std::same_as<typename V::F>;
  V::split_cos_sin(f, f, &f, &f);
  { V::i8_to_f32(q8) } -> std::same_as<typename V::F>;
  V::nibbles_to_f32(u8, &f, &f);
  { V::load_h(ch) } -> std::same_as<typename V::H>;
  V::store_h(hp, h);
  { V::load_h_tail(ch, n) } -> std::same_as<typename V::H>;
  V::store_h_tail(hp, h, n);
  { V::from_fp16(h) } -> std::same_as<typename V::F>;
  { V::to_fp16(f) } -> std::same_as<typename V::H>;
  { V::from_bf16(h) } -> std::same_as<typename V::F>;
  { V::to_bf16(f) } -> std::same_as<typename V::H>;
  { V::load_i(u8) } -> std::same_as<typename V::I>;
  { V::set1_i8(1) } -> std::same_as<typename V::I>;
  { V::template shl16<2>(i) } -> std::same_as<typename V::I>;
  { V::template shr16<2>(i) } -> std::same_as<typename V::I>;
  { V::set1_i32(1u) } -> std::same_as<typename V::I>;
  { V::bf16_even(i) } -> std::same_as<typename V::F>;
  { V::bf16_odd(i) } -> std::same_as<typename V::F>;
  { V::bf16_dot_instruction() } -> std::same_as<bool>;
  V::quantize_q8_32(cp, n, q, p, s);
  V::prepare_q8_256(cp, n, static_cast<void*>(q));
};

}  // namespace kiln::kernels::x86
