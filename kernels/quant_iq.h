#pragma once
// ggml's i-quant and ternary block formats (IQ1..IQ4, TQ1_0, TQ2_0), byte for byte as GGUF
// files store them, and their scalar reference (kernels/scalar/quant_iq*.cpp), held to
// the same contract as kernels/quant.h: dequantize_row gives ggml's floats bit for bit,
// quantize_row ggml's bytes (with the same importance weights, where a type needs them).
//
// Most i-quants store, per group of 8 (or 4) elements, an index into a published codebook
// of lattice points (kernels/iq_grids.cpp) plus sign bits, under a 4-bit (or 3-bit) scale
// per 16 or 32 elements and an fp16 scale per 256. IQ4_NL/IQ4_XS store 4-bit indices
// into the 16 non-uniform values kIq4nlValues. TQ1_0/TQ2_0 store ternary values {-1,0,1}.
#include <cstddef>
#include <cstdint>

#include "kernels/quant.h"

namespace kiln::kernels {

inline constexpr size_t QK4_NL = 32;

// Groups of 32 (g = 0..7) in qs[4g..4g+3], read as two little-endian uint32: the first holds
// four kIq2xxsGrid indices (byte l for elements 8l..8l+7 of the group), the second four
// 7-bit sign fields (bits 7l..7l+6; bit j set negates element j, and element 7's sign is
// the field's parity, so negatives are even) and a 4-bit scale ls in bits 28..31.
// x = (d * (0.5 + ls)) * 0.25 * grid byte * sign.
struct block_iq2_xxs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
};
// Groups of 8: qs[k] = kIq2xsGrid index (bits 0..8) | 7 sign bits (9..15, parity as
// IQ2_XXS). The group of 32 g has 4-bit scales in scales[g]: low nibble for its first 16
// elements, high for the rest. x = (d * (0.5 + ls)) * 0.25 * grid byte * sign.
struct block_iq2_xs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
  uint8_t scales[QK_K / 32];
};
// Groups of 8 (k = 0..31): kIq2sGrid index qs[k] | bits 2(k%4)..+1 of qh[k/4] as bits 8..9;
// 8 explicit signs in qs[32 + k] (bit j negates element j). Scales as IQ2_XS.
struct block_iq2_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t scales[QK_K / 32];
};
// Groups of 4 (k = 0..63): kIq3xxsGrid index qs[k]. qs[64..96) are 8 little-endian uint32,
// one per group of 32: four 7-bit sign fields for its groups of 8 (parity as IQ2_XXS) and
// a 4-bit scale in bits 28..31. x = (d * (0.5 + ls)) * 0.5 * grid byte * sign.
struct block_iq3_xxs {
  uint16_t d;
  uint8_t qs[3 * QK_K / 8];
};
// Groups of 4 (k = 0..63): kIq3sGrid index qs[k] | bit k%8 of qh[k/8] as bit 8; 8 explicit
// signs per group of 8 in signs[]. Group of 32 g: 4-bit scale s, nibble g%2 of scales[g/2];
// x = (d * (1 + 2s)) * grid byte * sign.
struct block_iq3_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t signs[QK_K / 8];
  uint8_t scales[QK_K / 64];
};
// Groups of 8 (k = 0..31): kIq1sGrid index qs[k] | bits 3(k%4)..+2 of qh[k/4] as bits
// 8..10. qh[g] (group of 32) also holds a 3-bit scale s in bits 12..14 and the delta's sign
// in bit 15 (set: -kIq1Delta). x = (d * (2s + 1)) * (grid value + delta).
struct block_iq1_s {
  uint16_t d;
  uint8_t qs[QK_K / 8];
  uint16_t qh[QK_K / 32];
};
// No d field: the fp16 super-block scale is spread over the top nibbles of the four
// little-endian uint16 words of scales (word 0's is its lowest nibble). Groups of 8 as
// IQ1_S, except that the high index bits and the delta's sign are a nibble of qh per group
// (bits 0..2, bit 3; group k in nibble k%2 of qh[k/2]). Group of 32 g: 3-bit scales at bits
// 6(g%2) (first 16 elements) and 6(g%2) + 3 (last 16) of word g/2.
// x = (d * (2s + 1)) * (grid value + delta).
struct block_iq1_m {
  uint8_t qs[QK_K / 8];
  uint8_t qh[QK_K / 16];
  uint8_t scales[QK_K / 32];
};
// x = d * kIq4nlValues[q]; nibbles as Q4_0 (element j < 16 low nibble of qs[j], j + 16
// its high nibble).
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[QK4_NL / 2];
};
// Eight IQ4_NL-style groups of 32 in qs[16g..16g+16), each with a 6-bit scale: low 4 bits
// nibble g%2 of scales_l[g/2], high 2 bits bits 2g..2g+1 of scales_h.
// x = (d * (ls - 32)) * kIq4nlValues[q].
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
// Ternary, base 3: each byte holds 5 (qh: 4) digits t as the fraction value/243 rounded up
// to 8 bits; digit n is ((uint8_t)(byte * 3^n) * 3) >> 8. x = (t - 1) * d. Elements: digit 0
// of qs[0..32), digit 1 of them, ... digit 4; the same for qs[32..48); then qh's digits 0..3.
struct block_tq1_0 {
  uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
  uint8_t qh[QK_K / 64];
  uint16_t d;
};
// Ternary, 2 bits: element 128h + 32l + m is bits 2l..2l+1 of qs[32h + m], value t;
// x = (t - 1) * d.
struct block_tq2_0 {
  uint8_t qs[QK_K / 4];
  uint16_t d;
};

