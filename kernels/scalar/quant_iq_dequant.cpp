// Reference dequantization of ggml's i-quants (IQ1_S..IQ4_XS) and ternary types (TQ1_0,
// TQ2_0), layouts in kernels/quant_iq.h.
//
// Bit for bit with ggml's dequantize_row_*: each scale is formed with ggml's operations in
// ggml's association order (IQ2_XXS's (d * (0.5 + ls)) * 0.25), and each element is
// scale * magnitude, then times +-1, as ggml writes it. With normal numbers every product
// here is exact (an fp16 d has 11 significant bits, the sub-scales and magnitudes at most
// 13 together), so the order shows only where a product leaves float's normal range
// (subnormal or overflowing scales); it is kept for those. Multi-byte fields are
// assembled from bytes, so the code reads the little-endian file layout on any host.
#include <bit>

#include "kernels/quant_iq.h"

namespace kiln::kernels::ref {
namespace {

// Element j (0..7) of a packed codebook entry: byte j, element 0 lowest.
inline uint8_t grid_u8(uint64_t entry, int j) { return static_cast<uint8_t>(entry >> (8 * j)); }
inline int8_t grid_i8(uint64_t entry, int j) { return static_cast<int8_t>(entry >> (8 * j)); }

// The IQ2/IQ3_XXS types store 7 sign bits per group of 8; the quantizer flips the least
// important element so the number of negatives is even, hence the 8th bit is the parity.
inline uint8_t expand_signs(uint32_t seven) {
  seven &= 127;
  return static_cast<uint8_t>(seven | (std::popcount(seven) & 1) << 7);
}
inline float sign_of(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }

inline uint32_t u32_of_u16(const uint16_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 16; }
inline uint32_t u32_of_bytes(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline uint16_t u16_of_bytes(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// Base-3 digit n (0 = most significant) of a TQ1_0 byte, which holds up to five trits as
// the fraction value / 243 rounded up to 8 bits: multiplying by 3^n (mod 256) drops the
// leading digits, and the top of 3 * that fraction is the next one.
inline int trit(uint8_t byte, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t shifted = static_cast<uint8_t>(byte * kPow3[n]);
  return (uint16_t(shifted) * 3) >> 8;
}

}  // namespace

void dequantize_row_iq2_xxs(const block_iq2_xxs* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const uint32_t idx = u32_of_u16(x[i].qs + 4 * g);
      const uint32_t aux = u32_of_u16(x[i].qs + 4 * g + 2);
      const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint64_t entry = kIq2xxsGrid[(idx >> (8 * l)) & 0xff];
        const uint8_t signs = expand_signs(aux >> (7 * l));
        for (int j = 0; j < 8; ++j) y[j] = db * float(grid_u8(entry, j)) * sign_of(signs, j);
      }
    }
  }
}

void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const uint8_t sc = x[i].scales[g];
      const float db[2] = {d * (0.5f + float(sc & 0x0f)) * 0.25f, d * (0.5f + float(sc >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = x[i].qs[4 * g + l];
        const uint64_t entry = kIq2xsGrid[q & 511];
        const uint8_t signs = expand_signs(q >> 9);
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * float(grid_u8(entry, j)) * sign_of(signs, j);
      }
    }
  }
}

void dequantize_row_iq2_s(const block_iq2_s* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const uint8_t* signs = x[i].qs + QK_K / 8;
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const uint8_t sc = x[i].scales[g];
      const float db[2] = {d * (0.5f + float(sc & 0x0f)) * 0.25f, d * (0.5f + float(sc >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t index = x[i].qs[4 * g + l] | ((uint32_t(x[i].qh[g]) >> (2 * l)) & 3) << 8;
        const uint64_t entry = kIq2sGrid[index];
        const uint8_t s = signs[4 * g + l];
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * float(grid_u8(entry, j)) * sign_of(s, j);
      }
    }
  }
}

void dequantize_row_iq3_xxs(const block_iq3_xxs* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const uint8_t* qs = x[i].qs;
    const uint8_t* scales_signs = x[i].qs + QK_K / 4;
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const uint32_t aux = u32_of_bytes(scales_signs + 4 * g);
      const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = expand_signs(aux >> (7 * l));
        const uint32_t lo = kIq3xxsGrid[qs[8 * g + 2 * l]], hi = kIq3xxsGrid[qs[8 * g + 2 * l + 1]];
        for (int j = 0; j < 4; ++j) {
          y[j] = db * float(grid_u8(lo, j)) * sign_of(signs, j);
          y[j + 4] = db * float(grid_u8(hi, j)) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

void dequantize_row_iq3_s(const block_iq3_s* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const int sc = (x[i].scales[g / 2] >> (4 * (g % 2))) & 0x0f;
      const float db = d * float(1 + 2 * sc);
      const uint8_t qh = x[i].qh[g];
      for (int l = 0; l < 4; ++l, y += 8) {
        // Grid entry k (0..7) of this group of 32 takes bit k of qh as its index bit 8.
        const uint32_t lo = kIq3sGrid[x[i].qs[8 * g + 2 * l] | ((qh >> (2 * l)) & 1) << 8];
        const uint32_t hi = kIq3sGrid[x[i].qs[8 * g + 2 * l + 1] | ((qh >> (2 * l + 1)) & 1) << 8];
        const uint8_t s = x[i].signs[4 * g + l];
        for (int j = 0; j < 4; ++j) {
          y[j] = db * float(grid_u8(lo, j)) * sign_of(s, j);
          y[j + 4] = db * float(grid_u8(hi, j)) * sign_of(s, j + 4);
        }
      }
    }
  }
}

