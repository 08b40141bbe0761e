// AMX-INT8 tiles for prefill on packed Q8_0 / Q4_0 weights (layout: kernels/packed.h).
//
// A packed record's 8 weight vectors are nearly an AMX B operand: vector u holds, in lane
// r, row r's 4 consecutive weights 4u..4u+3 of the block, the "4 bytes of K per column"
// layout TDPBSSD reads. Unpacked once per weight group to signed bytes (a scratch that
// stays in L2 while every 16-row run of activations passes over it), one block is
// C[16 act rows][16 weight rows] = A[16 x 32 activations] . B[8 x 64 weights], K = 32:
// the block's exact integer sums for 256 outputs in one instruction. The scaling then
// runs per activation row as the VNNI tile does it (converted, times dw * dx, added to
// the row's accumulator): same integers, same float operations, same order.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/amx/gemm_amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/packed.h"

namespace kiln::kernels::amx {
namespace {

using namespace packed;

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state
constexpr int kXfeatureXtiledata = 18;

bool cpu_has_amx_int8() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d & (1u << 24)) && (d & (1u << 25));  // AMX-TILE, AMX-INT8
}

// The tile configuration is per thread: each pool thread loads it before its first tile.
// Two sets of registers so that one block's tile product runs while the previous block's
// sums are scaled: C tmm0 / tmm3 (16 x 16 int32), A tmm1 / tmm4 (16 x 32 int8), B tmm2 /
// tmm5 (8 x 64 int8).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_this_thread() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int set = 0; set < 2; ++set) {
    cfg.colsb[3 * set] = 64, cfg.rows[3 * set] = 16;
    cfg.colsb[3 * set + 1] = 32, cfg.rows[3 * set + 1] = 16;
    cfg.colsb[3 * set + 2] = 64, cfg.rows[3 * set + 2] = 8;
  }
  _tile_loadconfig(&cfg);
  configured = true;
}

// The lanes of the group starting at row0 that lie inside [r0, r1): a group overlapping
// the range runs whole and stores only these.
inline __mmask16 group_lanes(size_t row0, size_t r0, size_t r1) {
  const size_t lo = r0 > row0 ? r0 - row0 : 0;
  const size_t hi = r1 - row0 < kGroupRows ? r1 - row0 : kGroupRows;
  return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

inline __m512 load_fp16x16(const void* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }

// The 8 weight vectors of record `rec` as signed values (the file's q, without the
// packed layout's offset), in B-operand order: vector u, lane r = row r's weights
// 4u..4u+3. The products then need no offset correction: sum(x_q * q) is the integer the
// VNNI tile reaches as sum(x_q * (q + offset)) - offset * sum(x_q).
template <TensorType T>
inline void unpack_record(const uint8_t* rec, int8_t* out) {
  const uint8_t* qs = rec + 32;
  if constexpr (T == TensorType::Q8_0) {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int v = 0; v < 8; ++v) _mm512_storeu_si512(out + 64 * v, _mm512_xor_si512(_mm512_loadu_si512(qs + 64 * v), flip));
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    for (int v = 0; v < 4; ++v) {
      const __m512i b = _mm512_loadu_si512(qs + 64 * v);
      _mm512_storeu_si512(out + 64 * v, _mm512_sub_epi8(_mm512_and_si512(b, low4), eight));
      _mm512_storeu_si512(out + 64 * (v + 4), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(b, 4), low4), eight));
    }
  }
}

// Block blk's products for the 16 activation rows at act_rows into C register set S, and
// acc[j] += float(C[j]) * (dw * dx[j]) from it: the VNNI tile's float operations, in its
// order. (GCC's tile intrinsics paste their register numbers into the assembly: literals.)
template <int S>
inline void tile_product(const void* a, size_t a_stride, const int8_t* b) {
  if constexpr (S == 0) {
    _tile_zero(0);
    _tile_loadd(1, a, a_stride);
    _tile_loadd(2, b, 64);
    _tile_dpbssd(0, 1, 2);
  } else {
    _tile_zero(3);
    _tile_loadd(4, a, a_stride);
    _tile_loadd(5, b, 64);
    _tile_dpbssd(3, 4, 5);
  }
}

