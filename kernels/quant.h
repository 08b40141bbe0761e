#pragma once
// ggml's quantized block formats, byte for byte as GGUF files store them, and a scalar
// reference (kernels/scalar/quant_legacy.cpp, quant_k.cpp, quant_k_quantize.cpp) that every
// faster path will be tested against.
//
// The reference reproduces ggml bit for bit: dequantize_row gives the floats of ggml's
// dequantize_row_* (same operations in the same order, fp16 scales widened exactly), and
// quantize_row gives the bytes of ggml's deterministic quantize_row_*_ref, the quantizer
// llama-quantize uses when no importance matrix is given. tests/quant_test.cpp checks both
// against a fixture written by llama.cpp.
//
// Float contraction matters for the "bit for bit": ggml's x*d + m is two roundings; a
// compiler that fuses it into an fma (aarch64, or x86 built with -mfma) would differ in
// the last bit. kiln builds these files without FMA flags on x86.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kiln/tensor_type.h"

namespace kiln::kernels {

// Elements per block: 32 for the legacy formats, 256 for the K-quant super-blocks.
inline constexpr size_t QK = 32;
inline constexpr size_t QK_K = 256;
// Bytes holding the 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K (and the 16 six-bit
// scales of Q3_K).
inline constexpr size_t K_SCALE_SIZE = 12;

// All fp16 fields are IEEE half bits (kiln::fp16_to_f32). The file formats are made only
// of uint8_t/int8_t/uint16_t members with no padding, so a struct may be overlaid on file
// bytes at any even address (GGUF tensor data is 32-byte aligned and every block size but
// MXFP4's is even; MXFP4 is bytes only, so any address does).

// x = d * (q - 8), q in 0..15. Element j < 16 is the low nibble of qs[j], element j + 16
// its high nibble.
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[QK / 2];
};

// x = d * q + m, q in 0..15; nibbles as Q4_0.
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[QK / 2];
};

// x = d * (q - 16), q in 0..31: low 4 bits as Q4_0, bit 4 of element j is bit j of qh
// (a little-endian uint32, kept as bytes so the block stays 2-byte aligned).
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};

// x = d * q + m, q in 0..31; bits as Q5_0.
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};

// x = d * q, q in -127..127 (the quantizer never writes -128).
struct block_q8_0 {
  uint16_t d;
  int8_t qs[QK];
};

// 16 sub-blocks of 16: x = d * sc * q - dmin * m, q in 0..3, sc and m 4-bit (low and high
// nibble of scales[sub-block]). Element e = 128*h + 32*s + l (l < 32) has its q in bits
// 2s..2s+1 of qs[32*h + l].
struct block_q2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  uint16_t d;
  uint16_t dmin;
};

// 16 sub-blocks of 16: x = d * (sc - 32) * (q - 4*!high), sc 6-bit, q's low 2 bits placed
// as in Q2_K and its high bit at bit e/32 of hmask[e % 32] (a clear bit subtracts 4).
// Scale j: low 4 bits are the low (j < 8) or high (j >= 8) nibble of scales[j % 8], high
// 2 bits are bits 2*(j/4)..+1 of scales[8 + j % 4].
struct block_q3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[K_SCALE_SIZE];
  uint16_t d;
};

// 8 sub-blocks of 32: x = d * sc * q - dmin * m, sc and m 6-bit, q in 0..15. Sub-block b
// sits in qs[32*(b/2) ..], low nibbles for even b, high for odd. Scales and mins: for
// b < 4, sc = scales[b] & 63 and m = scales[b+4] & 63; for b >= 4 the low 4 bits come
// from scales[b+4] (sc low nibble, m high nibble) and the top 2 bits from bits 6..7 of
// scales[b-4] (sc) and scales[b] (m).
struct block_q4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};

// As Q4_K with q in 0..31: bit 4 of element e is bit e/32 of qh[e % 32].
struct block_q5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};

// 16 sub-blocks of 16: x = d * sc * (q - 32), sc int8, q 6-bit. Element e = 128*h + 32*g
// + l: low 4 bits are the (g < 2 ? low : high) nibble of ql[64*h + 32*(g % 2) + l], high
// 2 bits are bits 2g..2g+1 of qh[32*h + l].
struct block_q6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};

// OCP Microscaling MXFP4: x = 2^(e - 127) * E2M1(q). e is an E8M0 power of two (255,
// NaN in the spec, is never written); q is a 4-bit float, sign bit 3, magnitudes 0, 0.5,
// 1, 1.5, 2, 3, 4, 6. Nibbles as Q4_0: element j < 16 is the low nibble of qs[j],
// element j + 16 its high nibble. Kernels use the doubled magnitudes (kMxfp4Values, small
// integers that fit int8 dot products) with half the block's scale (mxfp4_half_scale).
struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[QK / 2];
};

// 2 * E2M1(q) for each code q: bit 3 is the sign (so code 8 is -0, here 0).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128), half of the E8M0 scale, exact: e - 1 is the float exponent field for e >= 2;
// e = 1 and e = 0 are the subnormals 2^-127 and 2^-128 (mantissa bit 22, bit 21).
inline float mxfp4_half_scale(uint8_t e) {
  const uint32_t bits = e >= 2 ? uint32_t(e - 1) << 23 : uint32_t(0x00200000) << e;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Activations for K-quant dot products (never stored in files): x = d * q with a float d,
// and bsums[i] = sum of the 16 q of sub-block i so dot products can fold the mins in.
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};