static_assert(sizeof(block_iq2_xxs) == 66);
static_assert(sizeof(block_iq2_xs) == 74);
static_assert(sizeof(block_iq2_s) == 82);
static_assert(sizeof(block_iq3_xxs) == 98);
static_assert(sizeof(block_iq3_s) == 110);
static_assert(sizeof(block_iq1_s) == 50);
static_assert(sizeof(block_iq1_m) == 56);
static_assert(sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_iq4_xs) == 136);
static_assert(sizeof(block_tq1_0) == 54);
static_assert(sizeof(block_tq2_0) == 66);

// IQ4_NL/IQ4_XS: the 16 values a 4-bit index selects (times the block scale).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// IQ1_S/IQ1_M: each grid value v in {-1, 0, 1} means v + delta (delta = +-kIq1Delta).
inline constexpr float kIq1Delta = 0.125f;

// Codebooks (kernels/iq_grids.cpp). uint64_t entries: 8 bytes, element 0 lowest; uint32_t:
// 4 bytes. IQ2 grids hold magnitudes 8, 25, 43; IQ3 grids odd magnitudes 4..62; the IQ1
// grid signed bytes -1, 0, 1.
extern const uint64_t kIq2xxsGrid[256];
extern const uint64_t kIq2xsGrid[512];
extern const uint64_t kIq2sGrid[1024];
extern const uint32_t kIq3xxsGrid[256];
extern const uint32_t kIq3sGrid[512];
extern const uint64_t kIq1sGrid[2048];

}  // namespace kiln::kernels

namespace kiln::kernels::ref {

// ggml's dequantize_row_* of each type (n a multiple of the block size), bit for bit.
void dequantize_row_iq2_xxs(const block_iq2_xxs* x, float* y, size_t n);
void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, size_t n);
void dequantize_row_iq2_s(const block_iq2_s* x, float* y, size_t n);
void dequantize_row_iq3_xxs(const block_iq3_xxs* x, float* y, size_t n);
void dequantize_row_iq3_s(const block_iq3_s* x, float* y, size_t n);
void dequantize_row_iq1_s(const block_iq1_s* x, float* y, size_t n);
void dequantize_row_iq1_m(const block_iq1_m* x, float* y, size_t n);
void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, size_t n);
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, size_t n);
void dequantize_row_tq1_0(const block_tq1_0* x, float* y, size_t n);
void dequantize_row_tq2_0(const block_tq2_0* x, float* y, size_t n);

// quantize_row (kernels/quant.h) of IQ4_XS, TQ1_0 and TQ2_0 is ggml's quantize_row_*_ref.
// IQ4_NL's is what ggml_quantize_chunk writes without importance (llama-quantize's bytes):
// ggml's quantize_row_iq4_nl_ref skips the scale search and leaves an all-zero block's
// indices undefined, so it has no bytes to match.
void quantize_row_iq4_nl(const float* x, block_iq4_nl* y, size_t n);
void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, size_t n);
void quantize_row_tq1_0(const float* x, block_tq1_0* y, size_t n);
void quantize_row_tq2_0(const float* x, block_tq2_0* y, size_t n);

// Types ggml will not quantize without importance weights (IQ2_XXS, IQ2_XS, IQ1_S).
bool quantize_requires_importance(TensorType type);

// The per-type quantizers behind quantize_chunk, each ggml's quantize_<type>(src, dst,
// n_rows, n_per_row, importance) (same contract as quantize_chunk, n_per_row already
// checked). With importance, the legacy and K types search each block's scale(s) for the
// weighted least-squares fit (weights importance[j] * sqrt(sigma^2 + x_j^2)); without, they
// are quantize_row's *_ref bytes. IQ4_NL/IQ4_XS use the importance as weights the same
// way; the ternary types ignore it (kernels/scalar/quant_weighted.cpp,
// quant_iq4_quantize.cpp).
void quantize_q4_0(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q4_1(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q5_0(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q5_1(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q2_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q3_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q4_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q5_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_q6_K(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq4_nl(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq4_xs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
// ggml's codebook-search quantizers (quantize_iq2_xxs, ... in ggml-quants.c), which
// quantize_chunk calls: n_rows rows of n_per_row floats (a multiple of 256, else
// kiln::Error) -> blocks at dst; importance as for quantize_chunk. IQ2_XXS, IQ2_XS and
// IQ1_S throw kiln::Error without importance (ggml refuses them).
void quantize_iq2_xxs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq2_xs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq2_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq3_xxs(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq3_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq1_s(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);
void quantize_iq1_m(const float* src, void* dst, size_t n_rows, size_t n_per_row, const float* importance);

// n_rows rows of n_per_row floats -> n_rows rows of `type` blocks at dst, the bytes of
// ggml_quantize_chunk(type, src, dst, 0, n_rows, n_per_row, importance): importance is
// nullptr or n_per_row weights (column j's, the same for every row; an imatrix's mean
// squared activations), and with it the quantizers that use weights search for the
// weighted least-squares fit as ggml's do (the bytes differ from quantize_row's). Throws
// kiln::Error for a type it cannot write, a missing required importance, or an n_per_row
// that is not a multiple of the block size.
void quantize_chunk(TensorType type, const float* src, void* dst, size_t n_rows, size_t n_per_row,
                    const float* importance);

}  // namespace kiln::kernels::ref
