// AVX-512 VNNI gemm on packed legacy quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1;
// layout: kernels/packed.h) and the packed gemm entry; activations are converted by
// kernels/x86/packed_entry.h over the AVX-512 traits.
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
#ifdef KILN_HAVE_AMX
#include "kernels/x86/amx/gemm_amx.h"
#endif
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/packed_entry.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

using namespace packed;

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

template <TensorType T>
struct LegacyKind : RecordKind<32, record_bytes(T)> {
  using Base = RecordKind<32, record_bytes(T)>;
  using typename Base::Act, typename Base::Consts;
  using Base::kBytes;

  template <int RB>
  __attribute__((always_inline)) static void step(const uint8_t* rec, const Consts&, const Act* xr, size_t blk,
                                                  __m512* acc) {
    using L = Legacy<T>;
    if constexpr (RB > 1) {
      // With several activation rows a record takes long enough that the hardware
      // prefetcher no longer runs ahead of the stream (the block's first loads stalled on
      // DRAM): fetch the record kAheadRecords further on (past the group's end that is
      // the next group, which follows it in memory).
      constexpr size_t kAheadRecords = 8;
      for (size_t line = 0; line < kBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rec + kAheadRecords * kBytes + line), _MM_HINT_T0);
    } else {
      x86::prefetch_stream<kBytes>(rec);
    }
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
};

}  // namespace

void run_packed_legacy(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q8_0: return run_groups<LegacyKind<TensorType::Q8_0>>(a, act, b0, b1);
    case TensorType::Q4_0: return run_groups<LegacyKind<TensorType::Q4_0>>(a, act, b0, b1);
    case TensorType::Q4_1: return run_groups<LegacyKind<TensorType::Q4_1>>(a, act, b0, b1);
    case TensorType::Q5_0: return run_groups<LegacyKind<TensorType::Q5_0>>(a, act, b0, b1);
    case TensorType::Q5_1: return run_groups<LegacyKind<TensorType::Q5_1>>(a, act, b0, b1);
    default: return;
  }
}

namespace {
void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
#ifdef KILN_HAVE_AMX
  // Whole runs of 16 activation rows go to the AMX tiles where the CPU has them (same
  // results bit for bit); the rest to the tiles below. Only from 64 rows: the AMX path
  // unpacks each weight group before its runs, which pays when many runs reuse it
  // (1.1B Q4_0 pp512 258 -> 355 tok/s) and lost where weights stream from DRAM for few
  // rows (decode of 16 sequences 222 -> 169 tok/s; 32 equal).
  constexpr size_t kAmxMinRows = 64;
  if (b1 - b0 >= kAmxMinRows && amx::supports(a.w_type) && amx::usable()) {
    const size_t b16 = b0 + (b1 - b0) / 16 * 16;
    amx::run_packed(a, act, b0, b16);
    act = static_cast<const uint8_t*>(act) + (b16 - b0) * act_row_bytes(act_format(a.w_type), a.k);
    b0 = b16;
    if (b0 == b1) return;
  }
#endif
  if (a.w_type == TensorType::IQ4_NL || a.w_type == TensorType::IQ4_XS) run_packed_iq4(a, act, b0, b1);
  else if (packed::act_format(a.w_type) == packed::ActFormat::q8_256) run_packed_k(a, act, b0, b1);
  else run_packed_legacy(a, act, b0, b1);
}
}  // namespace

void gemm_packed(const GemmArgs& a) { x86::PackedActivations<Vec>::gemm<run_packed>(a); }

}  // namespace kiln::kernels::avx512
