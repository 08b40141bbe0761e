// Reference dequantization of the 256-element K-quant super-blocks (Q2_K..Q6_K) and the
// Q8_K activation format with its quantizer.
//
// Each element is reconstructed with ggml's operations in ggml's order (sub-block scale
// first: (d * sc) * q - (dmin * m)), since float rounding makes any other order differ in
// the last bit from the dequantized tensors llama.cpp computes. The loops walk elements
// in output order and find each quant through the layout documented in kernels/quant.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant.h"

namespace kiln::kernels::ref {
namespace {

// Q2_K and Q3_K keep the low 2 bits of element e = 128*h + 32*s + l in bits 2s..2s+1 of
// qs[32*h + l]: one byte serves four elements 32 apart.
int low2(const uint8_t* qs, size_t e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
}

// Q3_K's 16 six-bit scales, stored biased by 32.
int q3_scale(const uint8_t* scales, int j) {
  const int low4 = j < 8 ? scales[j] & 0x0F : scales[j - 8] >> 4;
  const int high2 = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low4 | high2 << 4) - 32;
}

// round to nearest, ties to even, as ggml's nearest_int (valid for |x| < 2^22).
int nearest_int(float x) { return static_cast<int>(std::lrintf(x)); }

}  // namespace

void dequantize_row_q2_K(const block_q2_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (size_t sub = 0; sub < QK_K / 16; ++sub) {
      const uint8_t sc = x[i].scales[sub];
      const float dl = d * (sc & 0x0F);
      const float ml = dmin * (sc >> 4);
      for (size_t e = 16 * sub; e < 16 * sub + 16; ++e) y[e] = dl * low2(x[i].qs, e) - ml;
    }
  }
}

void dequantize_row_q3_K(const block_q3_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t sub = 0; sub < QK_K / 16; ++sub) {
      const float dl = d * q3_scale(x[i].scales, int(sub));
      for (size_t e = 16 * sub; e < 16 * sub + 16; ++e) {
        // The high bit is stored inverted: a clear bit means q - 4, so q spans -4..3.
        const bool high = (x[i].hmask[e % 32] >> (e / 32)) & 1;
        y[e] = dl * (low2(x[i].qs, e) - (high ? 0 : 4));
      }
    }
  }
}

void dequantize_row_q4_K(const block_q4_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      unpack_scale_min_k4(x[i].scales, sub, &sc, &m);
      const float dl = d * sc;
      const float ml = dmin * m;
      const uint8_t* q = x[i].qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (size_t l = 0; l < 32; ++l) y[32 * sub + l] = dl * ((q[l] >> shift) & 0x0F) - ml;
    }
  }
}

void dequantize_row_q5_K(const block_q5_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      unpack_scale_min_k4(x[i].scales, sub, &sc, &m);
      const float dl = d * sc;
      const float ml = dmin * m;
      const uint8_t* q = x[i].qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (size_t l = 0; l < 32; ++l) {
        const int high = (x[i].qh[l] >> sub) & 1;
        y[32 * sub + l] = dl * (((q[l] >> shift) & 0x0F) | high << 4) - ml;
      }
    }
  }
}

void dequantize_row_q6_K(const block_q6_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t e = 0; e < QK_K; ++e) {
      const size_t h = e / 128, g = e % 128 / 32, l = e % 32;
      const int low4 = (x[i].ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
      const int high2 = (x[i].qh[32 * h + l] >> (2 * g)) & 3;
      // ggml multiplies d by the int8 scale first, then by the centred quant.
      y[e] = d * x[i].scales[e / 16] * ((low4 | high2 << 4) - 32);
    }
  }
}

void dequantize_row_q8_K(const block_q8_K* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, y += QK_K)
    for (size_t j = 0; j < QK_K; ++j) y[j] = x[i].d * x[i].qs[j];
}

void quantize_row_q8_K(const float* x, block_q8_K* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float amax = 0.0f, max = 0.0f;
    for (size_t j = 0; j < QK_K; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0.0f) {  // ggml leaves bsums unwritten here; zero is what they would sum to
      std::memset(&y[i], 0, sizeof(y[i]));
      continue;
    }
    // -127/max rather than 127/amax: ggml's choice (its SIMD IQ2 dot products rely on the
    // largest value mapping to -127), kept so Q8_K activations match llama.cpp's.
    const float iscale = -127.0f / max;
    for (size_t j = 0; j < QK_K; ++j)
      y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (size_t s = 0; s < QK_K / 16; ++s) {
      int sum = 0;
      for (size_t j = 16 * s; j < 16 * s + 16; ++j) sum += y[i].qs[j];
      y[i].bsums[s] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace kiln::kernels::ref
