#pragma once
// Internal to kernels/x86/avx2/packed_kernels.h, which includes it inside its anonymous
// namespace after its helpers (kVnni, dpbusd_sum, bcast4, load, store_half, ...): the
// AVX2 tiles of packed IQ4_NL and IQ4_XS (layouts: kernels/packed.h), one half of a
// group (8 rows) at a time as the other AVX2 tiles.
//
// A 4-bit code indexes kIq4nlValues (-127..113), one vpshufb per weight vector.
//  * AVX-VNNI: the table gives value + 128 (unsigned, as vpdpbusd wants) and each block's
//    sum starts at -128 x sum(x_q), as the AVX-512 tiles do.
//  * Plain AVX2: value + 128 against 127 would saturate vpmaddubsw's int16 pairs, so the
//    table gives the signed value and the product is |w| times x carrying w's sign
//    (vpsignb; no value is 0): a pair is at most 2 x 127 x 127 = 32258, widened to int32
//    by vpmaddwd at once (two pairs could overflow int16), by ones or by IQ4_XS's scale.
// Every integer sum is exact, so each table's results do not depend on the tile.

template <bool kUnsigned>
inline __m256i iq4_table() {
  alignas(16) int8_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = kUnsigned ? int8_t(uint8_t(kIq4nlValues[i] + 128)) : kIq4nlValues[i];
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// Rows 8h..8h+7 of four code vectors (64 bytes apart) -> eight weight vectors in element
// order; wa gets their magnitudes in the plain build.
inline void iq4_unpack(const uint8_t* codes, int h, __m256i table, __m256i w[8], __m256i wa[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    const __m256i b = load(codes + 64 * v + 32 * h);
    w[v] = _mm256_shuffle_epi8(table, _mm256_and_si256(b, low4));
    w[v + 4] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(b, 4), low4));
  }
  if constexpr (!kVnni) {
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) wa[v] = _mm256_abs_epi8(w[v]);
  }
}

// One 32-element block of 8 rows against activation bytes xq: the int32 sum, each int16
// pair weighted by m16 in the plain build (ones, or a scale in both halves of a lane);
// the VNNI build starts at init and leaves the scale to its caller.
inline __m256i iq4_dot(const __m256i* w, const __m256i* wa, const int8_t* xq, __m256i init, __m256i m16) {
  if constexpr (kVnni) {
    return dpbusd_sum<8>(init, w, xq);
  } else {
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u)
      acc = _mm256_add_epi32(
          acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[u], _mm256_sign_epi8(bcast4(xq + 4 * u), w[u])), m16));
    return acc;
  }
}

// IQ4_NL's records for block32_tile (kernels/x86/avx2/packed_kernels.h): Q4_0's layout,
// each nibble looked up.
struct Iq4NlBlocks {
  static constexpr size_t kRecordBytes = record_bytes(TensorType::IQ4_NL);
  static constexpr bool has_m = false;
  static constexpr int kMagnitudes = kVnni ? 1 : 8;
  struct Context {
    __m256i table;
  };
  static Context context() { return {iq4_table<kVnni>()}; }
  static inline void unpack(Context c, const uint8_t* rec, int h, __m256i w[8], __m256i wa[kMagnitudes]) {
    iq4_unpack(rec + 32, h, c.table, w, wa);
  }
  static inline __m256i dot(const __m256i* w, const __m256i* wa, const int8_t* xq, int32_t s) {
    return iq4_dot(w, wa, xq, _mm256_set1_epi32(-128 * s), _mm256_set1_epi16(1));
  }
};

template <int RB, int H0, int H1>
void iq4_xs_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = record_bytes(TensorType::IQ4_XS);
  const __m256i table = iq4_table<kVnni>();
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j);
  zero_tile(acc);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int sub = 0; sub < 8; ++sub) {
        if (h == H0) x86::prefetch_record_step<R, RB>(rec, sub);
        __m256i w[8], wa[8];
        iq4_unpack(rec + 160 + 256 * sub, h, table, w, wa);
        const __m256i sc32 =
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 32 + 16 * sub + 8 * h)));
        // Plain build: the scale in both int16 halves, applied by vpmaddwd.
        const __m256i sc16 =
            _mm256_or_si256(_mm256_and_si256(sc32, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(sc32, 16));
#pragma GCC unroll 8
        for (int j = 0; j < RB; ++j) {
          const int8_t* xq = xr[j].q + 256 * sb + 32 * sub;
          if constexpr (kVnni) {
            const __m256i isum = iq4_dot(w, wa, xq, _mm256_set1_epi32(-128 * xr[j].s32[8 * sb + sub]), sc16);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(isum, sc32));
          } else {
            sumi[j] = _mm256_add_epi32(sumi[j], iq4_dot(w, wa, xq, _mm256_setzero_si256(), sc16));
          }
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h);
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j)
        acc[j][h] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, _mm256_set1_ps(xr[j].d[sb])), acc[j][h]);
    }
  }
  store_tile<RB, H0, H1>(y, ldy, acc, lanes);
}
