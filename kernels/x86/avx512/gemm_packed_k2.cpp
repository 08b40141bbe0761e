// AVX-512 VNNI gemm on packed Q3_K and Q2_K weights (layouts: kernels/packed.h),
// against activations quantized per 256 elements (ActFormat::q8_256). As for Q4_K, Q5_K and
// Q6_K (gemm_packed_k.cpp) every super-block's products, sub-block scales, mins and
// offsets are summed exactly in int32 and meet the float scales once; same determinism
// contract as gemm_packed.cpp (each output's operations do not depend on RB, the row
// split or the batch size).
//
// Q2_K and Q3_K have sub-blocks of 16: one 4-deep vpdpbusd chain per sub-block sums to
// at most 16 x 7 x 128 < 2^15 in magnitude, so vpdpwssd against the scale in the low 16
// bits of each lane (high 16 bits zero) multiplies and accumulates it in one instruction
// (the chain's sign-extension half meets the zero) instead of vpmulld + vpaddd.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/avx512/packed_tiles.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

inline __m512i load_i8x32_as_i16(const void* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}

// ---------------------------------------------------------------- Q3_K and Q2_K

// The eight unpacked vectors of 32-element chunk P (sub-blocks 2P, 2P+1): 2-bit values
// from the two crumb vectors, plus 4 where Q3_K's high-bit mask is set.
template <bool kHigh>
inline void unpack_crumbs(const uint8_t* chunk, __m512i w[8]) {
  const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
  for (int h = 0; h < 2; ++h) {
    const __m512i c = load(chunk + 64 * h);
    w[4 * h] = _mm512_and_si512(c, three);
    w[4 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(c, 2), three);
    w[4 * h + 2] = _mm512_and_si512(_mm512_srli_epi16(c, 4), three);
    w[4 * h + 3] = _mm512_and_si512(_mm512_srli_epi16(c, 6), three);
  }
  if constexpr (kHigh)
    for (int u = 0; u < 8; ++u) w[u] = _mm512_mask_add_epi8(w[u], mask_at(chunk + 128 + 8 * u), w[u], four);
}

// Adds sc_a * sum(sub-block 2P) + sc_b * sum(sub-block 2P+1) to sumi; sc_a and sc_b hold
// their scale in the low 16 bits of each lane, zero above.
inline __m512i chunk_dot(__m512i sumi, const __m512i w[8], const int8_t* xq, __m512i sc_a, __m512i sc_b) {
  __m512i ia = _mm512_setzero_si512(), ib = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) {
    ia = _mm512_dpbusd_epi32(ia, w[u], bcast4(xq + 4 * u));
    ib = _mm512_dpbusd_epi32(ib, w[u + 4], bcast4(xq + 16 + 4 * u));
  }
  return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sumi, ia, sc_a), ib, sc_b);
}

// Q3_K: x = d * sc * (q - 4) with q in 0..7 stored, sc in -32..31. The offset joins the
// same int32 sum as -4 * sc * sum(x_q) per sub-block: one vpdpwssd of (-4 sc_a, -4 sc_b)
// against the pair of 16-element activation sums.
struct Q3KKind : RecordKind<256, record_bytes(TensorType::Q3_K)> {
  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts&, const Act* xr, size_t sb,
                                                  __m512* acc) {
    const uint8_t *scpair = rec + 32, *chunks = rec + 288;
    const __m512i low16 = _mm512_set1_epi32(0xffff);
    __m512i sumi[RB];
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) sumi[j] = _mm512_setzero_si512();
    for (int P = 0; P < 8; ++P) {
      __m512i w[8];
      x86::prefetch_record_step<kBytes, RB>(rec, P);
      unpack_crumbs<true>(chunks + 192 * P, w);
      const __m512i sc16 = load_i8x32_as_i16(scpair + 32 * P);
      const __m512i sc_a = _mm512_and_si512(sc16, low16), sc_b = _mm512_srli_epi32(sc16, 16);
      const __m512i off = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(sc16, 2));
#pragma GCC unroll 16
      for (int j = 0; j < RB; ++j) {
        sumi[j] = chunk_dot(sumi[j], w, xr[j].q + 256 * sb + 32 * P, sc_a, sc_b);
        sumi[j] = _mm512_dpwssd_epi32(sumi[j], off, bcast4(xr[j].s16 + 16 * sb + 2 * P));
      }
    }
    const __m512 d = load_fp16x16(rec);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, _mm512_set1_ps(xr[j].d[sb])), acc[j]);
  }
};

// Q2_K: x = d * sc * q - dmin * m, q in 0..3, sc and m 4-bit; the mins as Q4_K's, one
// vpdpwssd of (m_a, m_b) against the 16-element activation sums per chunk.
struct Q2KKind : RecordKind<256, record_bytes(TensorType::Q2_K)> {
  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts&, const Act* xr, size_t sb,
                                                  __m512* acc) {
    const __m512i low4_of_low16 = _mm512_set1_epi32(0x0f);
    const uint8_t *scm = rec + 64, *crumbs = rec + 320;
    __m512i sumi[RB];
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) sumi[j] = _mm512_setzero_si512();
    for (int P = 0; P < 8; ++P) {
      __m512i w[8];
      x86::prefetch_record_step<kBytes, RB>(rec, P);
      unpack_crumbs<false>(crumbs + 128 * P, w);
      const __m512i scm16 = load_u8x32_as_i16(scm + 32 * P);
      const __m512i sc_a = _mm512_and_si512(scm16, low4_of_low16);
      const __m512i sc_b = _mm512_and_si512(_mm512_srli_epi32(scm16, 16), low4_of_low16);
#pragma GCC unroll 16
      for (int j = 0; j < RB; ++j) sumi[j] = chunk_dot(sumi[j], w, xr[j].q + 256 * sb + 32 * P, sc_a, sc_b);
    }
    const __m512 d = load_fp16x16(rec), dmin = load_fp16x16(rec + 32);
    __m512i mpairs[8];
    for (int P = 0; P < 8; ++P) mpairs[P] = _mm512_srli_epi16(load_u8x32_as_i16(scm + 32 * P), 4);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      __m512i msum = _mm512_setzero_si512();
      for (int P = 0; P < 8; ++P) msum = _mm512_dpwssd_epi32(msum, mpairs[P], bcast4(xr[j].s16 + 16 * sb + 2 * P));
      const __m512 dx = _mm512_set1_ps(xr[j].d[sb]);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, dx), acc[j]);
      acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc[j]);
    }
  }
};

}  // namespace

void run_packed_k2(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q3_K: return run_groups<Q3KKind>(a, act, b0, b1);
    case TensorType::Q2_K: return run_groups<Q2KKind>(a, act, b0, b1);
    default: return;
  }
}

}  // namespace kiln::kernels::avx512
