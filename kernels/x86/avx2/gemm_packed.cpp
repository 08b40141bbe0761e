// AVX2 gemm on packed quantized weights without VNNI (the kernels: packed_kernels.h),
// plus what the avx2 and avxvnni tables share: which types pack, and the conversion of
// activations to the 8-bit formats of kernels/packed.h.
#define KILN_PACKED_VNNI 0
#include "kernels/x86/avx2/packed_kernels.h"

namespace kiln::kernels::avx2 {
namespace {

// The types these kernels read (run_packed). Explicit rather than "whatever packed.h
// lays out", so a type added to the layout later stays unpacked here until it has a
// kernel.
bool packs(TensorType t) {
  switch (t) {
    case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0:
    case TensorType::Q5_1: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
    case TensorType::Q3_K: case TensorType::Q2_K: return true;
    default: return false;
  }
}

inline float hmax(__m256 v) {
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
}
inline int32_t hsum_epi32(__m256i v) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}
inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// 32 int32 (each in -127..127) to 32 bytes in order: the packs work per 128-bit lane,
// so the dwords come out lane-interleaved and one permute puts them back.
inline __m256i narrow32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// As ggml's Q8_0 activations (fp16 scale, q rounded half away from zero), the same
// arithmetic as the AVX-512 prepare, so both give the same bytes.
void prepare_q8_32(const float* x, size_t k, void* out_row) {
  auto* q = static_cast<int8_t*>(out_row);
  auto* d = reinterpret_cast<float*>(q + k);
  auto* s = reinterpret_cast<int32_t*>(d + k / 32);
  const __m256 half = _mm256_set1_ps(0.5f), sign_bit = _mm256_set1_ps(-0.0f);
  for (size_t b = 0; b < k / 32; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
    const float amax = hmax(_mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])), _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3]))));
    const float scale = amax / 127.0f;
    d[b] = _cvtsh_ss(_cvtss_sh(scale, _MM_FROUND_TO_NEAREST_INT));
    // Divided by the unrounded scale, so |q| <= 127 (the vpmaddubsw bounds rely on it).
    const __m256 inv = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 t = _mm256_mul_ps(v[i], inv);
      qi[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(t, sign_bit), half)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), narrow32(qi[0], qi[1], qi[2], qi[3]));
    s[b] = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
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
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(xs + 8 * i)));
    const float amax = hmax(m);
    d[sb] = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    for (int c = 0; c < 8; ++c) {  // 32 elements: two sums of 16
      __m256i qi[4];
      for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + 32 * c + 8 * i), inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 256 * sb + 32 * c), narrow32(qi[0], qi[1], qi[2], qi[3]));
      const int32_t lo = hsum_epi32(_mm256_add_epi32(qi[0], qi[1])), hi = hsum_epi32(_mm256_add_epi32(qi[2], qi[3]));
      s16[16 * sb + 2 * c] = int16_t(lo);
      s16[16 * sb + 2 * c + 1] = int16_t(hi);
      s32[8 * sb + c] = int16_t(lo + hi);
    }
  }
}

}  // namespace

size_t packed_bytes(TensorType t, size_t rows, size_t k) {
  if (!packs(t) || k % record_elements(t) != 0 || act_row_bytes(act_format(t), k) > kPreparedStackBytes) return 0;
  return tensor_bytes(t, rows, k);
}

size_t prepared_bytes(TensorType w_type, size_t k, size_t n_batch) {
  return packs(w_type) ? act_row_bytes(act_format(w_type), k) * n_batch : 0;
}

void prepare(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out) {
  if (!packs(w_type)) return;
  const ActFormat f = act_format(w_type);
  const size_t stride = act_row_bytes(f, k);
  for (size_t b = b0; b < b1; ++b) {
    void* row = static_cast<uint8_t*>(out) + b * stride;
    if (f == ActFormat::q8_32) prepare_q8_32(x + b * ldx, k, row);
    else if (f == ActFormat::q8_256) prepare_q8_256(x + b * ldx, k, row);
  }
}

void gemm_packed(const GemmArgs& a) { gemm_packed_impl(a); }

}  // namespace kiln::kernels::avx2
