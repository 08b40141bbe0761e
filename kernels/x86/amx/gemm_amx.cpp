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
#include "kernels/quant_iq.h"
#include "kernels/x86/avx512/packed_tiles.h"

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

enum class Tiles { legacy, k_quant };

// Legacy blocks: two sets of C tmm0 / tmm3 (16 x 16 int32), A tmm1 / tmm4 (16 x 32 int8),
// B tmm2 / tmm5 (8 x 64 int8). K-quants: every register 16 x 64 bytes (C tmm0, tmm1; A,
// B operands tmm2..tmm7). A thread reloads the configuration when it switches.
void configure_this_thread(Tiles tiles) {
  thread_local int loaded = -1;
  if (loaded == int(tiles)) return;
  TileConfig cfg;
  if (tiles == Tiles::legacy) {
    for (int set = 0; set < 2; ++set) {
      cfg.colsb[3 * set] = 64, cfg.rows[3 * set] = 16;
      cfg.colsb[3 * set + 1] = 32, cfg.rows[3 * set + 1] = 16;
      cfg.colsb[3 * set + 2] = 64, cfg.rows[3 * set + 2] = 8;
    }
  } else {
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  loaded = int(tiles);
}

using avx512::group_lanes;
using avx512::load_fp16x16;

// The 8 weight vectors of record `rec` as signed values (the file's q, without the
// packed layout's offset; IQ4_NL's looked-up values), in B-operand order: vector u, lane r = row r's weights
// 4u..4u+3. The products then need no offset correction: sum(x_q * q) is the integer the
// VNNI tile reaches as sum(x_q * (q + offset)) - offset * sum(x_q).
template <TensorType T>
inline void unpack_record(const uint8_t* rec, int8_t* out) {
  const uint8_t* qs = rec + 32;
  if constexpr (T == TensorType::IQ4_NL) {  // the nibble's value, already a signed byte
    alignas(16) int8_t values[16];
    for (int i = 0; i < 16; ++i) values[i] = kIq4nlValues[i];
    const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(values)));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int v = 0; v < 4; ++v) {
      const __m512i b = _mm512_loadu_si512(qs + 64 * v);
      _mm512_storeu_si512(out + 64 * v, _mm512_shuffle_epi8(table, _mm512_and_si512(b, low4)));
      _mm512_storeu_si512(out + 64 * (v + 4), _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4)));
    }
  } else if constexpr (T == TensorType::Q8_0) {
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
  configure_this_thread(Tiles::legacy);
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
// The VNNI tile sums sum(x_q * q) per 32-value sub-block, multiplies by the sub-block's
// 6-bit scale into int32, adds the eight, subtracts the mins' part and converts once per
// 256 values (kernels/x86/avx512/gemm_packed_k.cpp q4_k_tile). Here the scale goes into
// the B operand instead, in two halves that each fit a signed byte: q * (sc >> 3) and
// q * (sc & 7) are at most 15 * 7. Two tiles then accumulate a whole super-block, and
// 8 * C_hi + C_lo is sum over sub-blocks of sc * sum(x_q * q): the VNNI tile's integer.

// Bytes of v (0..15) times the byte of their 32-bit lane in s (0..7): at most 105.
inline __m512i mul_lane_bytes(__m512i v, __m512i s) {
  const __m512i s16 = _mm512_or_si512(s, _mm512_slli_epi32(s, 16)), even = _mm512_set1_epi16(0x00ff);
  const __m512i lo = _mm512_mullo_epi16(_mm512_and_si512(v, even), s16);
  const __m512i hi = _mm512_mullo_epi16(_mm512_srli_epi16(v, 8), s16);
  return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 8));
}

// Sub-block pair p of the super-block: tiles 0 += A . B_hi and 1 += A . B_lo, register set S.
template <int S>
inline void pair_products(const uint8_t* a, size_t a_stride, const int8_t* b_hi, const int8_t* b_lo) {
  if constexpr (S == 0) {
    _tile_loadd(2, a, a_stride);
    _tile_loadd(3, b_hi, 64);
    _tile_loadd(4, b_lo, 64);
    _tile_dpbssd(0, 2, 3);
    _tile_dpbssd(1, 2, 4);
  } else {
    _tile_loadd(5, a, a_stride);
    _tile_loadd(6, b_hi, 64);
    _tile_loadd(7, b_lo, 64);
    _tile_dpbssd(0, 5, 6);
    _tile_dpbssd(1, 5, 7);
  }
}

