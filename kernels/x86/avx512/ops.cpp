// AVX-512 vector kernels. Tails use masked loads/stores so no scalar clean-up loops;
// all helpers are internal so no AVX-512 code can be picked up by another TU.
// GCC 12 flags the deliberately undefined upper lanes inside its own 512->256 extract
// intrinsics as uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"

namespace kiln::kernels::avx512 {

bool gemm_supports(TensorType t);
void gemm(const GemmArgs& a);
void pv(const PvArgs& a);  // pv.cpp

namespace {

inline __mmask16 tail_mask(size_t n) { return (__mmask16)((1u << n) - 1); }

// exp(x) to ~2 ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2 is exact
// enough), degree-7 Taylor for e^r (truncation error < 6e-9 relative), then scalef
// applies 2^n and handles overflow to inf and underflow through subnormals to 0.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

float dot(const float* a, const float* b, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i + 16 <= n; i += 16)
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

void axpy(float a, const float* x, float* y, size_t n) {
  const __m512 av = _mm512_set1_ps(a);
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

void scale(float* y, float a, size_t n) {
  const __m512 av = _mm512_set1_ps(a);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(av, _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void add(const float* a, const float* b, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps) {
  const float sum_sq = dot(x, x, n);
  const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(sum_sq / (float)n + eps));
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv),
                                            _mm512_loadu_ps(weight + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv),
                                                    _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

float exp_sum(float* x, size_t n, float max_value);

void softmax(float* x, size_t n) {
  if (n == 0) return;
  __m512 mv = _mm512_set1_ps(-__builtin_inff());
  size_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
  if (i < n) mv = _mm512_mask_max_ps(mv, tail_mask(n - i), mv, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  scale(x, 1.0f / exp_sum(x, n, _mm512_reduce_max_ps(mv)), n);
}

float exp_sum(float* x, size_t n, float max_value) {
  const __m512 max = _mm512_set1_ps(max_value);
  __m512 sv = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max)));
    _mm512_mask_storeu_ps(x + i, m, e);
    sv = _mm512_add_ps(sv, e);
  }
  return _mm512_reduce_add_ps(sv);
}

void layernorm(const float* x, const float* weight, const float* bias, float* out, size_t n, float eps) {
  __m512 sv = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) sv = _mm512_add_ps(sv, _mm512_loadu_ps(x + i));
  if (i < n) sv = _mm512_add_ps(sv, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sv) / (float)n);
  __m512 qv = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), mean);
    qv = _mm512_fmadd_ps(d, d, qv);
  }
  if (i < n) {  // zero-masked so the padding lanes add 0, not mean^2
    const __mmask16 m = tail_mask(n - i);
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), mean);
    qv = _mm512_fmadd_ps(d, d, qv);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(_mm512_reduce_add_ps(qv) / (float)n + eps));
  const auto row = [&](__m512 xv, __m512 wv, __m512 bv) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(xv, mean), inv), wv, bv);
  };
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, row(_mm512_loadu_ps(x + i), _mm512_loadu_ps(weight + i),
                                  bias ? _mm512_loadu_ps(bias + i) : _mm512_setzero_ps()));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, row(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, weight + i),
                                          bias ? _mm512_maskz_loadu_ps(m, bias + i) : _mm512_setzero_ps()));
  }
}

// gelu(x) = x / (1 + e^(-2u)), 2u = x (a + b x^2) (see kernels.h).
inline __m512 gelu_ps(__m512 x) {
  const __m512 a = _mm512_set1_ps(2.0f * 0.7978845608028654f), b = _mm512_set1_ps(2.0f * 0.7978845608028654f * 0.044715f);
  const __m512 u2 = _mm512_mul_ps(x, _mm512_fmadd_ps(b, _mm512_mul_ps(x, x), a));
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), u2));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

