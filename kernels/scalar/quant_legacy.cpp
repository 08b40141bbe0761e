// Reference (de)quantization of the 32-element legacy formats Q4_0, Q4_1, Q5_0, Q5_1 and
// Q8_0, plus the type table and the by-type entry points for all formats (MXFP4's own
// functions are in quant_mxfp4.cpp, the i-quants' in quant_iq_dequant.cpp).
//
// The quantizers reproduce ggml's *_ref functions bit for bit, so their quirks are kept on
// purpose: the scale is computed in float and only *stored* as fp16 (quants come from the
// unrounded 1/d), the 4/5-bit quants truncate x/d + 8.5 (round half up, not half even),
// Q8_0 rounds half away from zero, and Q4_0/Q5_0 take the sign of d from the value of
// largest magnitude so that value lands exactly on q = 0 (-8 or -16 steps).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::ref {
namespace {

// The signed value of largest magnitude in x[0..n); the first one wins a tie, as in ggml.
float max_by_magnitude(const float* x, size_t n) {
  float amax = 0.0f, max = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, size_t n, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (size_t j = 0; j < n; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// 1/d, or 0 for an all-zero block so every quant becomes the zero point.
float inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// ggml converts x/d + offset to an integer by truncation; the values are >= 0 here, so this
// rounds to nearest with ties up. A NaN (from a non-finite input: a hostile file's weights
// or KV cache) becomes 0: converting it is undefined behaviour, where ggml gets whatever
// the CPU gives.
int trunc_to_int(float v) { return v == v ? static_cast<int>(v) : 0; }

// Bit 4 of each 5-bit quant is kept in a little-endian uint32 (element j -> bit j).
uint32_t load_qh(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
void store_qh(uint8_t qh[4], uint32_t bits) {
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(bits >> (8 * i));
}

}  // namespace

// ---------------------------------------------------------------- dequantize

void dequantize_row_q4_0(const block_q4_0* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = (x[i].qs[j] & 0x0F) - 8;
      const int hi = (x[i].qs[j] >> 4) - 8;
      y[j] = lo * d;
      y[j + QK / 2] = hi * d;
    }
  }
}

void dequantize_row_q4_1(const block_q4_1* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = x[i].qs[j] & 0x0F;
      const int hi = x[i].qs[j] >> 4;
      y[j] = lo * d + m;
      y[j + QK / 2] = hi * d + m;
    }
  }
}

void dequantize_row_q5_0(const block_q5_0* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = int((x[i].qs[j] & 0x0F) | ((qh >> j) & 1) << 4) - 16;
      const int hi = int((x[i].qs[j] >> 4) | ((qh >> (j + QK / 2)) & 1) << 4) - 16;
      y[j] = lo * d;
      y[j + QK / 2] = hi * d;
    }
  }
}

void dequantize_row_q5_1(const block_q5_1* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = int((x[i].qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
      const int hi = int((x[i].qs[j] >> 4) | ((qh >> (j + QK / 2)) & 1) << 4);
      y[j] = lo * d + m;
      y[j + QK / 2] = hi * d + m;
    }
  }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, y += QK) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t j = 0; j < QK; ++j) y[j] = x[i].qs[j] * d;
  }
}

// ---------------------------------------------------------------- quantize

