// AVX2 vector kernels. Tails go through zero-padded 8-lane buffers so every element,
// tail or not, sees the same instruction sequence (and no inline helper from a shared
// header gets an out-of-line AVX2 copy).
#include <immintrin.h>

#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"

namespace kiln::kernels::avx2 {

bool gemm_supports(TensorType t);
void gemm(const GemmArgs& a);
void pv(const PvArgs& a);  // pv.cpp
#ifdef KILN_HAVE_AVXVNNI
void gemm_vnni(const GemmArgs& a);
#endif

namespace {

struct Lanes {
  alignas(32) float v[8] = {};
};
inline __m256 load_tail(const float* p, size_t n) {
  Lanes l;
  for (size_t i = 0; i < n; ++i) l.v[i] = p[i];
  return _mm256_load_ps(l.v);
}
inline void store_tail(float* p, __m256 v, size_t n) {
  Lanes l;
  _mm256_store_ps(l.v, v);
  for (size_t i = 0; i < n; ++i) p[i] = l.v[i];
}

// exp(x): x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r, 2^n applied in two
// halves so n = 128 (x near ln FLT_MAX) stays representable. Results below FLT_MIN
// flush to 0, above FLT_MAX go to inf.
constexpr float kExpLo = -87.33654475f, kExpHi = 88.72283906f;
inline __m256 exp_ps(__m256 x) {
  const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(kExpHi)), _mm256_set1_ps(kExpLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ), e);
  return _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(kExpHi), _CMP_GT_OQ));
}

inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline float hmax(__m256 v) {
  const __m128 s4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_max_ss(s2, _mm_movehdup_ps(s2)));
}

float dot(const float* a, const float* b, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  if (i < n) s1 = _mm256_fmadd_ps(load_tail(a + i, n - i), load_tail(b + i, n - i), s1);
  return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

void axpy(float a, const float* x, float* y, size_t n) {
  const __m256 av = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) store_tail(y + i, _mm256_fmadd_ps(av, load_tail(x + i, n - i), load_tail(y + i, n - i)), n - i);
}

void scale(float* y, float a, size_t n) {
  const __m256 av = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
  if (i < n) store_tail(y + i, _mm256_mul_ps(av, load_tail(y + i, n - i)), n - i);
}

void add(const float* a, const float* b, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) store_tail(out + i, _mm256_add_ps(load_tail(a + i, n - i), load_tail(b + i, n - i)), n - i);
}

void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps) {
  const float sum_sq = dot(x, x, n);
  const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(sum_sq / (float)n + eps));
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _mm256_loadu_ps(weight + i)));
  if (i < n)
    store_tail(out + i, _mm256_mul_ps(_mm256_mul_ps(load_tail(x + i, n - i), inv), load_tail(weight + i, n - i)), n - i);
}

float exp_sum(float* x, size_t n, float max);

void softmax(float* x, size_t n) {
  if (n == 0) return;
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mv = neg_inf;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float max = hmax(mv);
  for (size_t j = i; j < n; ++j) max = x[j] > max ? x[j] : max;
  scale(x, 1.0f / exp_sum(x, n, max), n);
}

float exp_sum(float* x, size_t n, float max) {
  const __m256 maxv = _mm256_set1_ps(max);
  __m256 sv = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  if (i < n) {
    Lanes l;  // padding lanes hold -inf so they contribute exp(-inf) = 0 to the sum
    for (size_t j = 0; j < 8; ++j) l.v[j] = i + j < n ? x[i + j] : -__builtin_inff();
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_load_ps(l.v), maxv));
    store_tail(x + i, e, n - i);
    sv = _mm256_add_ps(sv, e);
  }
  return hsum(sv);
}

