#pragma once
// Internal: the AVX2 gemm on the codebook i-quants and TQ1_0/TQ2_0 in the file's layout,
// included by kernels/x86/avx2/gemm_iquant.cpp (plain AVX2, KILN_IQ_VNNI 0) and
// gemm_iquant_vnni.cpp (-mavxvnni, KILN_IQ_VNNI 1); everything has internal linkage.
// The scheme of kernels/x86/avx512/gemm_iquant.cpp on 8 lanes: a block's eight 32-byte
// vectors are stored in an order where each lane of vectors 0..3 belongs to one sub-block
// in all four, and so does each lane of vectors 4..7 (transposed: lane l of vector c holds
// elements 32l + 4c .. + 3; or the decoders' qword interleave), so vectors 0..3 chain into
// one vector of sub-block sums and vectors 4..7 into another, each meeting its 8 scales
// once. The activations are stored in the same order.
//
// Weights are stored as q + kOffset<T> (the largest |q| of the type) so that they are
// unsigned for vpmaddubsw / vpdpbusd, and each chain starts at -kOffset x its activation
// sum. Without VNNI every vpmaddubsw pair is at most 2 x 124 x 127 = 31496 (IQ3's 62 + 62),
// so it cannot saturate, and is widened at once by vpmaddwd.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/iquant_decode_avx2.h"
#include "kernels/x86/prefetch.h"

#ifndef KILN_IQ_VNNI
#error "define KILN_IQ_VNNI (0 or 1) before including iquant_gemm_avx2.h"
#endif

namespace kiln::kernels::avx2 {
namespace {

constexpr size_t kIqMaxK = 16384;
constexpr size_t kIqMaxBlocks = kIqMaxK / 256;
constexpr int kIqRw = 4, kIqRb = 2;
constexpr size_t kIqActBytes = 96 * 1024;

// The decoders' orders (kernels/x86/iquant_decode_avx2.h): element order transposed here
// into lanes (scales per 16), the qword interleave (per 32), element order (one scale).
enum class IqOrder { lanes, lanes32, natural };
template <TensorType T>
constexpr IqOrder kIqOrder =
    T == TensorType::IQ2_XXS || T == TensorType::IQ3_XXS || T == TensorType::IQ3_S || T == TensorType::IQ1_S
        ? IqOrder::lanes32
    : T == TensorType::TQ1_0 || T == TensorType::TQ2_0 ? IqOrder::natural
                                                       : IqOrder::lanes;
// The ternary decoders give the digit, q + 1, already.
template <TensorType T>
constexpr bool kIqRaw = T == TensorType::TQ1_0 || T == TensorType::TQ2_0;

template <TensorType T>
constexpr int kOffset = T == TensorType::IQ3_XXS || T == TensorType::IQ3_S ? 62
                        : T == TensorType::IQ1_S || T == TensorType::IQ1_M ? 9
                        : T == TensorType::TQ1_0 || T == TensorType::TQ2_0 ? 1
                                                                           : 43;
template <TensorType T>
constexpr size_t kIqBlockBytes = T == TensorType::IQ2_XXS   ? sizeof(block_iq2_xxs)
                                 : T == TensorType::IQ2_XS  ? sizeof(block_iq2_xs)
                                 : T == TensorType::IQ2_S   ? sizeof(block_iq2_s)
                                 : T == TensorType::IQ3_XXS ? sizeof(block_iq3_xxs)
                                 : T == TensorType::IQ3_S   ? sizeof(block_iq3_s)
                                 : T == TensorType::IQ1_S   ? sizeof(block_iq1_s)
                                 : T == TensorType::IQ1_M   ? sizeof(block_iq1_m)
                                 : T == TensorType::TQ1_0   ? sizeof(block_tq1_0)
                                                            : sizeof(block_tq2_0);

struct WBlock2 {
  __m256i u[8];
  __m256 scale[2];
};

// Element order -> lanes: out[c] lane l = dword 8l + c (an 8 x 8 dword transpose).
inline void iq_to_lanes(const __m256i in[8], __m256i out[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    const __m256 a = _mm256_castsi256_ps(in[2 * i]), b = _mm256_castsi256_ps(in[2 * i + 1]);
    t[2 * i] = _mm256_unpacklo_ps(a, b);
    t[2 * i + 1] = _mm256_unpackhi_ps(a, b);
  }
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256 a = t[4 * i + h], b = t[4 * i + 2 + h];
      s[4 * i + 2 * h] = _mm256_shuffle_ps(a, b, 0x44);
      s[4 * i + 2 * h + 1] = _mm256_shuffle_ps(a, b, 0xee);
    }
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm256_castps_si256(_mm256_permute2f128_ps(s[c], s[4 + c], 0x20));
    out[c + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(s[c], s[4 + c], 0x31));
  }
}

