// AVX-512 VNNI gemm on the codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M), the ternary TQ1_0 / TQ2_0 and IQ4_XS (a MoE's experts, which stay
// unpacked) in the file's layout, against activations
// quantized per 256 elements as ggml's Q8_K (d = amax / 127, q rounded to nearest).
//
// Weights are integers q (|q| <= 62; IQ4_XS 127) times a float scale per sub-block of 16
// (kernels/x86/iquant_decode_avx512.h decodes a block), so a block's dot product with
// 8-bit activations is exact in int32 per sub-block. Both sides are stored in an order
// where every lane of a block's four 64-byte vectors belongs to one sub-block in all four
// (Order: sub-block s of 16 in lane s, or of 32 in lanes 2s and 2s + 1): the four
// vpdpbusd of a block chain into one vector of sub-block sums, which meets the 16 lane
// scales in one multiply-add. vpdpbusd wants unsigned
// weights: they are stored as q + 128 (ternary: + 1) and each chain starts at -128 (1) x
// the sum of the activation bytes it meets (stored with the activations).
//
// Prefill: a tile of kRw weight rows is decoded once into an L1/L2-resident buffer and
// met by every activation row of the chunk the stack holds (decoding costs as much as a
// few rows' dot products, so it must not repeat per activation row). Decode (one row) runs
// the same code: every output (weight row, activation row) is the same sequence of
// operations over its blocks in k order whatever the tile, the batch or the row split, and
// the horizontal sum is Vec::hsum's fixed tree (kernels.h's determinism contract).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/quant_iq.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/iquant_decode_avx512.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

constexpr size_t kMaxK = 16384;
constexpr size_t kMaxBlocks = kMaxK / 256;
constexpr int kRw = 4;                   // weight rows decoded per tile
constexpr int kRb = 4;                   // activation rows per register tile
constexpr size_t kActBytes = 96 * 1024;  // activation rows held per chunk (at least kRb)

// One decoded block of one weight row: q + 128 transposed, and the 16 sub-block scales.
struct WBlock {
  __m512i u[4];
  __m512 scale;
};

// Element order -> sub-block lanes: out[c] lane s = elements 16s + 4c .. 16s + 4c + 3,
// i.e. dword 4s + c of the block; two rounds of two-source dword permutes.
inline void to_lanes(const __m512i in[4], __m512i out[4]) {
  // Dwords c, c + 4, c + 8, c + 12 of a and of b, for c = c0 and c0 + 1.
  const __m512i pick01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
  const __m512i pick23 = _mm512_set_epi32(31, 27, 23, 19, 15, 11, 7, 3, 30, 26, 22, 18, 14, 10, 6, 2);
  const __m512i lo8 = _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i hi8 = _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8);
  const __m512i a01 = _mm512_permutex2var_epi32(in[0], pick01, in[1]),
                a23 = _mm512_permutex2var_epi32(in[0], pick23, in[1]);
  const __m512i b01 = _mm512_permutex2var_epi32(in[2], pick01, in[3]),
                b23 = _mm512_permutex2var_epi32(in[2], pick23, in[3]);
  out[0] = _mm512_permutex2var_epi32(a01, lo8, b01);
  out[1] = _mm512_permutex2var_epi32(a01, hi8, b01);
  out[2] = _mm512_permutex2var_epi32(a23, lo8, b23);
  out[3] = _mm512_permutex2var_epi32(a23, hi8, b23);
}

template <TensorType T>
constexpr size_t kBlockBytes = T == TensorType::IQ2_XXS   ? sizeof(block_iq2_xxs)
                               : T == TensorType::IQ2_XS  ? sizeof(block_iq2_xs)
                               : T == TensorType::IQ2_S   ? sizeof(block_iq2_s)
                               : T == TensorType::IQ3_XXS ? sizeof(block_iq3_xxs)
                               : T == TensorType::IQ3_S   ? sizeof(block_iq3_s)
                               : T == TensorType::IQ1_S   ? sizeof(block_iq1_s)
                               : T == TensorType::IQ1_M   ? sizeof(block_iq1_m)
                               : T == TensorType::TQ1_0   ? sizeof(block_tq1_0)
                               : T == TensorType::IQ4_XS  ? sizeof(block_iq4_xs)
                                                          : sizeof(block_tq2_0);

