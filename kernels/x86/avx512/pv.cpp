// AVX-512 P V over value rows stored by position (kernels.h, PvArgs).
//
// Decoding a quantized value costs more than the multiply-adds it feeds when it is done
// per output row (the attention's former path: every row through the scalar reference,
// transposed, then a float gemm). Here a block of positions is decoded once into a stack
// buffer of floats small enough to stay in L1, and then every block of up to 8 output
// rows walks it 32 columns at a time, its 8 x 2 accumulators in registers: one broadcast
// of P and two FMAs per row and position.
//
// Each output lane owns one accumulator fed one FMA per position in order, whatever the
// tile shape or buffer blocking, which is what the contract's split invariance needs.
//
// Everything but pv is internal: no AVX-512 copy of a shared inline function can leak.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace kiln::kernels::avx512 {

void pv(const PvArgs& a);

namespace {

constexpr size_t kBufFloats = 8192;  // 32 KiB of decoded values
constexpr size_t kMaxCols = 512;     // columns decoded at once: at least 16 positions per buffer
constexpr size_t kTileCols = 32;
constexpr size_t kMaxRows = 8;       // 16 accumulators + 2 values + 1 broadcast of 32 registers

inline size_t left(size_t n, size_t i) { return n > i ? n - i : 0; }
inline __mmask16 lanes(size_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

// Bit-exact with the reference dequantization: an int converted to float is exact, and
// then one product with the widened scale, as ggml does.
inline void q8_0_block(const block_q8_0* b, float* dst) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
  const __m128i* q = reinterpret_cast<const __m128i*>(b->qs);
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d));
}

inline void q4_0_block(const block_q4_0* b, float* dst) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(15)), eight);
  const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
}

inline void quant_block(TensorType t, const char* row, size_t b, float* dst) {
  if (t == TensorType::Q8_0) q8_0_block(reinterpret_cast<const block_q8_0*>(row) + b, dst);
  else q4_0_block(reinterpret_cast<const block_q4_0*>(row) + b, dst);
}

// Values [e0, e0 + w) of one row into dst[0, w). Columns [w, ld) (ld: w rounded up to 32)
// get finite filler that only masked-off lanes ever see.
void decode(TensorType t, const char* row, size_t e0, size_t w, size_t ld, float* dst) {
  switch (t) {
    case TensorType::F32: {
      const float* src = reinterpret_cast<const float*>(row) + e0;
      for (size_t i = 0; i < ld; i += 16) _mm512_store_ps(dst + i, _mm512_maskz_loadu_ps(lanes(left(w, i)), src + i));
      return;
    }
    case TensorType::F16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
      for (size_t i = 0; i < ld; i += 16)
        _mm512_store_ps(dst + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(left(w, i)), src + i)));
      return;
    }
    case TensorType::BF16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
      for (size_t i = 0; i < ld; i += 16) {
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes(left(w, i)), src + i));
        _mm512_store_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
      }
      return;
    }
    default: break;
  }
  if (e0 % 32 == 0) {  // whole blocks straight into place (the row holds every block they touch)
    for (size_t c = 0; c < ld; c += 32) quant_block(t, row, (e0 + c) / 32, dst + c);
    return;
  }
  // A head narrower than a block: the blocks it touches, then its part of them.
  alignas(64) float block[32];
  for (size_t b = e0 / 32; b * 32 < e0 + w; ++b) {
    quant_block(t, row, b, block);
    const size_t lo = e0 > b * 32 ? e0 : b * 32, hi = e0 + w < b * 32 + 32 ? e0 + w : b * 32 + 32;
    std::memcpy(dst + (lo - e0), block + (lo - b * 32), (hi - lo) * sizeof(float));
  }
  std::memset(dst + w, 0, (ld - w) * sizeof(float));
}

// out rows [0, R) x columns [0, w) (w <= 32) += p rows x the buffer's np positions.
template <size_t R>
void tile(const float* buf, size_t ld, size_t np, const float* p, size_t ldp, float* out, size_t ldo, size_t w) {
  const __mmask16 m0 = lanes(w), m1 = lanes(left(w, 16));
  __m512 a0[R], a1[R];
  for (size_t r = 0; r < R; ++r) {
    a0[r] = _mm512_maskz_loadu_ps(m0, out + r * ldo);
    a1[r] = _mm512_maskz_loadu_ps(m1, out + r * ldo + 16);
  }
  for (size_t j = 0; j < np; ++j) {
    const __m512 v0 = _mm512_load_ps(buf + j * ld), v1 = _mm512_load_ps(buf + j * ld + 16);
    for (size_t r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ldp + j]);
      a0[r] = _mm512_fmadd_ps(pr, v0, a0[r]);
      a1[r] = _mm512_fmadd_ps(pr, v1, a1[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(out + r * ldo, m0, a0[r]);
    _mm512_mask_storeu_ps(out + r * ldo + 16, m1, a1[r]);
  }
}

using TileFn = void (*)(const float*, size_t, size_t, const float*, size_t, float*, size_t, size_t);
constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>,
                                         tile<5>, tile<6>, tile<7>, tile<8>};

}  // namespace

void pv(const PvArgs& a) {
  if (a.rows == 0 || a.n == 0 || a.n_pos == 0) return;
  alignas(64) float buf[kBufFloats];
  // Rows in blocks as even as possible: 13 rows as 7 + 6 rather than 8 + 5.
  const size_t n_blocks = (a.rows + kMaxRows - 1) / kMaxRows;
  for (size_t c0 = 0; c0 < a.n; c0 += kMaxCols) {
    const size_t cw = a.n - c0 < kMaxCols ? a.n - c0 : kMaxCols;
    const size_t ld = (cw + 31) / 32 * 32, per_buf = kBufFloats / ld;
    for (size_t j0 = 0; j0 < a.n_pos; j0 += per_buf) {
      const size_t np = a.n_pos - j0 < per_buf ? a.n_pos - j0 : per_buf;
      for (size_t j = 0; j < np; ++j)
        decode(a.v_type, static_cast<const char*>(a.v) + (j0 + j) * a.v_stride, a.e0 + c0, cw, ld, buf + j * ld);
      for (size_t c = 0; c < cw; c += kTileCols) {
        const size_t w = cw - c < kTileCols ? cw - c : kTileCols;
        for (size_t blk = 0, i0 = 0; blk < n_blocks; ++blk) {
          const size_t r = (a.rows - i0 + (n_blocks - blk) - 1) / (n_blocks - blk);
          kTiles[r](buf + c, ld, np, a.p + i0 * a.ldp + j0, a.ldp, a.out + i0 * a.ldo + c0 + c, a.ldo, w);
          i0 += r;
        }
      }
    }
  }
}

}  // namespace kiln::kernels::avx512
