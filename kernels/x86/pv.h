#pragma once
// P V over value rows stored by position (kernels.h, PvArgs), written once over a vector
// traits struct V (kernels/x86/avx2/vec.h, kernels/x86/avx512/vec.h) and instantiated in
// each ISA's pv.cpp, compiled with that ISA's flags; V has internal linkage, so every
// instantiation does too.
//
// Decoding a quantized value costs more than the multiply-adds it feeds when it is done
// per output row (the attention's former path: every row through the scalar reference,
// transposed, then a float gemm). Here a block of positions is decoded once into a stack
// buffer of floats small enough to stay in L1, and then every block of up to MaxRows
// output rows walks it two vectors of columns at a time, its MaxRows x 2 accumulators in
// registers: one broadcast of P and two FMAs per row and position.
//
// Each output lane owns one accumulator fed one FMA per position in order, whatever the
// tile shape or buffer blocking, which is what the contract's split invariance needs.
#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

template <VectorTraits V, size_t MaxRows>
class PvKernel {
  using F = typename V::F;
  static constexpr size_t W = V::kLanes;
  static constexpr size_t kBufFloats = 8192;  // 32 KiB of decoded values
  static constexpr size_t kMaxCols = 512;     // columns decoded at once: at least 16 positions per buffer
  static constexpr size_t kTileCols = 2 * W;

  // Lanes left of n from i, at most one vector's.
  static size_t lanes(size_t n, size_t i) { return n <= i ? 0 : n - i < W ? n - i : W; }

  // Bit-exact with the reference dequantization: an int converted to float is exact, and
  // then one product with the widened scale, as ggml does.
  static void q8_0_block(const block_q8_0* b, float* dst) {
    const F d = V::set1(_cvtsh_ss(b->d));
    for (size_t i = 0; i < 32; i += W) V::store(dst + i, V::i8_to_f32(b->qs + i) * d);
  }

  static void q4_0_block(const block_q4_0* b, float* dst) {
    const F d = V::set1(_cvtsh_ss(b->d));
    for (size_t i = 0; i < 16; i += W) {
      F lo, hi;
      V::nibbles_to_f32(b->qs + i, &lo, &hi);
      V::store(dst + i, lo * d);
      V::store(dst + 16 + i, hi * d);
    }
  }

  static void quant_block(TensorType t, const char* row, size_t b, float* dst) {
    if (t == TensorType::Q8_0) q8_0_block(reinterpret_cast<const block_q8_0*>(row) + b, dst);
    else q4_0_block(reinterpret_cast<const block_q4_0*>(row) + b, dst);
  }

  // Values [e0, e0 + w) of one row into dst[0, w). Columns [w, ld) (ld: w rounded up to 32)
  // get finite filler that only masked-off lanes ever see.
  static void decode(TensorType t, const char* row, size_t e0, size_t w, size_t ld, float* dst) {
    switch (t) {
      case TensorType::F32: {
        const float* src = reinterpret_cast<const float*>(row) + e0;
        for (size_t i = 0; i < ld; i += W) V::store(dst + i, V::load_tail(src + i, lanes(w, i)));
        return;
      }
      case TensorType::F16: {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
        for (size_t i = 0; i < ld; i += W) V::store(dst + i, V::from_fp16(V::load_h_tail(src + i, lanes(w, i))));
        return;
      }
      case TensorType::BF16: {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(row) + e0;
        for (size_t i = 0; i < ld; i += W) V::store(dst + i, V::from_bf16(V::load_h_tail(src + i, lanes(w, i))));
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

  // out rows [0, R) x columns [0, w) (w <= 2 W) += p rows x the buffer's np positions.
  template <size_t R>
  static void tile(const float* buf, size_t ld, size_t np, const float* p, size_t ldp, float* out, size_t ldo,
                   size_t w) {
    const size_t w0 = lanes(w, 0), w1 = lanes(w, W);
    F a0[R], a1[R];
    for (size_t r = 0; r < R; ++r) {
      a0[r] = V::load_tail(out + r * ldo, w0);
      a1[r] = V::load_tail(out + r * ldo + W, w1);
    }
    for (size_t j = 0; j < np; ++j) {
      const F v0 = V::load(buf + j * ld), v1 = V::load(buf + j * ld + W);
      for (size_t r = 0; r < R; ++r) {
        const F pr = V::set1(p[r * ldp + j]);
        a0[r] = V::fmadd(pr, v0, a0[r]);
        a1[r] = V::fmadd(pr, v1, a1[r]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      V::store_tail(out + r * ldo, a0[r], w0);
      V::store_tail(out + r * ldo + W, a1[r], w1);
    }
  }

  using TileFn = void (*)(const float*, size_t, size_t, const float*, size_t, float*, size_t, size_t);
  template <size_t... R>
  static constexpr auto tiles(std::index_sequence<R...>) {
    return std::array<TileFn, MaxRows + 1>{nullptr, &tile<R + 1>...};
  }
  static constexpr std::array<TileFn, MaxRows + 1> kTiles = tiles(std::make_index_sequence<MaxRows>{});

 public:
  static void pv(const PvArgs& a) {
    if (a.rows == 0 || a.n == 0 || a.n_pos == 0) return;
    alignas(64) float buf[kBufFloats];
    // Rows in blocks as even as possible: with 8 rows a tile, 13 rows as 7 + 6 rather
    // than 8 + 5.
    const size_t n_blocks = (a.rows + MaxRows - 1) / MaxRows;
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
};

}  // namespace kiln::kernels::x86