template <int S>
inline void block_product(const uint8_t* act_rows, size_t act_stride, const int8_t* b_operands, size_t blk) {
  tile_product<S>(act_rows + 32 * blk, act_stride, b_operands + 512 * blk);
}

template <int S>
inline void store_c(int32_t (*c)[16]) {
  if constexpr (S == 0) _tile_stored(0, c, 64);
  else _tile_stored(3, c, 64);
}

template <int S>
inline void scale_block(int32_t (*c)[16], const uint8_t* rec, const float* dx, __m512 acc[16]) {
  store_c<S>(c);
  const __m512 dw = load_fp16x16(rec);
  for (int j = 0; j < 16; ++j)
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[j])), _mm512_mul_ps(dw, _mm512_set1_ps(dx[j])), acc[j]);
}

template <TensorType T>
void run_groups(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  constexpr size_t R = record_bytes(T);
  const size_t blocks = a.k / 32, gbytes = group_bytes(T, a.k);
  const size_t act_stride = act_row_bytes(ActFormat::q8_32, a.k);
  const auto* act_bytes = static_cast<const uint8_t*>(act);
  // A group's B operands, and every 16-row run's activation scales by block (dx[run][blk][j]).
  thread_local std::vector<int8_t> b_operands;
  thread_local std::vector<float> dx;
  b_operands.resize(blocks * 512);
  const size_t runs = (b1 - b0) / 16;
  dx.resize(runs * blocks * 16);
  for (size_t run = 0; run < runs; ++run)
    for (int j = 0; j < 16; ++j) {
      const ActRow32 xr = act_row32(act_bytes, a.k, 16 * run + j);
      for (size_t blk = 0; blk < blocks; ++blk) dx[(run * blocks + blk) * 16 + j] = xr.d[blk];
    }
  alignas(64) int32_t c[2][16][16];
  configure_this_thread();
  for (size_t g = a.r0 / kGroupRows; g * kGroupRows < a.r1; ++g) {
    const size_t row0 = g * kGroupRows;
    const __mmask16 lanes = group_lanes(row0, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    for (size_t blk = 0; blk < blocks; ++blk) unpack_record<T>(group + blk * R, b_operands.data() + blk * 512);
    for (size_t run = 0; run < runs; ++run) {
      const uint8_t* act_rows = act_bytes + 16 * run * act_stride;
      const float* run_dx = dx.data() + run * blocks * 16;
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      // Software-pipelined: block b + 1's product runs while block b is scaled.
      block_product<0>(act_rows, act_stride, b_operands.data(), 0);
      for (size_t blk = 0; blk < blocks; blk += 2) {
        if (blk + 1 < blocks) block_product<1>(act_rows, act_stride, b_operands.data(), blk + 1);
        scale_block<0>(c[0], group + blk * R, run_dx + blk * 16, acc);
        if (blk + 2 < blocks) block_product<0>(act_rows, act_stride, b_operands.data(), blk + 2);
        if (blk + 1 < blocks) scale_block<1>(c[1], group + (blk + 1) * R, run_dx + (blk + 1) * 16, acc);
      }
      for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(a.y + (b0 + 16 * run + j) * a.ldy + row0, lanes, acc[j]);
    }
  }
}

// ---------------------------------------------------------------- Q4_K
//
// Per 32-value sub-block the tile gives sum(x_q * q) for 16 x 16 outputs (q 0..15 fits a
// signed byte as it is); the VNNI tile's integer steps follow: times the sub-block's
// 6-bit scale into int32 sums, the mins against the activations' 32-value sums, then its
// float operations once per 256 values (kernels/x86/avx512/gemm_packed_k.cpp q4_k_tile).

template <int S>
inline void add_scaled(int32_t (*c)[16], __m512i scale, __m512i sumi[16]) {
  store_c<S>(c);
  for (int j = 0; j < 16; ++j) sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(_mm512_load_si512(c[j]), scale));
}

inline __m512i q4k_scale(const uint8_t* rec, int sub) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 64 + 16 * sub)));
}