void dequantize_row_iq1_s(const block_iq1_s* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const uint16_t qh = x[i].qh[g];
      const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint64_t entry = kIq1sGrid[x[i].qs[4 * g + l] | ((qh >> (3 * l)) & 7) << 8];
        for (int j = 0; j < 8; ++j) y[j] = dl * (float(grid_i8(entry, j)) + delta);
      }
    }
  }
}

void dequantize_row_iq1_m(const block_iq1_m* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    uint16_t sc[4];
    for (int k = 0; k < 4; ++k) sc[k] = u16_of_bytes(x[i].scales + 2 * k);
    // The fp16 scale's nibbles, lowest first, are the top nibbles of sc[0..3].
    const uint16_t d_bits = static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 12) << 4 | (sc[2] >> 12) << 8 |
                                                  (sc[3] >> 12) << 12);
    const float d = fp16_to_f32(d_bits);
    for (size_t g = 0; g < QK_K / 32; ++g) {
      const int shift = 6 * (g % 2);
      // First and second 16 elements of the group: 3-bit scales side by side.
      const float dl[2] = {d * float(2 * ((sc[g / 2] >> shift) & 7) + 1),
                           d * float(2 * ((sc[g / 2] >> (shift + 3)) & 7) + 1)};
      for (int l = 0; l < 4; ++l, y += 8) {
        // qh: one nibble per group of 8, low nibble first: index bits 8..10, then the
        // delta's sign.
        const int nib = (x[i].qh[2 * g + l / 2] >> (4 * (l % 2))) & 0x0f;
        const uint64_t entry = kIq1sGrid[x[i].qs[4 * g + l] | (nib & 7) << 8];
        const float delta = nib & 8 ? -kIq1Delta : kIq1Delta;
        for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * (float(grid_i8(entry, j)) + delta);
      }
    }
  }
}

void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK4_NL; ++i, y += QK4_NL) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * float(kIq4nlValues[x[i].qs[j] & 0x0f]);
      y[j + QK4_NL / 2] = d * float(kIq4nlValues[x[i].qs[j] >> 4]);
    }
  }
}

void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t g = 0; g < QK_K / 32; ++g, y += 32) {
      const int low = (x[i].scales_l[g / 2] >> (4 * (g % 2))) & 0x0f;
      const int high = (x[i].scales_h >> (2 * g)) & 3;
      const float dl = d * float((low | high << 4) - 32);
      const uint8_t* qs = x[i].qs + 16 * g;
      for (size_t j = 0; j < 16; ++j) {
        y[j] = dl * float(kIq4nlValues[qs[j] & 0x0f]);
        y[j + 16] = dl * float(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

void dequantize_row_tq1_0(const block_tq1_0* x, float* y, size_t n) {
  constexpr size_t kQs = sizeof(block_tq1_0::qs), kWide = kQs - kQs % 32;
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    // Elements run down the digits of a run of bytes: digit 0 of every byte of the run,
    // then digit 1, ... Runs: qs[0..32) and qs[32..48) (five digits each), then qh (four).
    const auto run = [&](const uint8_t* bytes, size_t count, int digits) {
      for (int t = 0; t < digits; ++t)
        for (size_t m = 0; m < count; ++m) *y++ = float(trit(bytes[m], t) - 1) * d;
    };
    for (size_t j = 0; j < kWide; j += 32) run(x[i].qs + j, 32, 5);
    for (size_t j = kWide; j < kQs; j += 16) run(x[i].qs + j, 16, 5);
    run(x[i].qh, sizeof(block_tq1_0::qh), 4);
  }
}

void dequantize_row_tq2_0(const block_tq2_0* x, float* y, size_t n) {
  for (size_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (size_t j = 0; j < sizeof(block_tq2_0::qs); j += 32)
      for (int l = 0; l < 4; ++l)
        for (size_t m = 0; m < 32; ++m) *y++ = float(((x[i].qs[j + m] >> (2 * l)) & 3) - 1) * d;
  }
}

}  // namespace kiln::kernels::ref