// The order a type's decoder gives (kernels/x86/iquant_decode_avx512.h): transposed here
// into sub-block lanes (scales per 16), already in the qword interleave (scales per 32),
// or left in element order (one scale per block: any order that both sides share works).
enum class Order { lanes16, lanes32, natural };
template <TensorType T>
constexpr Order kOrder = T == TensorType::IQ2_XXS || T == TensorType::IQ3_XXS || T == TensorType::IQ3_S ||
                                 T == TensorType::IQ1_S || T == TensorType::IQ4_XS
                             ? Order::lanes32
                         : T == TensorType::TQ1_0 || T == TensorType::TQ2_0 ? Order::natural
                                                                            : Order::lanes16;

// Weights are stored unsigned as q + kOffset: 128 (a flip of the top bit), or for the
// ternary types the digit their bytes hold (q + 1). kRaw: the decoder gives q + kOffset.
template <TensorType T>
constexpr int kOffset = T == TensorType::TQ1_0 || T == TensorType::TQ2_0 ? 1 : 128;
template <TensorType T>
constexpr bool kRaw = T == TensorType::TQ1_0 || T == TensorType::TQ2_0 || T == TensorType::IQ4_XS;

template <TensorType T>
inline void decode(const uint8_t* blk, WBlock& out) {
  IqBlock b;
  if constexpr (T == TensorType::IQ2_XXS)
    iq_decode_iq2_xxs(blk, b);
  else if constexpr (T == TensorType::IQ2_XS)
    iq_decode_iq2_xs(blk, b);
  else if constexpr (T == TensorType::IQ2_S)
    iq_decode_iq2_s(blk, b);
  else if constexpr (T == TensorType::IQ3_XXS)
    iq_decode_iq3_xxs(blk, b);
  else if constexpr (T == TensorType::IQ3_S)
    iq_decode_iq3_s(blk, b);
  else if constexpr (T == TensorType::IQ1_S)
    iq_decode_iq1_s(blk, b);
  else if constexpr (T == TensorType::IQ1_M)
    iq_decode_iq1_m(blk, b);
  else if constexpr (T == TensorType::TQ1_0)
    iq_decode_tq1_0(blk, b);
  else if constexpr (T == TensorType::IQ4_XS)
    iq_decode_iq4_xs(blk, b);
  else
    iq_decode_tq2_0(blk, b);
  __m512i t[4];
  if constexpr (kOrder<T> == Order::lanes16) to_lanes(b.q, t);
  const __m512i flip = _mm512_set1_epi8(-128);  // q + 128 as a byte: flip the top bit
  for (int c = 0; c < 4; ++c) {
    const __m512i q = kOrder<T> == Order::lanes16 ? t[c] : b.q[c];
    out.u[c] = kRaw<T> ? q : _mm512_xor_si512(q, flip);
  }
  out.scale = b.scale;
}

// Activation rows of one chunk: per block its 8-bit values transposed as the weights,
// -128 x each sub-block's sum of them (the chains' start), and d.
struct Act {
  const __m512i* q;     // 4 per block
  const __m512i* init;  // 1 per block
  const float* d;
};
constexpr size_t act_stride(size_t n_blocks) { return (n_blocks * (320 + 4) + 63) & ~size_t{63}; }

inline Act act_at(uint8_t* base, size_t n_blocks, size_t b) {
  uint8_t* p = base + b * act_stride(n_blocks);
  return {reinterpret_cast<const __m512i*>(p), reinterpret_cast<const __m512i*>(p + 256 * n_blocks),
          reinterpret_cast<const float*>(p + 320 * n_blocks)};
}

