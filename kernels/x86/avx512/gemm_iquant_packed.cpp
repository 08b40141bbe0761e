// AVX-512 VNNI gemm on packed IQ4_NL and IQ4_XS weights (layouts: kernels/packed.h).
// Their 4-bit codes index the 16 non-uniform values kIq4nlValues (-127..113): one
// vpshufb per weight vector turns codes into value + 128 (1..241, unsigned as vpdpbusd
// wants them), and each block's integer sum starts at -128 x sum(x_q) to take the offset
// back out, so every block's dot product is exact in int32 before its scales apply.
// IQ4_NL multiplies 8-bit activations per 32 (as ggml's Q8_0), IQ4_XS per 256 (Q8_K) with
// each sub-block's integer sum times its 6-bit scale added exactly, as Q4_K's tiles do.
// Same determinism contract as gemm_packed.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/quant_iq.h"
#include "kernels/x86/avx512/packed_tiles.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

// kIq4nlValues + 128 in every 128-bit lane, for vpshufb.
inline __m512i iq4_unsigned_table() {
  alignas(16) uint8_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = uint8_t(kIq4nlValues[i] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// Four code vectors (low nibble element 4v + i, high nibble 16 + 4v + i) -> eight
// unsigned weight vectors in element order.
inline void iq4_weights(const uint8_t* codes, __m512i table, __m512i w[8]) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    const __m512i b = load(codes + 64 * v);
    w[v] = _mm512_shuffle_epi8(table, _mm512_and_si512(b, low4));
    w[v + 4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4));
  }
}

// The table of IQ4_NL's and IQ4_XS's codes, built once a tile.
struct Iq4Consts {
  __m512i table = iq4_unsigned_table();
};

struct Iq4NlKind : RecordKind<32, record_bytes(TensorType::IQ4_NL)> {
  using Consts = Iq4Consts;

  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts& c, const Act* xr, size_t blk,
                                                  __m512* acc) {
    if constexpr (RB > 1) {  // as the legacy tiles: the record 8 ahead (gemm_packed.cpp)
      for (size_t line = 0; line < kBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rec + 8 * kBytes + line), _MM_HINT_T0);
    } else {
      x86::prefetch_stream<kBytes>(rec);
    }
    const __m512 dw = load_fp16x16(rec);
    __m512i w[8];
    iq4_weights(rec + 32, c.table, w);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      const int8_t* xq = xr[j].q + 32 * blk;
      __m512i isum = _mm512_set1_epi32(-128 * xr[j].s[blk]);
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u) isum = _mm512_dpbusd_epi32(isum, w[u], bcast4(xq + 4 * u));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(xr[j].d[blk])), acc[j]);
    }
  }
};

// Per record: sub-block b's sum (|.| <= 32 x 127 x 127) times its scale (-32..31), eight
// of them: below 2^27, exact in int32.
struct Iq4XsKind : RecordKind<256, record_bytes(TensorType::IQ4_XS)> {
  using Consts = Iq4Consts;

  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts& c, const Act* xr, size_t sb,
                                                  __m512* acc) {
    __m512i sumi[RB];
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) sumi[j] = _mm512_setzero_si512();
    for (int sub = 0; sub < 8; ++sub) {
      x86::prefetch_record_step<kBytes, RB>(rec, sub);
      __m512i w[8];
      iq4_weights(rec + 160 + 256 * sub, c.table, w);
      const __m512i scale =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 32 + 16 * sub)));
#pragma GCC unroll 16
      for (int j = 0; j < RB; ++j) {
        const int8_t* xq = xr[j].q + 256 * sb + 32 * sub;
        __m512i isum = _mm512_set1_epi32(-128 * xr[j].s32[8 * sb + sub]);
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) isum = _mm512_dpbusd_epi32(isum, w[u], bcast4(xq + 4 * u));
        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(isum, scale));
      }
    }
    const __m512 d = load_fp16x16(rec);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, _mm512_set1_ps(xr[j].d[sb])), acc[j]);
  }
};

}  // namespace

void run_packed_iq4(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  if (a.w_type == TensorType::IQ4_NL)
    run_groups<Iq4NlKind>(a, act, b0, b1);
  else if (a.w_type == TensorType::IQ4_XS)
    run_groups<Iq4XsKind>(a, act, b0, b1);
}

}  // namespace kiln::kernels::avx512