void quantize_row_q4_0(const float* x, block_q4_0* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    // d = max / -8 puts the largest-magnitude value on q = 0 exactly and leaves the other
    // side one step short (-8d .. 7d): the extreme of the opposite sign clamps to 15.
    const float d = max_by_magnitude(x, QK) / -8;
    const float id = inverse(d);
    y[i].d = f32_to_fp16(d);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = std::min(15, trunc_to_int(x[j] * id + 8.5f));
      const int hi = std::min(15, trunc_to_int(x[j + QK / 2] * id + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

void quantize_row_q4_1(const float* x, block_q4_1* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    float min, max;
    min_max(x, QK, &min, &max);
    const float d = (max - min) / 15;
    const float id = inverse(d);
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = std::min(15, trunc_to_int((x[j] - min) * id + 0.5f));
      const int hi = std::min(15, trunc_to_int((x[j + QK / 2] - min) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

void quantize_row_q5_0(const float* x, block_q5_0* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    const float d = max_by_magnitude(x, QK) / -16;
    const float id = inverse(d);
    y[i].d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (size_t j = 0; j < QK / 2; ++j) {
      const int lo = std::min(31, trunc_to_int(x[j] * id + 16.5f));
      const int hi = std::min(31, trunc_to_int(x[j + QK / 2] * id + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
      qh |= uint32_t(lo >> 4 & 1) << j;
      qh |= uint32_t(hi >> 4 & 1) << (j + QK / 2);
    }
    store_qh(y[i].qh, qh);
  }
}

void quantize_row_q5_1(const float* x, block_q5_1* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    float min, max;
    min_max(x, QK, &min, &max);
    const float d = (max - min) / 31;
    const float id = inverse(d);
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    uint32_t qh = 0;
    for (size_t j = 0; j < QK / 2; ++j) {
      // ggml does not clamp here: (max - min) * id cannot round past 31.5.
      const int lo = trunc_to_int((x[j] - min) * id + 0.5f);
      const int hi = trunc_to_int((x[j + QK / 2] - min) * id + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
      qh |= uint32_t(lo >> 4 & 1) << j;
      qh |= uint32_t(hi >> 4 & 1) << (j + QK / 2);
    }
    store_qh(y[i].qh, qh);
  }
}

void quantize_row_q8_0(const float* x, block_q8_0* y, size_t n) {
  for (size_t i = 0; i < n / QK; ++i, x += QK) {
    float amax = 0.0f;
    for (size_t j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = inverse(d);
    y[i].d = f32_to_fp16(d);
    for (size_t j = 0; j < QK; ++j) y[i].qs[j] = static_cast<int8_t>(trunc_to_int(std::round(x[j] * id)));
  }
}

// ---------------------------------------------------------------- by type

namespace {

constexpr QuantTraits kTraits[] = {
    {TensorType::Q4_0, "Q4_0", 32, sizeof(block_q4_0), true, true},
    {TensorType::Q4_1, "Q4_1", 32, sizeof(block_q4_1), true, true},
    {TensorType::Q5_0, "Q5_0", 32, sizeof(block_q5_0), true, true},
    {TensorType::Q5_1, "Q5_1", 32, sizeof(block_q5_1), true, true},
    {TensorType::Q8_0, "Q8_0", 32, sizeof(block_q8_0), true, true},
    {TensorType::Q2_K, "Q2_K", 256, sizeof(block_q2_K), true, true},
    {TensorType::Q3_K, "Q3_K", 256, sizeof(block_q3_K), true, true},
    {TensorType::Q4_K, "Q4_K", 256, sizeof(block_q4_K), true, true},
    {TensorType::Q5_K, "Q5_K", 256, sizeof(block_q5_K), true, true},
    {TensorType::Q6_K, "Q6_K", 256, sizeof(block_q6_K), true, true},
    {TensorType::Q8_K, "Q8_K", 256, sizeof(block_q8_K), true, true},
    {TensorType::MXFP4, "MXFP4", 32, sizeof(block_mxfp4), true, true},
    // i-quants and ternary types: dequantization in quant_iq_dequant.cpp; quantize_row for
    // the types that need no codebook search (the rest: quantize_chunk).
    {TensorType::IQ2_XXS, "IQ2_XXS", 256, sizeof(block_iq2_xxs), false, true},
    {TensorType::IQ2_XS, "IQ2_XS", 256, sizeof(block_iq2_xs), false, true},
    {TensorType::IQ2_S, "IQ2_S", 256, sizeof(block_iq2_s), false, true},
    {TensorType::IQ3_XXS, "IQ3_XXS", 256, sizeof(block_iq3_xxs), false, true},
    {TensorType::IQ3_S, "IQ3_S", 256, sizeof(block_iq3_s), false, true},
    {TensorType::IQ1_S, "IQ1_S", 256, sizeof(block_iq1_s), false, true},
    {TensorType::IQ1_M, "IQ1_M", 256, sizeof(block_iq1_m), false, true},
    {TensorType::IQ4_NL, "IQ4_NL", 32, sizeof(block_iq4_nl), true, true},
    {TensorType::IQ4_XS, "IQ4_XS", 256, sizeof(block_iq4_xs), true, true},
    {TensorType::TQ1_0, "TQ1_0", 256, sizeof(block_tq1_0), true, true},
    {TensorType::TQ2_0, "TQ2_0", 256, sizeof(block_tq2_0), true, true},
};

// Throws unless `supported` and n is whole blocks of t (t may be null: unknown type).
void check(const QuantTraits* t, TensorType type, size_t n, bool supported, const char* what) {
  if (t && supported && n % t->block_size == 0) return;
  const std::string name = t ? t->name : "type " + std::to_string(uint32_t(type));
  if (!t || !supported) throw Error(std::string(what) + ": no reference for " + name);
  throw Error(std::string(what) + ": " + std::to_string(n) + " values are not whole " + name +
              " blocks of " + std::to_string(t->block_size));
}

}  // namespace

const QuantTraits* quant_traits(TensorType type) {
  for (const auto& t : kTraits)
    if (t.type == type) return &t;
  return nullptr;
}
const QuantTraits* quant_traits_begin() { return std::begin(kTraits); }
const QuantTraits* quant_traits_end() { return std::end(kTraits); }

void dequantize_row(TensorType type, const void* src, float* dst, size_t n) {
  const QuantTraits* t = quant_traits(type);
  check(t, type, n, t && t->can_dequantize, "dequantize_row");
  switch (type) {
    case TensorType::Q4_0: return dequantize_row_q4_0(static_cast<const block_q4_0*>(src), dst, n);
    case TensorType::Q4_1: return dequantize_row_q4_1(static_cast<const block_q4_1*>(src), dst, n);
    case TensorType::Q5_0: return dequantize_row_q5_0(static_cast<const block_q5_0*>(src), dst, n);
    case TensorType::Q5_1: return dequantize_row_q5_1(static_cast<const block_q5_1*>(src), dst, n);
    case TensorType::Q8_0: return dequantize_row_q8_0(static_cast<const block_q8_0*>(src), dst, n);
    case TensorType::Q2_K: return dequantize_row_q2_K(static_cast<const block_q2_K*>(src), dst, n);
    case TensorType::Q3_K: return dequantize_row_q3_K(static_cast<const block_q3_K*>(src), dst, n);
    case TensorType::Q4_K: return dequantize_row_q4_K(static_cast<const block_q4_K*>(src), dst, n);
    case TensorType::Q5_K: return dequantize_row_q5_K(static_cast<const block_q5_K*>(src), dst, n);
    case TensorType::Q6_K: return dequantize_row_q6_K(static_cast<const block_q6_K*>(src), dst, n);
    case TensorType::Q8_K: return dequantize_row_q8_K(static_cast<const block_q8_K*>(src), dst, n);
    case TensorType::MXFP4: return dequantize_row_mxfp4(static_cast<const block_mxfp4*>(src), dst, n);
    case TensorType::IQ2_XXS: return dequantize_row_iq2_xxs(static_cast<const block_iq2_xxs*>(src), dst, n);
    case TensorType::IQ2_XS: return dequantize_row_iq2_xs(static_cast<const block_iq2_xs*>(src), dst, n);
    case TensorType::IQ2_S: return dequantize_row_iq2_s(static_cast<const block_iq2_s*>(src), dst, n);
    case TensorType::IQ3_XXS: return dequantize_row_iq3_xxs(static_cast<const block_iq3_xxs*>(src), dst, n);
    case TensorType::IQ3_S: return dequantize_row_iq3_s(static_cast<const block_iq3_s*>(src), dst, n);
    case TensorType::IQ1_S: return dequantize_row_iq1_s(static_cast<const block_iq1_s*>(src), dst, n);
    case TensorType::IQ1_M: return dequantize_row_iq1_m(static_cast<const block_iq1_m*>(src), dst, n);
    case TensorType::IQ4_NL: return dequantize_row_iq4_nl(static_cast<const block_iq4_nl*>(src), dst, n);
    case TensorType::IQ4_XS: return dequantize_row_iq4_xs(static_cast<const block_iq4_xs*>(src), dst, n);
    case TensorType::TQ1_0: return dequantize_row_tq1_0(static_cast<const block_tq1_0*>(src), dst, n);
    case TensorType::TQ2_0: return dequantize_row_tq2_0(static_cast<const block_tq2_0*>(src), dst, n);
    default: break;
  }
  throw Error("dequantize_row: traits and switch disagree");  // unreachable
}

void quantize_row(TensorType type, const float* src, void* dst, size_t n) {
  const QuantTraits* t = quant_traits(type);
  check(t, type, n, t && t->can_quantize, "quantize_row");
  switch (type) {
    case TensorType::Q4_0: return quantize_row_q4_0(src, static_cast<block_q4_0*>(dst), n);
    case TensorType::Q4_1: return quantize_row_q4_1(src, static_cast<block_q4_1*>(dst), n);
    case TensorType::Q5_0: return quantize_row_q5_0(src, static_cast<block_q5_0*>(dst), n);
    case TensorType::Q5_1: return quantize_row_q5_1(src, static_cast<block_q5_1*>(dst), n);
    case TensorType::Q8_0: return quantize_row_q8_0(src, static_cast<block_q8_0*>(dst), n);
    case TensorType::Q2_K: return quantize_row_q2_K(src, static_cast<block_q2_K*>(dst), n);
    case TensorType::Q3_K: return quantize_row_q3_K(src, static_cast<block_q3_K*>(dst), n);
    case TensorType::Q4_K: return quantize_row_q4_K(src, static_cast<block_q4_K*>(dst), n);
    case TensorType::Q5_K: return quantize_row_q5_K(src, static_cast<block_q5_K*>(dst), n);
    case TensorType::Q6_K: return quantize_row_q6_K(src, static_cast<block_q6_K*>(dst), n);
    case TensorType::Q8_K: return quantize_row_q8_K(src, static_cast<block_q8_K*>(dst), n);
    case TensorType::MXFP4: return quantize_row_mxfp4(src, static_cast<block_mxfp4*>(dst), n);
    case TensorType::IQ4_NL: return quantize_row_iq4_nl(src, static_cast<block_iq4_nl*>(dst), n);
    case TensorType::IQ4_XS: return quantize_row_iq4_xs(src, static_cast<block_iq4_xs*>(dst), n);
    case TensorType::TQ1_0: return quantize_row_tq1_0(src, static_cast<block_tq1_0*>(dst), n);
    case TensorType::TQ2_0: return quantize_row_tq2_0(src, static_cast<block_tq2_0*>(dst), n);
    default: break;
  }
  throw Error("quantize_row: traits and switch disagree");  // unreachable
}

}  // namespace kiln::kernels::ref