// An activation row in the order of the weights (Order), with each lane's chain start
// -offset x the sum of the bytes that meet it (vpdpbusd of the offset against them).
template <Order O>
void prepare_row(const float* x, size_t k, int offset, uint8_t* scratch, uint8_t* out) {
  const size_t n_blocks = k / 256;
  Vec::prepare_q8_256(x, k, scratch);
  const packed::ActRow256 r = packed::act_row256(scratch, k, 0);
  auto* q = reinterpret_cast<__m512i*>(out);
  auto* init = reinterpret_cast<__m512i*>(out + 256 * n_blocks);
  auto* d = reinterpret_cast<float*>(out + 320 * n_blocks);
  const __m512i off = _mm512_set1_epi8(char(offset));
  for (size_t b = 0; b < n_blocks; ++b) {
    const int8_t* xb = r.q + 256 * b;
    __m512i in[4];
    for (int c = 0; c < 4; ++c) {
      if constexpr (O == Order::lanes32)  // qword s of vector c: qword 4s + c of the block
        in[c] =
            _mm512_i64gather_epi64(_mm512_set_epi64(28 + c, 24 + c, 20 + c, 16 + c, 12 + c, 8 + c, 4 + c, c), xb, 8);
      else
        in[c] = _mm512_loadu_si512(xb + 64 * c);
    }
    if constexpr (O == Order::lanes16)
      to_lanes(in, q + 4 * b);
    else
      for (int c = 0; c < 4; ++c) q[4 * b + c] = in[c];
    __m512i s = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) s = _mm512_dpbusd_epi32(s, off, q[4 * b + c]);
    init[b] = _mm512_sub_epi32(_mm512_setzero_si512(), s);
    d[b] = r.d[b];
  }
}

// MR decoded weight rows (row i's blocks at w + i * n_blocks) against NR activation rows.
template <int MR, int NR>
void tile(const WBlock* w, const Act* x, size_t n_blocks, float* y, size_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m512i* xq = x[j].q + 4 * b;
      const __m512i x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3], init = x[j].init[b];
      const __m512 dx = _mm512_set1_ps(x[j].d[b]);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const WBlock& wb = w[i * n_blocks + b];
        __m512i s = _mm512_dpbusd_epi32(init, wb.u[0], x0);
        s = _mm512_dpbusd_epi32(s, wb.u[1], x1);
        s = _mm512_dpbusd_epi32(s, wb.u[2], x2);
        s = _mm512_dpbusd_epi32(s, wb.u[3], x3);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wb.scale, dx), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * ldy + i] = Vec::hsum(acc[i][j]);
}

// A single activation row (decode): each block decoded into registers and used at once,
// the operations of tile<MR, 1> without the buffer's stores and loads (the same bits).
template <TensorType T>
void rows_direct(const GemmArgs& a, const Act& x, size_t r0, size_t r1, size_t n_blocks, float* y) {
  const uint8_t* end = static_cast<const uint8_t*>(a.w) + r1 * a.w_row_bytes;
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * a.w_row_bytes;
    __m512 acc = _mm512_setzero_ps();
    for (size_t b = 0; b < n_blocks; ++b) {
      // The codebook gathers hold the weights' loads back: without the prefetch the
      // hardware prefetcher falls behind and decode waits on DRAM (tinyllama IQ2_XXS tg:
      // 4.6 GB/s of weights, half the samples on a block's first load).
      x86::prefetch_ahead(row + b * kBlockBytes<T>, kBlockBytes<T>, end);
      WBlock wb;
      decode<T>(row + b * kBlockBytes<T>, wb);
      const __m512i* xq = x.q + 4 * b;
      __m512i s = _mm512_dpbusd_epi32(x.init[b], wb.u[0], xq[0]);
      s = _mm512_dpbusd_epi32(s, wb.u[1], xq[1]);
      s = _mm512_dpbusd_epi32(s, wb.u[2], xq[2]);
      s = _mm512_dpbusd_epi32(s, wb.u[3], xq[3]);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wb.scale, _mm512_set1_ps(x.d[b])), acc);
    }
    y[r] = Vec::hsum(acc);
  }
}

