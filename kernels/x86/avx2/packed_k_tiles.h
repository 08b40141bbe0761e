#pragma once
// Internal to kernels/x86/avx2/packed_kernels.h, which includes it inside its anonymous
// namespace after its helpers (kVnni, dpbusd_sum, maddubs_sum, bcast4, load, store_half,
// ...): the AVX2 tiles of the packed K-quants (layouts: kernels/packed.h), one half of a
// group (8 rows) at a time as the other AVX2 tiles.

// ---------------------------------------------------------------- Q4_K and Q5_K

// Per 256-element record: sub-block sums times their 6-bit scales stay exact in int32
// (at most 256 * 31 * 128 * 63 for Q5_K), mins meet the activation sums per 32, and the
// float scales are applied once. Q5_K is Q4_K with a fifth bit OR-ed into each weight
// byte: its pairs are 640 bytes (8 nibble vectors, then 16 x uint64 of fifth bits whose
// bits 32h..32h+31 are this half's 8 rows), and 5-bit weights allow only 4 vpmaddubsw
// per int16 sum instead of 8 (maddubs_sum checks the bound).
template <bool kQ5, int RB, int H0, int H1>
void k4_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = record_bytes(kQ5 ? TensorType::Q5_K : TensorType::Q4_K);
  constexpr size_t kPair = kQ5 ? 640 : 512;
  constexpr int kBits = kQ5 ? 5 : 4;
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j);
  zero_tile(acc);
  const __m256i low4 = _mm256_set1_epi8(0x0f), sixteen = _mm256_set1_epi8(16);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *sc = rec + 64, *mpair = rec + 192, *qs = rec + 320;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int sub = 0; sub < 8; ++sub) {  // pair sub/2, nibble sub%2
        if (h == H0) x86::prefetch_record_step<R, RB>(rec, sub);  // first visit of the record
        const uint8_t* pv = qs + kPair * (sub / 2) + 32 * h;
        __m256i w[8];
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v)
          w[v] = _mm256_and_si256(sub % 2 ? _mm256_srli_epi16(load(pv + 64 * v), 4) : load(pv + 64 * v), low4);
        if constexpr (kQ5) {
          // Word 8(sub%2) + v of the pair's fifth bits; this half's 32 bits start at byte 4h.
          const uint8_t* qh = qs + kPair * (sub / 2) + 512 + 64 * (sub % 2) + 4 * h;
#pragma GCC unroll 8
          for (int v = 0; v < 8; ++v) w[v] = _mm256_or_si256(w[v], _mm256_and_si256(bytes_from_bits(qh + 8 * v), sixteen));
        }
        const __m256i sc32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * sub + 8 * h)));
        if constexpr (kVnni) {
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const __m256i isum = dpbusd_sum<8>(_mm256_setzero_si256(), w, xr[j].q + 256 * sb + 32 * sub);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(isum, sc32));
          }
        } else {
          // The scale (< 64) in both int16 halves: vpmaddwd applies it while widening.
          const __m256i sc16 = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j)
            sumi[j] = _mm256_add_epi32(sumi[j], maddubs_sum<kBits, 8>(w, xr[j].q + 256 * sb + 32 * sub, sc16));
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h), dmin = load_fp16x8(rec + 32 + 16 * h);
      __m256i mpairs[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p)
        mpairs[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mpair + 32 * p + 16 * h)));
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) {
        // sum over sub-blocks of m * sum(x_q): int16 pairs (m, sum) in one vpmaddwd each.
        __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mpairs[p], bcast4(xr[j].s32 + 8 * sb + 2 * p)));
        acc[j][h] = k_record_step(acc[j][h], sumi[j], msum, d, dmin, xr[j].d[sb]);
      }
    }
  }
  store_tile<RB, H0, H1>(y, ldy, acc, lanes);
}

// ---------------------------------------------------------------- Q6_K