void gelu(const float* x, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, gelu_ps(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, gelu_ps(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

inline __m512 swiglu_ps(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, swiglu_ps(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, swiglu_ps(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// Adjacent pairs: with X = (x0, x1, ...) and CS = (c, s, ...) the rotation is
// X*C -/+ swap(X)*S on even/odd lanes, which is exactly fmaddsub.
void rope_pairs(float* head, size_t n_rot, const float* cs) {
  size_t i = 0;
  for (; i < n_rot; i += 16) {
    const __mmask16 m = n_rot - i >= 16 ? (__mmask16)0xffff : tail_mask(n_rot - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, head + i), csv = _mm512_maskz_loadu_ps(m, cs + i);
    const __m512 c = _mm512_moveldup_ps(csv), s = _mm512_movehdup_ps(csv);
    const __m512 swapped = _mm512_permute_ps(xv, 0xB1);
    _mm512_mask_storeu_ps(head + i, m, _mm512_fmaddsub_ps(xv, c, _mm512_mul_ps(swapped, s)));
  }
}

// NeoX halves: (x[i], x[i + half]); cos/sin are de-interleaved with one permute each.
void rope_halves(float* head, size_t half, const float* cs) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (size_t i = 0; i < half; i += 16) {
    const size_t left = half - i;
    const __mmask16 m = left >= 16 ? (__mmask16)0xffff : tail_mask(left);
    const __mmask16 m_lo = left >= 8 ? (__mmask16)0xffff : tail_mask(2 * left);
    const __mmask16 m_hi = left >= 16 ? (__mmask16)0xffff : left > 8 ? tail_mask(2 * (left - 8)) : 0;
    const __m512 cs_lo = _mm512_maskz_loadu_ps(m_lo, cs + 2 * i);
    const __m512 cs_hi = _mm512_maskz_loadu_ps(m_hi, cs + 2 * i + 16);
    const __m512 c = _mm512_permutex2var_ps(cs_lo, even, cs_hi);
    const __m512 s = _mm512_permutex2var_ps(cs_lo, odd, cs_hi);
    const __m512 x0 = _mm512_maskz_loadu_ps(m, head + i), x1 = _mm512_maskz_loadu_ps(m, head + i + half);
    _mm512_mask_storeu_ps(head + i, m, _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s)));
    _mm512_mask_storeu_ps(head + i + half, m, _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c)));
  }
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin, bool neox) {
  for (size_t h = 0; h < n_heads; ++h) {
    if (neox) rope_halves(x + h * head_dim, n_rot / 2, cos_sin);
    else rope_pairs(x + h * head_dim, n_rot & ~size_t{1}, cos_sin);
  }
}

void fp16_to_f32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, in + i)));
  }
}

void f32_to_fp16(const float* in, uint16_t* out, size_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtps_ph(_mm512_loadu_ps(in + i), kRound));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, in + i), kRound));
  }
}

inline __m512 bf16_widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, bf16_widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, bf16_widen(_mm256_maskz_loadu_epi16(m, in + i)));
  }
}

// Round to nearest even by integer add (as the scalar version); NaNs keep their payload
// and get the quiet bit so rounding can never turn them into infinities.
inline __m256i bf16_narrow(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16_narrow(_mm512_loadu_ps(in + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm256_mask_storeu_epi16(out + i, m, bf16_narrow(_mm512_maskz_loadu_ps(m, in + i)));
  }
}

const Ops kOps = {
    Isa::avx512, gemm_supports, gemm,    dot,         axpy,        scale,
    add,         rmsnorm,       softmax, swiglu,      rope,        fp16_to_f32,
    f32_to_fp16, bf16_to_f32,   f32_to_bf16,
    layernorm,   gelu,
    packed_bytes, prepared_bytes, prepare, exp_sum,
    pv,
};

}  // namespace
}  // namespace kiln::kernels::avx512

namespace kiln::kernels {
const Ops& avx512_ops() { return avx512::kOps; }
}  // namespace kiln::kernels