using TileFn = void (*)(const WBlock*, const Act*, size_t, float*, size_t);
template <int MR, int... NR>
constexpr void fill_row(TileFn* row, std::integer_sequence<int, NR...>) {
  ((row[NR + 1] = &tile<MR, NR + 1>), ...);
}
struct Tiles {
  TileFn fn[kRw + 1][kRb + 1] = {};
  constexpr Tiles() {
    fill_row<1>(fn[1], std::make_integer_sequence<int, kRb>{});
    fill_row<2>(fn[2], std::make_integer_sequence<int, kRb>{});
    fill_row<3>(fn[3], std::make_integer_sequence<int, kRb>{});
    fill_row<4>(fn[4], std::make_integer_sequence<int, kRb>{});
  }
};
constexpr Tiles kTiles;
static_assert(kRw == 4, "kTiles fills rows 1..4");

template <TensorType T>
void gemm_iq(const GemmArgs& a) {
  const size_t n_blocks = a.k / 256;
  alignas(64) WBlock wbuf[kRw * kMaxBlocks];
  alignas(64) uint8_t act[kActBytes];
  alignas(64) uint8_t scratch[packed::act_row_bytes(packed::ActFormat::q8_256, kMaxK)];
  const size_t stride = act_stride(n_blocks);
  const size_t chunk = kActBytes / stride;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += chunk) {
    const size_t nb = a.n_batch - b0 < chunk ? a.n_batch - b0 : chunk;
    for (size_t b = 0; b < nb; ++b)
      prepare_row<kOrder<T>>(a.x + (b0 + b) * a.ldx, a.k, kOffset<T>, scratch, act + b * stride);
    if (nb == 1) {
      rows_direct<T>(a, act_at(act, n_blocks, 0), a.r0, a.r1, n_blocks, a.y + b0 * a.ldy);
      continue;
    }
    for (size_t r = a.r0; r < a.r1; r += kRw) {
      const int mr = int(a.r1 - r < size_t(kRw) ? a.r1 - r : size_t(kRw));
      const uint8_t* end = static_cast<const uint8_t*>(a.w) + a.r1 * a.w_row_bytes;
      for (int i = 0; i < mr; ++i) {
        const uint8_t* row = static_cast<const uint8_t*>(a.w) + (r + i) * a.w_row_bytes;
        for (size_t blk = 0; blk < n_blocks; ++blk) {
          x86::prefetch_ahead(row + blk * kBlockBytes<T>, kBlockBytes<T>, end);
          decode<T>(row + blk * kBlockBytes<T>, wbuf[i * n_blocks + blk]);
        }
      }
      for (size_t j = 0; j < nb; j += kRb) {
        const int nr = int(nb - j < size_t(kRb) ? nb - j : size_t(kRb));
        Act x[kRb];
        for (int t = 0; t < nr; ++t) x[t] = act_at(act, n_blocks, j + t);
        kTiles.fn[mr][nr](wbuf, x, n_blocks, a.y + (b0 + j) * a.ldy + r, a.ldy);
      }
    }
  }
}

}  // namespace

bool gemm_iquant(const GemmArgs& a) {
  if (a.k > kMaxK || a.k % 256 != 0) return false;
  switch (a.w_type) {
    case TensorType::IQ2_XXS:
      gemm_iq<TensorType::IQ2_XXS>(a);
      return true;
    case TensorType::IQ2_XS:
      gemm_iq<TensorType::IQ2_XS>(a);
      return true;
    case TensorType::IQ2_S:
      gemm_iq<TensorType::IQ2_S>(a);
      return true;
    case TensorType::IQ3_XXS:
      gemm_iq<TensorType::IQ3_XXS>(a);
      return true;
    case TensorType::IQ3_S:
      gemm_iq<TensorType::IQ3_S>(a);
      return true;
    case TensorType::IQ1_S:
      gemm_iq<TensorType::IQ1_S>(a);
      return true;
    case TensorType::IQ1_M:
      gemm_iq<TensorType::IQ1_M>(a);
      return true;
    case TensorType::TQ1_0:
      gemm_iq<TensorType::TQ1_0>(a);
      return true;
    case TensorType::TQ2_0:
      gemm_iq<TensorType::TQ2_0>(a);
      return true;
    case TensorType::IQ4_XS:
      gemm_iq<TensorType::IQ4_XS>(a);
      return true;  // left unpacked
    default:
      return false;
  }
}

}  // namespace kiln::kernels::avx512