template <TensorType T>
inline void iq_decode(const uint8_t* blk, WBlock2& out) {
  IqBlock2 b;
  if constexpr (T == TensorType::IQ2_XXS)
    iq_decode2_iq2_xxs(blk, b);
  else if constexpr (T == TensorType::IQ2_XS)
    iq_decode2_iq2_xs(blk, b);
  else if constexpr (T == TensorType::IQ2_S)
    iq_decode2_iq2_s(blk, b);
  else if constexpr (T == TensorType::IQ3_XXS)
    iq_decode2_iq3_xxs(blk, b);
  else if constexpr (T == TensorType::IQ3_S)
    iq_decode2_iq3_s(blk, b);
  else if constexpr (T == TensorType::IQ1_S)
    iq_decode2_iq1_s(blk, b);
  else if constexpr (T == TensorType::IQ1_M)
    iq_decode2_iq1_m(blk, b);
  else if constexpr (T == TensorType::TQ1_0)
    iq_decode2_tq1_0(blk, b);
  else
    iq_decode2_tq2_0(blk, b);
  const __m256i off = _mm256_set1_epi8(char(kOffset<T>));
  if constexpr (!kIqRaw<T>)
    for (int v = 0; v < 8; ++v) b.q[v] = _mm256_add_epi8(b.q[v], off);
  if constexpr (kIqOrder<T> == IqOrder::lanes)
    iq_to_lanes(b.q, out.u);
  else
    for (int v = 0; v < 8; ++v) out.u[v] = b.q[v];
  out.scale[0] = b.scale[0];
  out.scale[1] = b.scale[1];
}

// An activation row of a chunk: per block 8 vectors transposed as the weights, the two
// chains' starts (-offset x the sums of each 32's first and second 16), and d.
struct IqAct {
  const __m256i* q;     // 8 per block
  const __m256i* init;  // 2 per block
  const float* d;
};
constexpr size_t iq_act_stride(size_t n_blocks) { return (n_blocks * (320 + 4) + 63) & ~size_t{63}; }
inline IqAct iq_act_at(uint8_t* base, size_t n_blocks, size_t b) {
  uint8_t* p = base + b * iq_act_stride(n_blocks);
  return {reinterpret_cast<const __m256i*>(p), reinterpret_cast<const __m256i*>(p + 256 * n_blocks),
          reinterpret_cast<const float*>(p + 320 * n_blocks)};
}