void run_groups_q4_k(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  constexpr size_t R = record_bytes(TensorType::Q4_K);
  const size_t supers = a.k / 256, gbytes = group_bytes(TensorType::Q4_K, a.k);
  const size_t act_stride = act_row_bytes(ActFormat::q8_256, a.k);
  const auto* act_bytes = static_cast<const uint8_t*>(act);
  thread_local std::vector<int8_t> b_operands;  // a group's, sub-block by sub-block
  b_operands.resize(supers * 8 * 512);
  const size_t runs = (b1 - b0) / 16;
  alignas(64) int32_t c[2][16][16];
  alignas(64) float acc[16][16];
  configure_this_thread();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (size_t g = a.r0 / kGroupRows; g * kGroupRows < a.r1; ++g) {
    const size_t row0 = g * kGroupRows;
    const __mmask16 lanes = group_lanes(row0, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    for (size_t sb = 0; sb < supers; ++sb)
      for (int sub = 0; sub < 8; ++sub) {  // pair sub / 2, nibble sub % 2
        const uint8_t* pv = group + sb * R + 320 + 512 * (sub / 2);
        int8_t* out = b_operands.data() + (sb * 8 + sub) * 512;
        for (int v = 0; v < 8; ++v) {
          const __m512i b = _mm512_loadu_si512(pv + 64 * v);
          _mm512_storeu_si512(out + 64 * v, _mm512_and_si512(sub % 2 ? _mm512_srli_epi16(b, 4) : b, low4));
        }
      }
    for (size_t run = 0; run < runs; ++run) {
      const uint8_t* act_rows = act_bytes + 16 * run * act_stride;
      for (int j = 0; j < 16; ++j) _mm512_store_ps(acc[j], _mm512_setzero_ps());
      for (size_t sb = 0; sb < supers; ++sb) {
        const uint8_t* rec = group + sb * R;
        const int8_t* b_sb = b_operands.data() + sb * 8 * 512;
        const uint8_t* a_sb = act_rows + 256 * sb;
        __m512i sumi[16];
        for (int j = 0; j < 16; ++j) sumi[j] = _mm512_setzero_si512();
        tile_product<0>(a_sb, act_stride, b_sb);
        for (int sub = 0; sub < 8; sub += 2) {  // software-pipelined as the legacy runs
          tile_product<1>(a_sb + 32 * (sub + 1), act_stride, b_sb + 512 * (sub + 1));
          add_scaled<0>(c[0], q4k_scale(rec, sub), sumi);
          if (sub + 2 < 8) tile_product<0>(a_sb + 32 * (sub + 2), act_stride, b_sb + 512 * (sub + 2));
          add_scaled<1>(c[1], q4k_scale(rec, sub + 1), sumi);
        }
        const __m512 d = load_fp16x16(rec), dmin = load_fp16x16(rec + 32);
        __m512i mpairs[4];
        for (int p = 0; p < 4; ++p)
          mpairs[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 192 + 32 * p)));
        for (int j = 0; j < 16; ++j) {
          const ActRow256 xr = act_row256(act_rows, a.k, j);
          __m512i msum = _mm512_setzero_si512();
          for (int p = 0; p < 4; ++p) {
            int32_t pair;
            std::memcpy(&pair, xr.s32 + 8 * sb + 2 * p, 4);
            msum = _mm512_dpwssd_epi32(msum, mpairs[p], _mm512_set1_epi32(pair));
          }
          const __m512 dx = _mm512_set1_ps(xr.d[sb]);
          __m512 r = _mm512_load_ps(acc[j]);
          r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[j]), _mm512_mul_ps(d, dx), r);
          r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), r);
          _mm512_store_ps(acc[j], r);
        }
      }
      for (int j = 0; j < 16; ++j)
        _mm512_mask_storeu_ps(a.y + (b0 + 16 * run + j) * a.ldy + row0, lanes, _mm512_load_ps(acc[j]));
    }
  }
}

}  // namespace

bool usable() {
  static const bool ok = [] {
    if (const char* env = std::getenv("KILN_AMX"); env && std::strcmp(env, "0") == 0) return false;
    if (!cpu_has_amx_int8()) return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

bool supports(TensorType w_type) {
  return w_type == TensorType::Q8_0 || w_type == TensorType::Q4_0 || w_type == TensorType::Q4_K;
}

void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q8_0: return run_groups<TensorType::Q8_0>(a, act, b0, b1);
    case TensorType::Q4_0: return run_groups<TensorType::Q4_0>(a, act, b0, b1);
    case TensorType::Q4_K: return run_groups_q4_k(a, act, b0, b1);
    default: return;
  }
}

}  // namespace kiln::kernels::amx
