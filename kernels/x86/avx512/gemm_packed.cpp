// AVX-512 VNNI gemm on packed legacy quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1;
// layout: kernels/packed.h), activation conversion, and the packed entry points.
//
// One group of 16 weight rows against a tile of RB activation rows: per 32-element block
// the weights are unpacked once into eight vectors of unsigned bytes (lane = row), and
// each activation row adds its products with eight vpdpbusd whose activation operand is
// 4 bytes broadcast to all lanes. Integer block sums are exact; offsets (weights are
// stored unsigned) are subtracted by starting the sum at -offset * sum(x_q).
//
// Determinism: each output (lane, activation row) runs the same operations in the same
// order whatever RB, the group's position in [r0, r1) or the batch size, so results do
// not depend on how a caller splits rows or batches, and decode equals batch.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/avx512/gemm_packed.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/packed.h"
#include "kernels/x86/avx512/packed_tiles.h"

namespace kiln::kernels::avx512 {
namespace {

using namespace packed;

// ---------------------------------------------------------------- activations

// As ggml's Q8_0 activations (fp16 scale, q rounded half away from zero), so products
// match what llama.cpp computes for the same file.
void prepare_q8_32(const float* x, size_t k, void* out_row) {
  auto* q = static_cast<int8_t*>(out_row);
  auto* d = reinterpret_cast<float*>(q + k);
  auto* s = reinterpret_cast<int32_t*>(d + k / 32);
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512i sign_bit = _mm512_set1_epi32(INT32_MIN);
  for (size_t b = 0; b < k / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float scale = amax / 127.0f;
    d[b] = _cvtsh_ss(_cvtss_sh(scale, _MM_FROUND_TO_NEAREST_INT));
    const __m512 inv = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    const auto round_away = [&](__m512 v) {
      const __m512 t = _mm512_mul_ps(v, inv);
      const __m512 h = _mm512_castsi512_ps(
          _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(t), sign_bit), _mm512_castps_si512(half)));
      return _mm512_cvttps_epi32(_mm512_add_ps(t, h));
    };
    const __m512i i0 = round_away(v0), i1 = round_away(v1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
    s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  }
}

// One scale per 256 elements (as ggml's Q8_K): K-quant sub-block scales are integers, so
// a super-block's sum stays in int32 until its single float multiply.
void prepare_q8_256(const float* x, size_t k, void* out_row) {
  auto* q = static_cast<int8_t*>(out_row);
  auto* d = reinterpret_cast<float*>(q + k);
  auto* s16 = reinterpret_cast<int16_t*>(d + k / 256);
  auto* s32 = s16 + k / 16;
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const float* xs = x + 256 * sb;
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xs + 16 * i)));
    const float amax = _mm512_reduce_max_ps(m);
    d[sb] = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    for (int i = 0; i < 16; ++i) {
      const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * i), inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 256 * sb + 16 * i), _mm512_cvtsepi32_epi8(qi));
      s16[16 * sb + i] = (int16_t)_mm512_reduce_add_epi32(qi);
    }
    for (int j = 0; j < 8; ++j) s32[8 * sb + j] = int16_t(s16[16 * sb + 2 * j] + s16[16 * sb + 2 * j + 1]);
  }
}

// ---------------------------------------------------------------- legacy types

template <TensorType T>
struct Legacy {
  static constexpr bool has_m = T == TensorType::Q4_1 || T == TensorType::Q5_1;
  static constexpr bool has_qh = T == TensorType::Q5_0 || T == TensorType::Q5_1;
  static constexpr int32_t offset = T == TensorType::Q8_0 ? 128 : T == TensorType::Q4_0 ? 8 : T == TensorType::Q5_0 ? 16 : 0;
  static constexpr size_t qs_at = 32 + (has_m ? 32 : 0) + (has_qh ? 64 : 0);