template <IqOrder O>
void iq_prepare_row(const float* x, size_t k, int offset, uint8_t* scratch, uint8_t* out) {
  const size_t n_blocks = k / 256;
  Vec::prepare_q8_256(x, k, scratch);
  const packed::ActRow256 r = packed::act_row256(scratch, k, 0);
  auto* q = reinterpret_cast<__m256i*>(out);
  auto* init = reinterpret_cast<__m256i*>(out + 256 * n_blocks);
  auto* d = reinterpret_cast<float*>(out + 320 * n_blocks);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), neg = _mm256_set1_epi32(-offset);
  for (size_t b = 0; b < n_blocks; ++b) {
    const int8_t* xb = r.q + 256 * b;
    __m256i in[8];
    for (int v = 0; v < 8; ++v) {
      if constexpr (O == IqOrder::lanes32)  // qword j of vector v: qword 4(j + 4(v / 4)) + v % 4
        in[v] =
            _mm256_i32gather_epi64(reinterpret_cast<const long long*>(xb),
                                   _mm_add_epi32(_mm_setr_epi32(0, 4, 8, 12), _mm_set1_epi32(16 * (v / 4) + v % 4)), 8);
      else
        in[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32 * v));
    }
    if constexpr (O == IqOrder::lanes)
      iq_to_lanes(in, q + 8 * b);
    else
      for (int v = 0; v < 8; ++v) q[8 * b + v] = in[v];
    // Each chain's start: -offset x the sum of the bytes of its four vectors in each lane.
    for (int h = 0; h < 2; ++h) {
      __m256i sum = _mm256_setzero_si256();
      for (int v = 4 * h; v < 4 * h + 4; ++v)
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q[8 * b + v]), ones16));
      init[2 * b + h] = _mm256_mullo_epi32(sum, neg);
    }
    d[b] = r.d[b];
  }
}

// Four transposed vectors against the activations': unsigned weights times signed bytes.
inline __m256i iq_chain(__m256i acc, const __m256i* u, const __m256i* x) {
#if KILN_IQ_VNNI
  for (int c = 0; c < 4; ++c) acc = _mm256_dpbusd_avx_epi32(acc, u[c], x[c]);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  for (int c = 0; c < 4; ++c) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], x[c]), ones));
#endif
  return acc;
}

template <int MR, int NR>
void iq_tile(const WBlock2* w, const IqAct* x, size_t n_blocks, float* y, size_t ldy) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) {
      const __m256i* xq = x[j].q + 8 * b;
      const __m256 dx = _mm256_set1_ps(x[j].d[b]);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const WBlock2& wb = w[i * n_blocks + b];
        const __m256i sa = iq_chain(x[j].init[2 * b], wb.u, xq), sb = iq_chain(x[j].init[2 * b + 1], wb.u + 4, xq + 4);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(wb.scale[0], dx), acc[i][j]);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_mul_ps(wb.scale[1], dx), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[j * ldy + i] = Vec::hsum(acc[i][j]);
}

// A single activation row (decode): blocks decoded into registers and used at once, the
// operations of iq_tile<MR, 1> without the buffer (the same bits).
template <TensorType T>
void iq_rows_direct(const GemmArgs& a, const IqAct& x, size_t n_blocks, float* y) {
  const uint8_t* end = static_cast<const uint8_t*>(a.w) + a.r1 * a.w_row_bytes;
  for (size_t r = a.r0; r < a.r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * a.w_row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (size_t b = 0; b < n_blocks; ++b) {
      x86::prefetch_ahead(row + b * kIqBlockBytes<T>, kIqBlockBytes<T>, end);  // as the AVX-512 decode
      WBlock2 wb;
      iq_decode<T>(row + b * kIqBlockBytes<T>, wb);
      const __m256i* xq = x.q + 8 * b;
      const __m256 dx = _mm256_set1_ps(x.d[b]);
      const __m256i sa = iq_chain(x.init[2 * b], wb.u, xq), sb = iq_chain(x.init[2 * b + 1], wb.u + 4, xq + 4);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(wb.scale[0], dx), acc);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_mul_ps(wb.scale[1], dx), acc);
    }
    y[r] = Vec::hsum(acc);
  }
}