void layernorm(const float* x, const float* weight, const float* bias, float* out, size_t n, float eps) {
  __m256 sv = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) sv = _mm256_add_ps(sv, _mm256_loadu_ps(x + i));
  if (i < n) sv = _mm256_add_ps(sv, load_tail(x + i, n - i));
  const __m256 mean = _mm256_set1_ps(hsum(sv) / (float)n);
  __m256 qv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mean);
    qv = _mm256_fmadd_ps(d, d, qv);
  }
  if (i < n) {  // the padding lanes must add 0, not mean^2
    const __m256 d = _mm256_sub_ps(load_tail(x + i, n - i), mean);
    const size_t m = n - i;
    Lanes keep;
    for (size_t j = 0; j < m; ++j) keep.v[j] = 1.0f;
    const __m256 dm = _mm256_mul_ps(d, _mm256_load_ps(keep.v));
    qv = _mm256_fmadd_ps(dm, dm, qv);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(hsum(qv) / (float)n + eps));
  const auto row = [&](__m256 xv, __m256 wv, __m256 bv) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(xv, mean), inv), wv, bv);
  };
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, row(_mm256_loadu_ps(x + i), _mm256_loadu_ps(weight + i),
                                  bias ? _mm256_loadu_ps(bias + i) : _mm256_setzero_ps()));
  if (i < n)
    store_tail(out + i, row(load_tail(x + i, n - i), load_tail(weight + i, n - i),
                            bias ? load_tail(bias + i, n - i) : _mm256_setzero_ps()), n - i);
}

// gelu(x) = x / (1 + e^(-2u)), 2u = x (a + b x^2) (see kernels.h).
inline __m256 gelu_ps(__m256 x) {
  const __m256 a = _mm256_set1_ps(2.0f * 0.7978845608028654f), b = _mm256_set1_ps(2.0f * 0.7978845608028654f * 0.044715f);
  const __m256 u2 = _mm256_mul_ps(x, _mm256_fmadd_ps(b, _mm256_mul_ps(x, x), a));
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), u2));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void gelu(const float* x, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, gelu_ps(_mm256_loadu_ps(x + i)));
  if (i < n) store_tail(out + i, gelu_ps(load_tail(x + i, n - i)), n - i);
}

inline __m256 swiglu_ps(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu_ps(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) store_tail(out + i, swiglu_ps(load_tail(gate + i, n - i), load_tail(up + i, n - i)), n - i);
}

// Adjacent pairs: X*C -/+ swap(X)*S on even/odd lanes is exactly fmaddsub.
inline __m256 rotate_pairs(__m256 xv, __m256 csv) {
  const __m256 c = _mm256_moveldup_ps(csv), s = _mm256_movehdup_ps(csv);
  return _mm256_fmaddsub_ps(xv, c, _mm256_mul_ps(_mm256_permute_ps(xv, 0xB1), s));
}

void rope_pairs(float* head, size_t n_rot, const float* cs) {
  size_t i = 0;
  for (; i + 8 <= n_rot; i += 8)
    _mm256_storeu_ps(head + i, rotate_pairs(_mm256_loadu_ps(head + i), _mm256_loadu_ps(cs + i)));
  if (i < n_rot) store_tail(head + i, rotate_pairs(load_tail(head + i, n_rot - i), load_tail(cs + i, n_rot - i)), n_rot - i);
}

// NeoX halves: cos/sin de-interleaved by shuffle (within 128-bit lanes) + lane permute.
inline void rotate_halves(__m256 x0, __m256 x1, __m256 cs_lo, __m256 cs_hi, __m256* o0, __m256* o1) {
  const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs_lo, cs_hi, 0x88)), 0xD8));
  const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs_lo, cs_hi, 0xDD)), 0xD8));
  *o0 = _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s));
  *o1 = _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c));
}