void run_groups_q4_k(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  constexpr size_t R = record_bytes(TensorType::Q4_K);
  constexpr size_t kSuperBytes = 8 * 512;  // one half's B operands for a super-block
  const size_t supers = a.k / 256, gbytes = group_bytes(TensorType::Q4_K, a.k);
  const size_t act_stride = act_row_bytes(ActFormat::q8_256, a.k);
  const auto* act_bytes = static_cast<const uint8_t*>(act);
  thread_local std::vector<int8_t> b_operands;  // a group's: per super-block, hi then lo
  b_operands.resize(supers * 2 * kSuperBytes);
  const size_t runs = (b1 - b0) / 16;
  alignas(64) int32_t c_hi[16][16], c_lo[16][16];
  alignas(64) float acc[16][16];
  configure_this_thread(Tiles::k_quant);
  const __m512i low4 = _mm512_set1_epi8(0x0f), seven = _mm512_set1_epi32(7);
  for (size_t g = a.r0 / kGroupRows; g * kGroupRows < a.r1; ++g) {
    const size_t row0 = g * kGroupRows;
    const __mmask16 lanes = group_lanes(row0, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    for (size_t sb = 0; sb < supers; ++sb) {
      const uint8_t* rec = group + sb * R;
      int8_t* hi_out = b_operands.data() + sb * 2 * kSuperBytes;
      int8_t* lo_out = hi_out + kSuperBytes;
      for (int sub = 0; sub < 8; ++sub) {  // pair sub / 2, nibble sub % 2
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 64 + 16 * sub)));
        const __m512i sc_hi = _mm512_srli_epi32(sc, 3), sc_lo = _mm512_and_si512(sc, seven);
        const uint8_t* pv = rec + 320 + 512 * (sub / 2);
        for (int v = 0; v < 8; ++v) {
          const __m512i b = _mm512_loadu_si512(pv + 64 * v);
          const __m512i q = _mm512_and_si512(sub % 2 ? _mm512_srli_epi16(b, 4) : b, low4);
          _mm512_storeu_si512(hi_out + 512 * sub + 64 * v, mul_lane_bytes(q, sc_hi));
          _mm512_storeu_si512(lo_out + 512 * sub + 64 * v, mul_lane_bytes(q, sc_lo));
        }
      }
    }
    for (size_t run = 0; run < runs; ++run) {
      const uint8_t* act_rows = act_bytes + 16 * run * act_stride;
      for (int j = 0; j < 16; ++j) _mm512_store_ps(acc[j], _mm512_setzero_ps());
      for (size_t sb = 0; sb < supers; ++sb) {
        const uint8_t* rec = group + sb * R;
        const int8_t* b_hi = b_operands.data() + sb * 2 * kSuperBytes;
        const int8_t* b_lo = b_hi + kSuperBytes;
        const uint8_t* a_sb = act_rows + 256 * sb;
        _tile_zero(0);
        _tile_zero(1);
        pair_products<0>(a_sb, act_stride, b_hi, b_lo);
        pair_products<1>(a_sb + 64, act_stride, b_hi + 1024, b_lo + 1024);
        pair_products<0>(a_sb + 128, act_stride, b_hi + 2048, b_lo + 2048);
        pair_products<1>(a_sb + 192, act_stride, b_hi + 3072, b_lo + 3072);
        _tile_stored(0, c_hi, 64);
        _tile_stored(1, c_lo, 64);
        const __m512 d = load_fp16x16(rec), dmin = load_fp16x16(rec + 32);
        __m512i mpairs[4];
        for (int p = 0; p < 4; ++p)
          mpairs[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 192 + 32 * p)));
        for (int j = 0; j < 16; ++j) {
          const ActRow256 xr = act_row256(act_rows, a.k, j);
          const __m512i sumi = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c_hi[j]), 3), _mm512_load_si512(c_lo[j]));
          __m512i msum = _mm512_setzero_si512();
          for (int p = 0; p < 4; ++p) {
            int32_t pair;
            std::memcpy(&pair, xr.s32 + 8 * sb + 2 * p, 4);
            msum = _mm512_dpwssd_epi32(msum, mpairs[p], _mm512_set1_epi32(pair));
          }
          const __m512 dx = _mm512_set1_ps(xr.d[sb]);
          __m512 r = _mm512_load_ps(acc[j]);
          r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(d, dx), r);
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
  return w_type == TensorType::Q8_0 || w_type == TensorType::Q4_0 || w_type == TensorType::IQ4_NL ||
         w_type == TensorType::Q4_K;
}

void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q8_0: return run_groups<TensorType::Q8_0>(a, act, b0, b1);
    case TensorType::Q4_0: return run_groups<TensorType::Q4_0>(a, act, b0, b1);
    case TensorType::IQ4_NL: return run_groups<TensorType::IQ4_NL>(a, act, b0, b1);
    case TensorType::Q4_K: return run_groups_q4_k(a, act, b0, b1);
    default: return;
  }
}

}  // namespace kiln::kernels::amx