using IqTileFn = void (*)(const WBlock2*, const IqAct*, size_t, float*, size_t);
constexpr IqTileFn kIqTiles[kIqRw + 1][kIqRb + 1] = {{nullptr, nullptr, nullptr},
                                                     {nullptr, &iq_tile<1, 1>, &iq_tile<1, 2>},
                                                     {nullptr, &iq_tile<2, 1>, &iq_tile<2, 2>},
                                                     {nullptr, &iq_tile<3, 1>, &iq_tile<3, 2>},
                                                     {nullptr, &iq_tile<4, 1>, &iq_tile<4, 2>}};

template <TensorType T>
void iq_gemm(const GemmArgs& a) {
  const size_t n_blocks = a.k / 256;
  alignas(64) WBlock2 wbuf[kIqRw * kIqMaxBlocks];
  alignas(64) uint8_t act[kIqActBytes];
  alignas(64) uint8_t scratch[packed::act_row_bytes(packed::ActFormat::q8_256, kIqMaxK)];
  const size_t stride = iq_act_stride(n_blocks), chunk = kIqActBytes / stride;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += chunk) {
    const size_t nb = a.n_batch - b0 < chunk ? a.n_batch - b0 : chunk;
    for (size_t b = 0; b < nb; ++b)
      iq_prepare_row<kIqOrder<T>>(a.x + (b0 + b) * a.ldx, a.k, kOffset<T>, scratch, act + b * stride);
    if (nb == 1) {
      iq_rows_direct<T>(a, iq_act_at(act, n_blocks, 0), n_blocks, a.y + b0 * a.ldy);
      continue;
    }
    for (size_t r = a.r0; r < a.r1; r += kIqRw) {
      const int mr = int(a.r1 - r < size_t(kIqRw) ? a.r1 - r : size_t(kIqRw));
      for (int i = 0; i < mr; ++i) {
        const uint8_t* row = static_cast<const uint8_t*>(a.w) + (r + i) * a.w_row_bytes;
        for (size_t blk = 0; blk < n_blocks; ++blk) {
          x86::prefetch_ahead(row + blk * kIqBlockBytes<T>, kIqBlockBytes<T>,
                              static_cast<const uint8_t*>(a.w) + a.r1 * a.w_row_bytes);
          iq_decode<T>(row + blk * kIqBlockBytes<T>, wbuf[i * n_blocks + blk]);
        }
      }
      for (size_t j = 0; j < nb; j += kIqRb) {
        const int nr = int(nb - j < size_t(kIqRb) ? nb - j : size_t(kIqRb));
        IqAct x[kIqRb];
        for (int t = 0; t < nr; ++t) x[t] = iq_act_at(act, n_blocks, j + t);
        kIqTiles[mr][nr](wbuf, x, n_blocks, a.y + (b0 + j) * a.ldy + r, a.ldy);
      }
    }
  }
}

// False (nothing done) for other types or lengths.
bool iq_gemm_dispatch(const GemmArgs& a) {
  if (a.w_packed || a.k > kIqMaxK || a.k % 256 != 0) return false;
  switch (a.w_type) {
    case TensorType::IQ2_XXS:
      iq_gemm<TensorType::IQ2_XXS>(a);
      return true;
    case TensorType::IQ2_XS:
      iq_gemm<TensorType::IQ2_XS>(a);
      return true;
    case TensorType::IQ2_S:
      iq_gemm<TensorType::IQ2_S>(a);
      return true;
    case TensorType::IQ3_XXS:
      iq_gemm<TensorType::IQ3_XXS>(a);
      return true;
    case TensorType::IQ3_S:
      iq_gemm<TensorType::IQ3_S>(a);
      return true;
    case TensorType::IQ1_S:
      iq_gemm<TensorType::IQ1_S>(a);
      return true;
    case TensorType::IQ1_M:
      iq_gemm<TensorType::IQ1_M>(a);
      return true;
    case TensorType::TQ1_0:
      iq_gemm<TensorType::TQ1_0>(a);
      return true;
    case TensorType::TQ2_0:
      iq_gemm<TensorType::TQ2_0>(a);
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace kiln::kernels::avx2
