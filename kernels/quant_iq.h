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

struct block_iq2_xxs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
};
struct block_iq2_xs {
  uint16_t d;
  uint16_t qs[QK_K / 8];
  uint8_t scales[QK_K / 32];
};
struct block_iq2_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t scales[QK_K / 32];
};
struct block_iq3_xxs {
  uint16_t d;
  uint8_t qs[3 * QK_K / 8];
};
struct block_iq3_s {
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t signs[QK_K / 8];
  uint8_t scales[QK_K / 64];
};
struct block_iq1_s {
  uint16_t d;
  uint8_t qs[QK_K / 8];
  uint16_t qh[QK_K / 32];
};
// No d field: the fp16 super-block scale is spread over the top nibbles of the four
// uint16 words of scales.
struct block_iq1_m {
  uint8_t qs[QK_K / 8];
  uint8_t qh[QK_K / 16];
  uint8_t scales[QK_K / 32];
};
struct block_iq4_nl {
  uint16_t d;
  uint8_t qs[QK4_NL / 2];
};
struct block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
struct block_tq1_0 {
  uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
  uint8_t qh[QK_K / 64];
  uint16_t d;
};
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
// The codebook i-quants (kernels/scalar/ of branch iq-quantgrid). IQ2_XXS, IQ2_XS and
// IQ1_S need importance (quantize_chunk checks it).
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