static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);
static_assert(sizeof(block_mxfp4) == 17);

}  // namespace kiln::kernels

namespace kiln::kernels::ref {

struct QuantTraits {
  TensorType type;
  const char* name;
  uint32_t block_size;   // elements per block
  uint32_t block_bytes;  // bytes per block
  bool can_quantize;     // quantize_row supports it
  bool can_dequantize;   // dequantize_row supports it
};

// The quantized types this reference knows, or nullptr (F32/F16/BF16 are not here).
const QuantTraits* quant_traits(TensorType type);
// Every entry, for tests and tools that iterate.
const QuantTraits* quant_traits_begin();
const QuantTraits* quant_traits_end();

// n values of `type` at src (n a multiple of the block size) -> n floats. Supported: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4, and the i-quant and
// ternary types of kernels/quant_iq.h. Throws kiln::Error for other types or a bad n; src
// needs the block's alignment (2 bytes, 4 for Q8_K).
void dequantize_row(TensorType type, const void* src, float* dst, size_t n);

// n floats -> n / block_size blocks of `type` at dst, exactly as ggml's *_ref quantizers.
// Supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4, and
// IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 (kernels/quant_iq.h; with importance weights: quantize_chunk). Throws
// kiln::Error otherwise. The K-quants search for their scales (up to 20 candidate grids
// per sub-block), so they are far slower than the legacy formats: about 10 million values
// per second per thread for Q2_K/Q4_K/Q6_K, 20-40 million for Q5_K/Q3_K.
void quantize_row(TensorType type, const float* src, void* dst, size_t n);

// The per-type functions behind the two above (n elements, a multiple of the block size).
void dequantize_row_q4_0(const block_q4_0* x, float* y, size_t n);
void dequantize_row_q4_1(const block_q4_1* x, float* y, size_t n);
void dequantize_row_q5_0(const block_q5_0* x, float* y, size_t n);
void dequantize_row_q5_1(const block_q5_1* x, float* y, size_t n);
void dequantize_row_q8_0(const block_q8_0* x, float* y, size_t n);
void dequantize_row_q2_K(const block_q2_K* x, float* y, size_t n);
void dequantize_row_q3_K(const block_q3_K* x, float* y, size_t n);
void dequantize_row_q4_K(const block_q4_K* x, float* y, size_t n);
void dequantize_row_q5_K(const block_q5_K* x, float* y, size_t n);
void dequantize_row_q6_K(const block_q6_K* x, float* y, size_t n);
void dequantize_row_q8_K(const block_q8_K* x, float* y, size_t n);
void dequantize_row_mxfp4(const block_mxfp4* x, float* y, size_t n);

void quantize_row_q4_0(const float* x, block_q4_0* y, size_t n);
void quantize_row_q4_1(const float* x, block_q4_1* y, size_t n);
void quantize_row_q5_0(const float* x, block_q5_0* y, size_t n);
void quantize_row_q5_1(const float* x, block_q5_1* y, size_t n);
void quantize_row_q8_0(const float* x, block_q8_0* y, size_t n);
void quantize_row_q2_K(const float* x, block_q2_K* y, size_t n);
void quantize_row_q3_K(const float* x, block_q3_K* y, size_t n);
void quantize_row_q4_K(const float* x, block_q4_K* y, size_t n);
void quantize_row_q5_K(const float* x, block_q5_K* y, size_t n);
void quantize_row_q6_K(const float* x, block_q6_K* y, size_t n);
void quantize_row_q8_K(const float* x, block_q8_K* y, size_t n);
void quantize_row_mxfp4(const float* x, block_mxfp4* y, size_t n);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K scales array: sub-blocks
// 0..3 keep them in bytes j and j + 4; 4..7 put their low 4 bits in byte j + 4 and their
// top 2 bits in the spare bits of bytes j - 4 and j. Inline: the SIMD kernels call it per
// super-block.
inline void unpack_scale_min_k4(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0F) | (scales[j - 4] >> 6) << 4);
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | (scales[j] >> 6) << 4);
  }
}

// All eight: byte j of .sc and .m is unpack_scale_min_k4's sc and m of sub-block j. Each
// rule above applies to four sub-blocks at once on 32-bit words (bytes 0..3, 4..7,
// 8..11), which the decode kernels need per super-block: eight scalar calls cost them
// as much as the dot products (Q4_K expert rows at a third of the packed speed).
struct ScalesMinsK4 {
  uint64_t sc, m;
};
inline ScalesMinsK4 unpack_scales_mins_k4(const uint8_t* scales) {
  uint32_t u0, u1, u2;
  __builtin_memcpy(&u0, scales, 4);
  __builtin_memcpy(&u1, scales + 4, 4);
  __builtin_memcpy(&u2, scales + 8, 4);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
  const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
  return {sc_lo | uint64_t{sc_hi} << 32, m_lo | uint64_t{m_hi} << 32};
}

}  // namespace kiln::kernels::ref