template <int RB, int H0, int H1>
void q6_k_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = record_bytes(TensorType::Q6_K);
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j);
  zero_tile(acc);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *scpair = rec + 32, *chunks = rec + 288;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int P = 0; P < 8; ++P) {
        if constexpr (RB == 1)
          if (h == H0) x86::prefetch_stream<R, 8>(rec, P);  // first visit of the record
        const uint8_t *ql = chunks + 384 * P + 32 * h, *qh = chunks + 384 * P + 256 + 32 * h;
        __m256i w[8];
        x86::q6_k_weights<Vec>(ql, qh, w);
        // Lane r: the int16 pair (scale of sub-block 2P, scale of 2P+1) of row 8h+r.
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scpair + 32 * P + 16 * h)));
        if constexpr (kVnni) {
          const __m256i sc_a = _mm256_srai_epi32(_mm256_slli_epi32(sc16, 16), 16), sc_b = _mm256_srai_epi32(sc16, 16);
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P;
            const int16_t* s16 = xr[j].s16 + 16 * sb + 2 * P;
            // Stored q is the file's q + 32: start each 16-element sum at -32 * sum(x_q).
            const __m256i ia = dpbusd_sum<4>(_mm256_set1_epi32(-32 * s16[0]), w, xq);
            const __m256i ib = dpbusd_sum<4>(_mm256_set1_epi32(-32 * s16[1]), w + 4, xq + 16);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(_mm256_mullo_epi32(ia, sc_a), _mm256_mullo_epi32(ib, sc_b)));
          }
        } else {
          // Each sub-block's scale in both int16 halves of the lane, for vpmaddwd.
          const __m256i sc_a = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xa0), 0xa0);
          const __m256i sc_b = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xf5), 0xf5);
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P;
            // The q + 32 offset: 32 * (sc_a * sum_a(x_q) + sc_b * sum_b(x_q)), one vpmaddwd.
            const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bcast4(xr[j].s16 + 16 * sb + 2 * P)), 5);
            const __m256i t = _mm256_add_epi32(maddubs_sum<6, 4>(w, xq, sc_a), maddubs_sum<6, 4>(w + 4, xq + 16, sc_b));
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_sub_epi32(t, off));
          }
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h);
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j)
        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, _mm256_set1_ps(xr[j].d[sb])), acc[j][h]);
    }
  }
  store_tile<RB, H0, H1>(y, ldy, acc, lanes);
}

// ---------------------------------------------------------------- Q3_K and Q2_K

