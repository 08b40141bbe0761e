#pragma once
// GGML tensor types as stored in GGUF files, and the block layout each one has.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace kiln {

enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TypeInfo {
  const char* name;
  uint32_t block_size;   // elements per block
  uint32_t block_bytes;  // bytes per block
};

// nullptr for an id this build does not know (the caller names the file and tensor).
const TypeInfo* type_info(uint32_t raw_type);
inline const TypeInfo& type_info(TensorType t) { return *type_info(static_cast<uint32_t>(t)); }
std::string type_name(TensorType t);
std::optional<TensorType> type_from_name(const std::string& name);  // "f16", "BF16", ...
// One float per element (F32, F16, BF16): no blocks, no scales.
constexpr bool is_float_type(TensorType t) {
  return t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16;
}

// IEEE half and bfloat16 <-> float, exact and portable (SIMD versions live in kernels/).
inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {  // inf, or NaN quieted with its payload kept (as vcvtph2ps does)
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_fp16(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((abs >> 13) & 0x3ff));  // quiet NaN, payload kept (as vcvtps2ph)
  if (abs == 0x7f800000) return (uint16_t)(sign | 0x7c00);
  if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000) {                                     // subnormal or zero in half
    if (abs < 0x33000000) return (uint16_t)sign;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    const int shift = 113 - (int)(abs >> 23) + 13;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}

inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace kiln
