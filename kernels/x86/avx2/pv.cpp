// AVX2 P V over value rows stored by position (kernels.h, PvArgs); the AVX-VNNI table
// uses it too (no integer dots here).
//
// As the AVX-512 version: a block of positions decoded once into an L1-sized stack buffer
// of floats, then blocks of up to 6 output rows walk it 16 columns at a time with their
// 6 x 2 accumulators in registers (12 + 2 values + 1 broadcast of the 16 registers).
// Each output lane gets one FMA per position in order, whatever the blocking.
//
// Everything but pv is internal: no AVX2 copy of a shared inline function can leak.
#include <immintrin.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace kiln::kernels::avx2 {

void pv(const PvArgs& a);

namespace {

constexpr size_t kBufFloats = 8192;  // 32 KiB of decoded values
constexpr size_t kMaxCols = 512;     // columns decoded at once: at least 16 positions per buffer
constexpr size_t kTileCols = 16;
constexpr size_t kMaxRows = 6;

inline size_t left(size_t n, size_t i) { return n > i ? n - i : 0; }
// Lanes [0, n) of 8 set, for maskload/maskstore (which never touch the others' memory).
inline __m256i lanes(size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n > 8 ? 8 : n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 halves from p, of which the first n (< 8) exist: AVX2 has no 16-bit masked load.
inline __m128i load_halves(const uint16_t* p, size_t n) {
  if (n >= 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint16_t h[8] = {};
  std::memcpy(h, p, n * sizeof(uint16_t));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(h));
}

// Bit-exact with the reference dequantization: an int converted to float is exact, and
// then one product with the widened scale, as ggml does.
inline void q8_0_block(const block_q8_0* b, float* dst) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
  for (size_t i = 0; i < 32; i += 8) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + i));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
  }
}

inline void q4_0_block(const block_q4_0* b, float* dst) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
  const __m256i eight = _mm256_set1_epi32(8), low = _mm256_set1_epi32(15);
  for (size_t i = 0; i < 16; i += 8) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + i)));
    const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, low), eight);
    const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d));
    _mm256_storeu_ps(dst + 16 + i, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d));
  }
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
      for (size_t i = 0; i < ld; i += 8) _mm256_store_ps(dst + i, _mm256_maskload_ps(src + i, lanes(left(w, i))));
      return;
    }
    case TensorType::F16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
      for (size_t i = 0; i < ld; i += 8) _mm256_store_ps(dst + i, _mm256_cvtph_ps(load_halves(src + i, left(w, i))));
      return;
    }
    case TensorType::BF16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
      for (size_t i = 0; i < ld; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(load_halves(src + i, left(w, i)));
        _mm256_store_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
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
  alignas(32) float block[32];
  for (size_t b = e0 / 32; b * 32 < e0 + w; ++b) {
    quant_block(t, row, b, block);
    const size_t lo = e0 > b * 32 ? e0 : b * 32, hi = e0 + w < b * 32 + 32 ? e0 + w : b * 32 + 32;
    std::memcpy(dst + (lo - e0), block + (lo - b * 32), (hi - lo) * sizeof(float));
  }
  std::memset(dst + w, 0, (ld - w) * sizeof(float));
}

// out rows [0, R) x columns [0, w) (w <= 16) += p rows x the buffer's np positions.
template <size_t R>
void tile(const float* buf, size_t ld, size_t np, const float* p, size_t ldp, float* out, size_t ldo, size_t w) {
  const __m256i m0 = lanes(w), m1 = lanes(left(w, 8));
  __m256 a0[R], a1[R];
  for (size_t r = 0; r < R; ++r) {
    a0[r] = _mm256_maskload_ps(out + r * ldo, m0);
    a1[r] = _mm256_maskload_ps(out + r * ldo + 8, m1);
  }
  for (size_t j = 0; j < np; ++j) {
    const __m256 v0 = _mm256_load_ps(buf + j * ld), v1 = _mm256_load_ps(buf + j * ld + 8);
    for (size_t r = 0; r < R; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * ldp + j);
      a0[r] = _mm256_fmadd_ps(pr, v0, a0[r]);
      a1[r] = _mm256_fmadd_ps(pr, v1, a1[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    _mm256_maskstore_ps(out + r * ldo, m0, a0[r]);
    _mm256_maskstore_ps(out + r * ldo + 8, m1, a1[r]);
  }
}

using TileFn = void (*)(const float*, size_t, size_t, const float*, size_t, float*, size_t, size_t);
constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

}  // namespace

void pv(const PvArgs& a) {
  if (a.rows == 0 || a.n == 0 || a.n_pos == 0) return;
  alignas(32) float buf[kBufFloats];
  // Rows in blocks as even as possible: 8 rows as 4 + 4 rather than 6 + 2.
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

}  // namespace kiln::kernels::avx2