void rope_halves(float* head, size_t half, const float* cs) {
  size_t i = 0;
  __m256 o0, o1;
  for (; i + 8 <= half; i += 8) {
    rotate_halves(_mm256_loadu_ps(head + i), _mm256_loadu_ps(head + i + half), _mm256_loadu_ps(cs + 2 * i),
                  _mm256_loadu_ps(cs + 2 * i + 8), &o0, &o1);
    _mm256_storeu_ps(head + i, o0);
    _mm256_storeu_ps(head + i + half, o1);
  }
  if (i < half) {
    const size_t n = half - i, n_cs = 2 * n;
    const __m256 cs_lo = load_tail(cs + 2 * i, n_cs < 8 ? n_cs : 8);
    const __m256 cs_hi = n_cs > 8 ? load_tail(cs + 2 * i + 8, n_cs - 8) : _mm256_setzero_ps();
    rotate_halves(load_tail(head + i, n), load_tail(head + i + half, n), cs_lo, cs_hi, &o0, &o1);
    store_tail(head + i, o0, n);
    store_tail(head + i + half, o1, n);
  }
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin, bool neox) {
  for (size_t h = 0; h < n_heads; ++h) {
    if (neox) rope_halves(x + h * head_dim, n_rot / 2, cos_sin);
    else rope_pairs(x + h * head_dim, n_rot & ~size_t{1}, cos_sin);
  }
}

struct Halves {
  alignas(16) uint16_t v[8] = {};
};

void fp16_to_f32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  if (i < n) {
    Halves h;
    for (size_t j = 0; j < n - i; ++j) h.v[j] = in[i + j];
    store_tail(out + i, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h.v))), n - i);
  }
}

void f32_to_fp16(const float* in, uint16_t* out, size_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), kRound));
  if (i < n) {
    Halves h;
    _mm_store_si128(reinterpret_cast<__m128i*>(h.v), _mm256_cvtps_ph(load_tail(in + i, n - i), kRound));
    for (size_t j = 0; j < n - i; ++j) out[i + j] = h.v[j];
  }
}

inline __m256 bf16_widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, bf16_widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  if (i < n) {
    Halves h;
    for (size_t j = 0; j < n - i; ++j) h.v[j] = in[i + j];
    store_tail(out + i, bf16_widen(_mm_load_si128(reinterpret_cast<const __m128i*>(h.v))), n - i);
  }
}

// Round to nearest even by integer add, NaNs quieted with their payload kept.
inline __m128i bf16_narrow(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i v = _mm256_blendv_epi8(rounded, quiet, nan);
  // packus works per 128-bit lane; values fit in 16 bits, so it only narrows.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16_narrow(_mm256_loadu_ps(in + i)));
  if (i < n) {
    Halves h;
    _mm_store_si128(reinterpret_cast<__m128i*>(h.v), bf16_narrow(load_tail(in + i, n - i)));
    for (size_t j = 0; j < n - i; ++j) out[i + j] = h.v[j];
  }
}

const Ops kOps = {
    Isa::avx2,    gemm_supports,  gemm,    dot,         axpy,        scale,
    add,          rmsnorm,        softmax, swiglu,      rope,        fp16_to_f32,
    f32_to_fp16,  bf16_to_f32,    f32_to_bf16,
    layernorm,    gelu,
    packed_bytes, prepared_bytes, prepare, exp_sum,
    pv,
};

#ifdef KILN_HAVE_AVXVNNI
// AVX2 plus AVX-VNNI: the same table but for the packed integer dots (vpdpbusd), so the
// weights are packed the same and activations prepared the same.
const Ops kOpsVnni = {
    Isa::avxvnni, gemm_supports,  gemm_vnni, dot,         axpy,        scale,
    add,          rmsnorm,        softmax,   swiglu,      rope,        fp16_to_f32,
    f32_to_fp16,  bf16_to_f32,    f32_to_bf16,
    layernorm,    gelu,
    packed_bytes, prepared_bytes, prepare, exp_sum,
    pv,
};
#endif

}  // namespace
}  // namespace kiln::kernels::avx2

namespace kiln::kernels {
const Ops& avx2_ops() { return avx2::kOps; }
#ifdef KILN_HAVE_AVXVNNI
const Ops& avxvnni_ops() { return avx2::kOpsVnni; }
#endif
}  // namespace kiln::kernels
