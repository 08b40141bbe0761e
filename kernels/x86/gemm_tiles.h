#pragma once
// The tile-table machinery both x86 gemm files share. Each ISA file defines its register
// tile as `Tile<T, RW, RB>::run(args, r, b)` (RW weight rows x RB batch rows starting at
// row r, batch row b) inside its anonymous namespace; TileTable holds a pointer to every
// shape up to MaxRw x MaxRb and covers a row range with them, edges taking the smaller
// shapes. Instantiated with a Tile of internal linkage, everything here is internal to
// that ISA's translation unit too, so no copy compiled with one ISA's flags can be
// picked by the linker for another.
#include <cstddef>
#include <utility>

#include "kernels/kernels.h"

namespace kiln::kernels::x86 {

template <template <TensorType, int, int> class Tile, int MaxRw, int MaxRb>
class TileTable {
 public:
  template <TensorType T>
  static constexpr TileTable make() {
    TileTable t;
    t.fill<T>(std::make_integer_sequence<int, MaxRw>{});
    return t;
  }

  // Rows [a.r0, a.r1) x batch rows [b0, b1) in tiles of rw x rb.
  void run(const GemmArgs& a, size_t b0, size_t b1, int rw, int rb) const {
    for (size_t r = a.r0; r < a.r1; r += rw) {
      const int nr = (int)(a.r1 - r < size_t(rw) ? a.r1 - r : size_t(rw));
      for (size_t b = b0; b < b1; b += rb) {
        const int nb = (int)(b1 - b < size_t(rb) ? b1 - b : size_t(rb));
        fn_[nr][nb](a, r, b);
      }
    }
  }

 private:
  using Fn = void (*)(const GemmArgs&, size_t, size_t);

  template <TensorType T, int... RWs>
  constexpr void fill(std::integer_sequence<int, RWs...>) {
    (fill_row<T, RWs + 1>(std::make_integer_sequence<int, MaxRb>{}), ...);
  }
  template <TensorType T, int RW, int... RBs>
  constexpr void fill_row(std::integer_sequence<int, RBs...>) {
    ((fn_[RW][RBs + 1] = &Tile<T, RW, RBs + 1>::run), ...);
  }

  Fn fn_[MaxRw + 1][MaxRb + 1] = {};
};

}  // namespace kiln::kernels::x86
