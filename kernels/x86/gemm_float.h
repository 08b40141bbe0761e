#pragma once
// gemm for F32/F16/BF16 weights against F32 activations, written once over a vector
// traits struct V (kernels/x86/avx2/vec.h, kernels/x86/avx512/vec.h) and instantiated in
// each ISA's gemm.cpp, compiled with that ISA's flags; V has internal linkage, so every
// instantiation does too.
//
// Shape: W rows and X rows are both contiguous along k, so every output is a dot
// product. A tile keeps RW x RB accumulators of V::kLanes lanes in registers; each k step
// loads RB activation vectors and converts each of the RW weight vectors once, reusing it
// across the batch rows.
//
// Determinism: for n_batch > 1 every (b, r) output owns exactly one accumulator, fed the
// products of whole-vector chunks in increasing k, then a zero-padded tail chunk, then
// V's fixed horizontal reduction. Tile shape only decides which outputs share a loop,
// never the arithmetic, so results do not depend on r0/r1 or which tile an output landed
// in, or whether it was decoded alone (a single activation row: tiles of 4 weight rows).
#include <cstddef>

#include "kernels/kernels.h"
#include "kernels/x86/gemm_tiles.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// How an ISA schedules its tiles (measured per ISA; the results do not depend on it).
struct FloatGemmShape {
  int max_rb;                // batch rows per tile at most (weight rows: 8)
  size_t small_batch;        // n_batch up to this: one pass of 8 x n_batch tiles (0: none)
  size_t x_budget;           // bytes of activations a batch block keeps in L2
  int prefill_rw, prefill_rb;  // the tile of larger batches
};

template <VectorTraits V, FloatGemmShape S>
class FloatGemm {
  using F = typename V::F;
  static constexpr size_t W = V::kLanes;
  static constexpr int kMaxRw = 8;

  template <TensorType T>
  static F load_w(const char* row, size_t i) {
    if constexpr (T == TensorType::F32) return V::load(reinterpret_cast<const float*>(row) + i);
    else if constexpr (T == TensorType::F16) return V::from_fp16(V::load_h(reinterpret_cast<const uint16_t*>(row) + i));
    else return V::from_bf16(V::load_h(reinterpret_cast<const uint16_t*>(row) + i));
  }

  // The n < W weights from i, zero padded; never reads past them.
  template <TensorType T>
  static F load_w_tail(const char* row, size_t i, size_t n) {
    if constexpr (T == TensorType::F32) return V::load_tail(reinterpret_cast<const float*>(row) + i, n);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + i;
    if constexpr (T == TensorType::F16) return V::from_fp16(V::load_h_tail(h, n));
    else return V::from_bf16(V::load_h_tail(h, n));
  }

  template <TensorType T, int RW, int RB>
  static void tile(const GemmArgs& a, size_t r, size_t b) {
    const char* w = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    const float* x = a.x + b * a.ldx;
    const size_t wrb = a.w_row_bytes, ldx = a.ldx, k = a.k, kw = k - k % W;

    F acc[RW][RB];
#pragma GCC unroll 8
    for (int i = 0; i < RW; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[i][j] = F{};

    for (size_t i = 0; i < kw; i += W) {
      F xv[RB];
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) xv[j] = V::load(x + j * ldx + i);
      // Decode streams its rows from DRAM: the same line of the next RW rows (what this
      // thread reads next) is requested a tile ahead.
      if constexpr (RB == 1) {
        constexpr size_t kElemBytes = T == TensorType::F32 ? 4 : 2;
        if (i * kElemBytes % 64 == 0)
#pragma GCC unroll 8
          for (int rr = 0; rr < RW; ++rr) __builtin_prefetch(w + (rr + RW) * wrb + i * kElemBytes);
      }
#pragma GCC unroll 8
      for (int rr = 0; rr < RW; ++rr) {
        const F wv = load_w<T>(w + rr * wrb, i);
#pragma GCC unroll 4
        for (int j = 0; j < RB; ++j) acc[rr][j] = V::fmadd(wv, xv[j], acc[rr][j]);
      }
    }
    if (kw < k) {
      F xv[RB];
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) xv[j] = V::load_tail(x + j * ldx + kw, k - kw);
#pragma GCC unroll 8
      for (int rr = 0; rr < RW; ++rr) {
        const F wv = load_w_tail<T>(w + rr * wrb, kw, k - kw);
#pragma GCC unroll 4
        for (int j = 0; j < RB; ++j) acc[rr][j] = V::fmadd(wv, xv[j], acc[rr][j]);
      }
    }
    float sums[RW * RB];
    V::template hsums<RW * RB>(&acc[0][0], sums);
#pragma GCC unroll 8
    for (int rr = 0; rr < RW; ++rr)
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) a.y[(b + j) * a.ldy + r + rr] = sums[rr * RB + j];
  }

  template <TensorType T, int RW, int RB>
  struct Tile {
    static void run(const GemmArgs& a, size_t r, size_t b) { tile<T, RW, RB>(a, r, b); }
  };
  using Table = TileTable<Tile, kMaxRw, S.max_rb>;

  template <TensorType T>
  static void run_type(const GemmArgs& a) {
    static constexpr Table kTable = Table::template make<T>();
    // Every output is one FMA chain over k in order, then the tail, then hsum's tree,
    // whatever the tile: so a row's result does not depend on the batch around it (a
    // server's request gives the same text alone or among others). One activation row
    // (decode) is bandwidth bound, but one row at a time left a single FMA chain (4
    // cycles per 16 lanes) between the core and its memory: four rows' chains with the
    // prefetch in tile() measured +8% on mamba2-1b F16 tg (2 threads; two rows +0%,
    // four rows alone +5%). On TinyLlama F16, 8-row tiles without prefetch lost 7-12%.
    if (a.n_batch == 1) {
      kTable.run(a, 0, 1, 4, 1);
      return;
    }
    if (a.n_batch <= S.small_batch) {
      // Decode-like: bandwidth bound; 8 rows give 8 independent FMA chains and 8 streams
      // in flight (software prefetch and fewer rows measured no better).
      kTable.run(a, 0, a.n_batch, kMaxRw, (int)a.n_batch);
      return;
    }
    // Prefill: compute bound. Take the batch in blocks whose activations stay in L2 while
    // the weight rows of a tile (hot in L1) are swept across the block.
    size_t block = S.x_budget / (a.k * sizeof(float) + 1);
    block = block < size_t(S.max_rb) ? S.max_rb : block - block % S.max_rb;
    for (size_t b0 = 0; b0 < a.n_batch; b0 += block)
      kTable.run(a, b0, b0 + block < a.n_batch ? b0 + block : a.n_batch, S.prefill_rw, S.prefill_rb);
  }

 public:
  // Rows [a.r0, a.r1) of a float weight; false (nothing done) for other weight types.
  static bool run(const GemmArgs& a) {
    switch (a.w_type) {
      case TensorType::F32: run_type<TensorType::F32>(a); return true;
      case TensorType::F16: run_type<TensorType::F16>(a); return true;
      case TensorType::BF16: run_type<TensorType::BF16>(a); return true;
      default: return false;
    }
  }
};

}  // namespace kiln::kernels::x86
