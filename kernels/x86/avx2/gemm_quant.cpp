// AVX2 gemm on Q8_0, Q4_0, Q4_K and Q6_K weights as the file stores them, against the
// activations quantized to 8 bits per 32 elements (Vec::quantize_q8_32, as the AVX-512
// kernels): the weights a model does not repack at load, chiefly a MoE's experts, which
// stay mapped so that a token reads only the experts it is routed to.
//
// Integer dots without VNNI: vpmaddubsw (u8 x s8, pairs added in int16 with saturation)
// then vpmaddwd. Every sum stays exact (kernels/x86/avx2/packed_kernels.h derives the
// bounds): a 4-bit pair is at most 2 * 15 * 127; Q8_0 multiplies |q| by x carrying q's
// sign (2 * 128 * 127); Q6_K's (q - 32) * x pairs are the difference of two vpmaddubsw
// (each at most 2 * 63 * 127) and then meet the int16 sub-block scale in vpmaddwd.
//
// Each output (weight row, activation row) runs the same operations in the same order
// whatever the batch around it, so a sequence's logits do not depend on its batch.
#include <immintrin.h>

#include <algorithm>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx2 {
namespace {

constexpr size_t kMaxK = 16384;  // activation copies live on the stack
constexpr size_t kRows = 4;      // activation rows a weight row meets while hot in L1

// An activation row as quantize_q8_32 leaves it: q, and per block of 32 d and sum(q).
struct Act {
  const int8_t* q;
  const float* d;
  const int32_t* s;
};

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// 32 unsigned weights times 32 signed activations, summed into 8 int32 lanes.
inline __m256i dot_u8_s8(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

// Q4_0's 16 bytes: elements 0..15 in the low nibbles, 16..31 in the high ones.
inline __m256i q4_0_nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

template <TensorType T, int NB>
inline void row_acc_legacy(const uint8_t* w, const Act* x, size_t n_blocks, __m256* acc, const uint8_t* end) {
  constexpr size_t kBlockBytes = T == TensorType::Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
  for (size_t blk = 0; blk < n_blocks; ++blk) {
    x86::prefetch_ahead(w + blk * kBlockBytes, kBlockBytes, end);
    __m256i wv, sign;
    float dw;
    if constexpr (T == TensorType::Q8_0) {
      const auto* b = reinterpret_cast<const block_q8_0*>(w) + blk;
      sign = load32(b->qs);
      wv = _mm256_sign_epi8(sign, sign);  // |q|; -128 stays 0x80, read unsigned as 128
      dw = half_to_float(b->d);
    } else {
      const auto* b = reinterpret_cast<const block_q4_0*>(w) + blk;
      wv = q4_0_nibbles(b->qs);
      dw = half_to_float(b->d);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m256i xv = load32(x[j].q + 32 * blk);
      __m256i sum;
      if constexpr (T == TensorType::Q8_0) {
        sum = dot_u8_s8(wv, _mm256_sign_epi8(xv, sign));
      } else {  // q - 8: the offset times sum(x) leaves lane 0, exact in integers
        sum = _mm256_sub_epi32(dot_u8_s8(wv, xv), _mm256_zextsi128_si256(_mm_cvtsi32_si128(8 * x[j].s[blk])));
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dw * x[j].d[blk]), acc[j]);
    }
  }
}

// Q4_K: per 256-element super-block 8 sub-blocks of 32 with 6-bit scales sc and mins m,
// w = d * sc * q - dmin * m; qs[32p..32p+31] hold sub-block 2p in the low nibbles and
// 2p+1 in the high ones. The mins' part, dmin * m * dx * sum(xq) per sub-block, gathers in
// its own vector and leaves the accumulator at the end.
template <int NB>
inline void row_acc_q4_k(const uint8_t* w, const Act* x, size_t n_blocks, __m256* acc, const uint8_t* end) {
  __m256 mins[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) mins[j] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (size_t sb = 0; sb < n_blocks / 8; ++sb) {
    const auto* b = reinterpret_cast<const block_q4_K*>(w) + sb;
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(b), sizeof(block_q4_K), end);
    const ref::ScalesMinsK4 sm = ref::unpack_scales_mins_k4(b->scales);
    const auto widen = [](uint64_t bytes8) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes8))));
    };
    const __m256 d_sc = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b->d)), widen(sm.sc));
    const __m256 dmin_m = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b->dmin)), widen(sm.m));
    __m256i wv[8];
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = load32(b->qs + 32 * p);
      wv[2 * p] = _mm256_and_si256(bytes, low4);
      wv[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m256 dx = _mm256_loadu_ps(x[j].d + 8 * sb);
      const __m256 sum_x = _mm256_cvtepi32_ps(load32(x[j].s + 8 * sb));
      mins[j] = _mm256_fmadd_ps(dmin_m, _mm256_mul_ps(dx, sum_x), mins[j]);
      const __m256 scale = _mm256_mul_ps(d_sc, dx);
      for (int c = 0; c < 8; ++c) {
        const __m256i sum = dot_u8_s8(wv[c], load32(x[j].q + 32 * (8 * sb + c)));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_permutevar8x32_ps(scale, _mm256_set1_epi32(c)), acc[j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm256_sub_ps(acc[j], mins[j]);
}

// Q6_K: w = d * scales[e / 16] * (q - 32), q's low 4 bits in ql and top 2 in qh. In each
// half h of 128 elements, group c of 32 (elements 128h + 32c + l) takes its low bits from
// ql[64h + 32(c & 1) + l] (the high nibble for c >= 2) and its top bits from bits 2c, 2c+1
// of qh[32h + l]; its two 16-element halves have scales 8h + 2c and 8h + 2c + 1.
template <int NB>
inline void row_acc_q6_k(const uint8_t* w, const Act* x, size_t n_blocks, __m256* acc, const uint8_t* end) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
  for (size_t sb = 0; sb < n_blocks / 8; ++sb) {
    const auto* b = reinterpret_cast<const block_q6_K*>(w) + sb;
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(b), sizeof(block_q6_K), end);
    const float d = half_to_float(b->d);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(b->ql + 64 * h), ql1 = load32(b->ql + 64 * h + 32), qh = load32(b->qh + 32 * h);
      // 16-bit shifts move bits across the bytes of a pair; the masks keep each byte's own.
      const __m256i qv[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, top2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2))};
      for (int c = 0; c < 4; ++c) {
        const int8_t* s = b->scales + 8 * h + 2 * c;
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
        const size_t ab = 8 * sb + 4 * h + c;  // activation block
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const __m256i xv = load32(x[j].q + 32 * ab);
          const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(qv[c], xv), _mm256_maddubs_epi16(k32, xv));
          const __m256i sum = _mm256_madd_epi16(pairs, sc);
          acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * x[j].d[ab]), acc[j]);
        }
      }
    }
  }
}