  static inline void unpack(const uint8_t* rec, __m512i w[8]) {
    const uint8_t* qs = rec + qs_at;
    if constexpr (T == TensorType::Q8_0) {
      for (int v = 0; v < 8; ++v) w[v] = load(qs + 64 * v);
    } else {
      const __m512i low4 = _mm512_set1_epi8(0x0f);
      for (int v = 0; v < 4; ++v) {
        const __m512i b = load(qs + 64 * v);
        w[v] = _mm512_and_si512(b, low4);
        w[v + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
      }
      if constexpr (has_qh) {
        const uint8_t* qh = rec + 32 + (has_m ? 32 : 0);
        const __m512i sixteen = _mm512_set1_epi8(16);
        for (int v = 0; v < 8; ++v) {
          __mmask64 bits;
          std::memcpy(&bits, qh + 8 * v, 8);
          w[v] = _mm512_mask_add_epi8(w[v], bits, w[v], sixteen);
        }
      }
    }
  }
};

template <TensorType T, int RB>
void legacy_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, __mmask16 lanes) {
  using L = Legacy<T>;
  constexpr size_t R = record_bytes(T);
  ActRow32 xr[RB];
  __m512 acc[RB];
#pragma GCC unroll 16
  for (int j = 0; j < RB; ++j) xr[j] = act_row32(act, k, j), acc[j] = _mm512_setzero_ps();
  for (size_t blk = 0; blk < k / 32; ++blk) {
    const uint8_t* rec = group + blk * R;
    const __m512 dw = load_fp16x16(rec);
    __m512i w[8];
    L::unpack(rec, w);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      const int8_t* xq = xr[j].q + 32 * blk;
      __m512i isum = L::offset ? _mm512_set1_epi32(-L::offset * xr[j].s[blk]) : _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u) isum = _mm512_dpbusd_epi32(isum, w[u], bcast4(xq + 4 * u));
      const float dx = xr[j].d[blk];
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[j]);
      // x = d q + m: the m part is m * sum(x) = m * dx * sum(x_q).
      if constexpr (L::has_m) acc[j] = _mm512_fmadd_ps(load_fp16x16(rec + 32), _mm512_set1_ps(dx * float(xr[j].s[blk])), acc[j]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < RB; ++j) _mm512_mask_storeu_ps(y + j * ldy, lanes, acc[j]);
}

template <TensorType T>
struct LegacyTile {
  template <int RB>
  static void fn(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, __mmask16 lanes) {
    legacy_tile<T, RB>(group, k, act, y, ldy, lanes);
  }
};

}  // namespace

size_t packed_bytes(TensorType t, size_t rows, size_t k) {
  if (!record_bytes(t) || k % record_elements(t) != 0 || act_row_bytes(act_format(t), k) > kPreparedStackBytes) return 0;
  return tensor_bytes(t, rows, k);
}

size_t prepared_bytes(TensorType w_type, size_t k, size_t n_batch) {
  return act_row_bytes(act_format(w_type), k) * n_batch;
}

void prepare(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out) {
  const ActFormat f = act_format(w_type);
  const size_t stride = act_row_bytes(f, k);
  for (size_t b = b0; b < b1; ++b) {
    void* row = static_cast<uint8_t*>(out) + b * stride;
    if (f == ActFormat::q8_32) prepare_q8_32(x + b * ldx, k, row);
    else if (f == ActFormat::q8_256) prepare_q8_256(x + b * ldx, k, row);
  }
}

void run_packed_legacy(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q8_0: return run_groups<LegacyTile<TensorType::Q8_0>>(a, act, b0, b1);
    case TensorType::Q4_0: return run_groups<LegacyTile<TensorType::Q4_0>>(a, act, b0, b1);
    case TensorType::Q4_1: return run_groups<LegacyTile<TensorType::Q4_1>>(a, act, b0, b1);
    case TensorType::Q5_0: return run_groups<LegacyTile<TensorType::Q5_0>>(a, act, b0, b1);
    case TensorType::Q5_1: return run_groups<LegacyTile<TensorType::Q5_1>>(a, act, b0, b1);
    default: return;
  }
}

namespace {
void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  if (packed::act_format(a.w_type) == packed::ActFormat::q8_256) run_packed_k(a, act, b0, b1);
  else run_packed_legacy(a, act, b0, b1);
}
}  // namespace

void gemm_packed(const GemmArgs& a) {
  if (a.x_prepared) return run_packed(a, a.x_prepared, 0, a.n_batch);
  // No prepared copy: quantize as many activation rows as fit onto the stack at a time.
  alignas(64) uint8_t buf[kPreparedStackBytes];
  const size_t stride = packed::act_row_bytes(packed::act_format(a.w_type), a.k);
  const size_t rows = sizeof(buf) / stride;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += rows) {
    const size_t b1 = b0 + rows < a.n_batch ? b0 + rows : a.n_batch;
    prepare(a.w_type, a.x + b0 * a.ldx, a.ldx, a.k, 0, b1 - b0, buf);
    run_packed(a, buf, b0, b1);
  }
}

}  // namespace kiln::kernels::avx512