// Sub-blocks of 16 elements: chunk P of a record holds sub-blocks 2P and 2P+1, each a
// crumb vector whose four unpacked vectors are (crumb >> 2j) & 3 (kernels/packed.h). A
// sub-block's dot is 4 weight vectors deep, so each sub-block meets its own scale:
//  * plain AVX2: one int16 sum of 4 vpmaddubsw (3-bit: 4 x 1792, 2-bit: 4 x 768, far
//    from saturating), widened by vpmaddwd against the scale in both int16 halves;
//  * AVX-VNNI: a 4-deep vpdpbusd chain sums to |s| <= 16 x 7 x 128 < 2^15, so vpdpwssd
//    against the scale in the low 16 bits of the lane (high 16 zero) multiplies and adds
//    it in one instruction, as the AVX-512 tiles do.
// Q3_K: x = d * sc * (q - 4), q in 0..7 stored (the 2 low bits plus 4 where the high-bit
// mask is set), sc in -32..31; the -4 joins the int32 sum as -4 * sc * sum(x_q) per
// sub-block: the int16 pair (-4 sc_a, -4 sc_b) against the pair of 16-element activation
// sums, one vpmaddwd (vpdpwssd with VNNI) per chunk. Q2_K: x = d * sc * q - dmin * m, q
// in 0..3, sc and m the low and high nibbles of the file's scales byte; the mins as
// Q4_K's, against the 16-element sums.
template <TensorType T, int RB, int H0, int H1>
void k16_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr bool kQ3 = T == TensorType::Q3_K;
  constexpr size_t R = record_bytes(T);
  constexpr size_t kScales = kQ3 ? 32 : 64, kChunks = kQ3 ? 288 : 320, kChunk = kQ3 ? 192 : 128;
  constexpr int kBits = kQ3 ? 3 : 2;  // stored q: Q3_K q + 4 <= 7, Q2_K q <= 3
  static_assert(16 * ((1 << kBits) - 1) * 128 <= 32767, "a sub-block's vpdpbusd sum must fit the lane's low int16");
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j);
  zero_tile(acc);
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *scales = rec + kScales, *chunks = rec + kChunks;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int P = 0; P < 8; ++P) {
        if (h == H0) x86::prefetch_record_step<R, RB>(rec, P);  // first visit of the record
        const uint8_t* chunk = chunks + kChunk * P;
        // Lane r: the int16 pair (scale of sub-block 2P, scale of 2P+1) of row 8h+r.
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 * P + 16 * h));
        const __m256i sc16 = kQ3 ? _mm256_cvtepi8_epi16(sc8)
                                 : _mm256_and_si256(_mm256_cvtepu8_epi16(sc8), _mm256_set1_epi16(0x0f));
        __m256i sc_of[2];
        if constexpr (kVnni) {
          sc_of[0] = _mm256_and_si256(sc16, _mm256_set1_epi32(0xffff));
          sc_of[1] = _mm256_srli_epi32(sc16, 16);
        } else {
          sc_of[0] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xa0), 0xa0);
          sc_of[1] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xf5), 0xf5);
        }
        for (int s = 0; s < 2; ++s) {  // sub-block 2P + s
          const __m256i c = load(chunk + 64 * s + 32 * h);
          __m256i w[4];
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) w[j] = _mm256_and_si256(j ? _mm256_srli_epi16(c, 2 * j) : c, three);
          if constexpr (kQ3) {
            // Mask word 4s + j (elements 32P + 16s + 4j + i); this half's bits from byte 4h.
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
              w[j] = _mm256_or_si256(w[j], _mm256_and_si256(bytes_from_bits(chunk + 128 + 8 * (4 * s + j) + 4 * h), four));
          }
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P + 16 * s;
            if constexpr (kVnni)
              sumi[j] = dpwssd(sumi[j], dpbusd_sum<4>(_mm256_setzero_si256(), w, xq), sc_of[s]);
            else
              sumi[j] = _mm256_add_epi32(sumi[j], maddubs_sum<kBits, 4>(w, xq, sc_of[s]));
          }
        }
        if constexpr (kQ3) {
          // The stored q + 4: (-4 sc_a, -4 sc_b) against (sum_a(x_q), sum_b(x_q)).
          const __m256i off16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) sumi[j] = madd_acc(sumi[j], off16, bcast4(xr[j].s16 + 16 * sb + 2 * P));
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h);
      if constexpr (kQ3) {
#pragma GCC unroll 8
        for (int j = 0; j < RB; ++j)
          acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, _mm256_set1_ps(xr[j].d[sb])), acc[j][h]);
      } else {
        const __m256 dmin = load_fp16x8(rec + 32 + 16 * h);
        __m256i mpairs[8];  // int16 pairs (m of sub-block 2P, m of 2P+1)
#pragma GCC unroll 8
        for (int P = 0; P < 8; ++P)
          mpairs[P] = _mm256_srli_epi16(
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 * P + 16 * h))), 4);
#pragma GCC unroll 8
        for (int j = 0; j < RB; ++j) {
          __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int P = 0; P < 8; ++P) msum = madd_acc(msum, mpairs[P], bcast4(xr[j].s16 + 16 * sb + 2 * P));
          acc[j][h] = k_record_step(acc[j][h], sumi[j], msum, d, dmin, xr[j].d[sb]);
        }
      }
    }
  }
  store_tile<RB, H0, H1>(y, ldy, acc, lanes);
}
