// AVX-512 VNNI gemm on packed Q4_K, Q5_K and Q6_K weights (layout: kernels/packed.h), against
// activations quantized per 256 elements (ActFormat::q8_256). Sub-block scales are small
// integers: each super-block's products, scales and offsets stay exact in int32 and meet
// the float scales once. Same determinism contract as gemm_packed.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/avx512/packed_tiles.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/packed_unpack.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

// ---------------------------------------------------------------- Q4_K

// Q4_K, and Q5_K with the fifth bit of each unpacked vector from its mask word (the
// pair's 8 nibble vectors are then followed by 16 mask words: 640 bytes a pair).
template <TensorType T>
struct Q4KKind : RecordKind<256, record_bytes(T)> {
  using Base = RecordKind<256, record_bytes(T)>;
  using typename Base::Act, typename Base::Consts;
  using Base::kBytes;
  static constexpr bool kFifthBit = T == TensorType::Q5_K;
  static constexpr size_t kPairBytes = kFifthBit ? 640 : 512;

  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts&, const Act* xr, size_t sb,
                                                  __m512* acc) {
    const __m512i low4 = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
    const uint8_t *sc = rec + 64, *mpair = rec + 192, *qs = rec + 320;
    __m512i sumi[RB];
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) sumi[j] = _mm512_setzero_si512();
    for (int half = 0; half < 8; ++half) {  // sub-block `half`: pair half/2, nibble half%2
      const uint8_t *pv = qs + kPairBytes * (half / 2), *qh = pv + 512 + 64 * (half % 2);
      x86::prefetch_record_step<kBytes, RB>(rec, half);
      __m512i w[8];
      for (int v = 0; v < 8; ++v) {
        w[v] = _mm512_and_si512(half % 2 ? _mm512_srli_epi16(load(pv + 64 * v), 4) : load(pv + 64 * v), low4);
        if constexpr (kFifthBit) w[v] = _mm512_mask_add_epi8(w[v], mask_at(qh + 8 * v), w[v], sixteen);
      }
      const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * half)));
#pragma GCC unroll 16
      for (int j = 0; j < RB; ++j) {
        const int8_t* xq = xr[j].q + 256 * sb + 32 * half;
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) isum = _mm512_dpbusd_epi32(isum, w[u], bcast4(xq + 4 * u));
        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(isum, scale));
      }
    }
    const __m512 d = load_fp16x16(rec), dmin = load_fp16x16(rec + 32);
    __m512i mpairs[4];
    for (int p = 0; p < 4; ++p) mpairs[p] = load_u8x32_as_i16(mpair + 32 * p);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      // sum over sub-blocks of m * sum(x_q): int16 pairs (m, sum) in one vpdpwssd each.
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) msum = _mm512_dpwssd_epi32(msum, mpairs[p], bcast4(xr[j].s32 + 8 * sb + 2 * p));
      const __m512 dx = _mm512_set1_ps(xr[j].d[sb]);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, dx), acc[j]);
      acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc[j]);
    }
  }
};

// ---------------------------------------------------------------- Q6_K

struct Q6KKind : RecordKind<256, record_bytes(TensorType::Q6_K)> {

  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts&, const Act* xr, size_t sb,
                                                  __m512* acc) {
    const uint8_t *scpair = rec + 32, *chunks = rec + 288;
    __m512i sumi[RB];
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) sumi[j] = _mm512_setzero_si512();
    for (int P = 0; P < 8; ++P) {
      const uint8_t *ql = chunks + 384 * P, *qh = ql + 256;
      if constexpr (RB == 1) x86::prefetch_stream<kBytes, 8>(rec, P);
      __m512i w[8];
      x86::q6_k_weights<Vec>(ql, qh, w);
      const __m512i sc16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scpair + 32 * P)));
      const __m512i sc_a = _mm512_srai_epi32(_mm512_slli_epi32(sc16, 16), 16), sc_b = _mm512_srai_epi32(sc16, 16);
#pragma GCC unroll 16
      for (int j = 0; j < RB; ++j) {
        const int8_t* xq = xr[j].q + 256 * sb + 32 * P;
        const int16_t* s16 = xr[j].s16 + 16 * sb + 2 * P;
        // Stored q is the file's q + 32: start each 16-element sum at -32 * sum(x_q).
        __m512i ia = _mm512_set1_epi32(-32 * s16[0]), ib = _mm512_set1_epi32(-32 * s16[1]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          ia = _mm512_dpbusd_epi32(ia, w[u], bcast4(xq + 4 * u));
          ib = _mm512_dpbusd_epi32(ib, w[u + 4], bcast4(xq + 16 + 4 * u));
        }
        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_add_epi32(_mm512_mullo_epi32(ia, sc_a), _mm512_mullo_epi32(ib, sc_b)));
      }
    }
    const __m512 d = load_fp16x16(rec);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, _mm512_set1_ps(xr[j].d[sb])), acc[j]);
  }
};

}  // namespace

void run_packed_k(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q4_K: return run_groups<Q4KKind<TensorType::Q4_K>>(a, act, b0, b1);
    case TensorType::Q5_K: return run_groups<Q4KKind<TensorType::Q5_K>>(a, act, b0, b1);
    case TensorType::Q6_K: return run_groups<Q6KKind>(a, act, b0, b1);
    default: return run_packed_k2(a, act, b0, b1);
  }
}

}  // namespace kiln::kernels::avx512