template <TensorType T, int NB>
inline void row_dot(const uint8_t* w, const Act* x, size_t n_blocks, float* const* out, const uint8_t* end) {
  __m256 acc[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm256_setzero_ps();
  if constexpr (T == TensorType::Q4_K) row_acc_q4_k<NB>(w, x, n_blocks, acc, end);
  else if constexpr (T == TensorType::Q6_K) row_acc_q6_k<NB>(w, x, n_blocks, acc, end);
  else row_acc_legacy<T, NB>(w, x, n_blocks, acc, end);
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) *out[j] = Vec::hsum(acc[j]);
}

template <TensorType T>
void gemm_rows(const GemmArgs& a) {
  const size_t n_blocks = a.k / 32;
  alignas(32) int8_t xq[kRows][kMaxK];
  float xd[kRows][kMaxK / 32];
  int32_t xs[kRows][kMaxK / 32];
  const uint8_t* weights = static_cast<const uint8_t*>(a.w);
  const uint8_t* end = weights + a.r1 * a.w_row_bytes;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += kRows) {
    const size_t nb = std::min(kRows, a.n_batch - b0);
    Act x[kRows];
    for (size_t b = 0; b < nb; ++b) {
      Vec::quantize_q8_32(a.x + (b0 + b) * a.ldx, n_blocks, xq[b], xd[b], xs[b]);
      x[b] = {xq[b], xd[b], xs[b]};
    }
    for (size_t r = a.r0; r < a.r1; ++r) {
      const uint8_t* w = weights + r * a.w_row_bytes;
      float* y = a.y + b0 * a.ldy + r;
      if (nb == kRows) {
        float* out[kRows] = {y, y + a.ldy, y + 2 * a.ldy, y + 3 * a.ldy};
        row_dot<T, kRows>(w, x, n_blocks, out, end);
      } else {
        for (size_t b = 0; b < nb; ++b) {
          float* out[1] = {y + b * a.ldy};
          row_dot<T, 1>(w, x + b, n_blocks, out, end);
        }
      }
    }
  }
}

}  // namespace

bool gemm_quant(const GemmArgs& a) {
  if (a.k > kMaxK || a.k % 32 != 0) return false;
  switch (a.w_type) {
    case TensorType::Q8_0: gemm_rows<TensorType::Q8_0>(a); return true;
    case TensorType::Q4_0: gemm_rows<TensorType::Q4_0>(a); return true;
    case TensorType::Q4_K: gemm_rows<TensorType::Q4_K>(a); return true;
    case TensorType::Q6_K: gemm_rows<TensorType::Q6_K>(a); return true;
    default: return false;
  }
}

}  // namespace kiln::kernels::avx2
