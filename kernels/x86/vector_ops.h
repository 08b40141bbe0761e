#pragma once
// The elementwise and reduction kernels of the x86 tables, written once over a vector
// traits struct V (kernels/x86/avx2/vec.h, kernels/x86/avx512/vec.h) and instantiated in
// each ISA's ops.cpp, which is compiled with that ISA's flags. V has internal linkage,
// so every instantiation does too: no copy built for one ISA can be linked into another.
//
// Each loop takes whole vectors, then one tail of fewer than V::kLanes elements through
// V's tail loads and stores: a tail element gets the same operations as the others.
#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/tables.h"
#include "kernels/x86/gemm_chain.h"
#include "kernels/x86/gemm_packed_dots.h"
#include "kernels/x86/packed_entry.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

template <VectorTraits V>
struct VectorOps {
  using F = typename V::F;
  static constexpr size_t W = V::kLanes;

  static float dot(const float* a, const float* b, size_t n) {
    F s0 = F{}, s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
      s0 = V::fmadd(V::load(a + i), V::load(b + i), s0);
      s1 = V::fmadd(V::load(a + i + W), V::load(b + i + W), s1);
      s2 = V::fmadd(V::load(a + i + 2 * W), V::load(b + i + 2 * W), s2);
      s3 = V::fmadd(V::load(a + i + 3 * W), V::load(b + i + 3 * W), s3);
    }
    for (; i + W <= n; i += W) s0 = V::fmadd(V::load(a + i), V::load(b + i), s0);
    if (i < n) s1 = V::fmadd(V::load_tail(a + i, n - i), V::load_tail(b + i, n - i), s1);
    return V::hsum((s0 + s1) + (s2 + s3));
  }

  // out[i] = f(a[i], b[i]) (map2) or f(a[i]) (map1) for a vector function f, over whole
  // vectors and then the tail.
  template <class Fn>
  static void map2(const float* a, const float* b, float* out, size_t n, Fn f) {
    size_t i = 0;
    for (; i + W <= n; i += W) V::store(out + i, f(V::load(a + i), V::load(b + i)));
    if (i < n) V::store_tail(out + i, f(V::load_tail(a + i, n - i), V::load_tail(b + i, n - i)), n - i);
  }

  template <class Fn>
  static void map1(const float* a, float* out, size_t n, Fn f) {
    size_t i = 0;
    for (; i + W <= n; i += W) V::store(out + i, f(V::load(a + i)));
    if (i < n) V::store_tail(out + i, f(V::load_tail(a + i, n - i)), n - i);
  }

  static void axpy(float a, const float* x, float* y, size_t n) {
    const F av = V::set1(a);
    map2(x, y, y, n, [av](F xv, F yv) { return V::fmadd(av, xv, yv); });
  }

  static void scale(float* y, float a, size_t n) {
    const F av = V::set1(a);
    map1(y, y, n, [av](F yv) { return av * yv; });
  }

  static void add(const float* a, const float* b, float* out, size_t n) {
    map2(a, b, out, n, [](F av, F bv) { return av + bv; });
  }

  static void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps) {
    const float sum_sq = dot(x, x, n);
    const F inv = V::set1(1.0f / __builtin_sqrtf(sum_sq / (float)n + eps));
    map2(x, weight, out, n, [inv](F xv, F wv) { return (xv * inv) * wv; });
  }

  // Two sums (whole vectors, then the tail) added once at the end, as dot() does.
  static float ssm_update(float* h, const float* B, const float* C, float decay, float x_dt, size_t n) {
    const F dv = V::set1(decay), xv = V::set1(x_dt);
    F s0 = F{}, s1 = F{};
    size_t i = 0;
    for (; i + W <= n; i += W) {
      const F hv = V::fmadd(V::load(h + i), dv, xv * V::load(B + i));
      V::store(h + i, hv);
      s0 = V::fmadd(hv, V::load(C + i), s0);
    }
    if (i < n) {
      const F hv = V::fmadd(V::load_tail(h + i, n - i), dv, xv * V::load_tail(B + i, n - i));
      V::store_tail(h + i, hv, n - i);
      s1 = V::fmadd(hv, V::load_tail(C + i, n - i), s1);
    }
    return V::hsum(s0 + s1);
  }

  // Four rows at a time, each with ssm_update's own operations in its own registers: B
  // and C are loaded once for the four, and four independent chains hide the FMA latency
  // that a lone row's single chain waited on (per-row calls: 11% of mamba2-1b F16 pp).
  static void ssm_update_rows(float* h, const float* B, const float* C, float decay, float dt, const float* x,
                              float* y, size_t rows, size_t n) {
    constexpr size_t R = 4;
    const F dv = V::set1(decay);
    size_t r = 0;
    for (; r + R <= rows; r += R) {
      F xv[R], s0[R], s1[R];
      for (size_t q = 0; q < R; ++q) xv[q] = V::set1(x[r + q] * dt), s0[q] = F{}, s1[q] = F{};
      float* hr = h + r * n;
      size_t i = 0;
      for (; i + W <= n; i += W) {
        const F b = V::load(B + i), c = V::load(C + i);
        for (size_t q = 0; q < R; ++q) {
          const F hv = V::fmadd(V::load(hr + q * n + i), dv, xv[q] * b);
          V::store(hr + q * n + i, hv);
          s0[q] = V::fmadd(hv, c, s0[q]);
        }
      }
      if (i < n) {
        const F b = V::load_tail(B + i, n - i), c = V::load_tail(C + i, n - i);
        for (size_t q = 0; q < R; ++q) {
          const F hv = V::fmadd(V::load_tail(hr + q * n + i, n - i), dv, xv[q] * b);
          V::store_tail(hr + q * n + i, hv, n - i);
          s1[q] = V::fmadd(hv, c, s1[q]);
        }
      }
      for (size_t q = 0; q < R; ++q) y[r + q] = V::hsum(s0[q] + s1[q]);
    }
    for (; r < rows; ++r) y[r] = ssm_update(h + r * n, B, C, decay, x[r] * dt, n);
  }

  static void softmax(float* x, size_t n) {
    if (n == 0) return;
    F mv = V::set1(-__builtin_inff());
    size_t i = 0;
    for (; i + W <= n; i += W) mv = V::max(mv, V::load(x + i));
    scale(x, 1.0f / exp_sum(x, n, V::max_with_tail(mv, x + i, n - i)), n);
  }

  static float exp_sum(float* x, size_t n, float max) {
    const F maxv = V::set1(max);
    F sv = F{};
    size_t i = 0;
    for (; i + W <= n; i += W) {
      const F e = V::exp(V::load(x + i) - maxv);
      V::store(x + i, e);
      sv = sv + e;
    }
    if (i < n) {  // the padding lanes add 0 to the sum
      const F e = V::keep(V::exp(V::load_tail(x + i, n - i) - maxv), n - i);
      V::store_tail(x + i, e, n - i);
      sv = sv + e;
    }
    return V::hsum(sv);
  }

  static void layernorm(const float* x, const float* weight, const float* bias, float* out, size_t n, float eps) {
    F sv = F{};
    size_t i = 0;
    for (; i + W <= n; i += W) sv = sv + V::load(x + i);
    if (i < n) sv = sv + V::load_tail(x + i, n - i);
    const F mean = V::set1(V::hsum(sv) / (float)n);
    F qv = F{};
    for (i = 0; i + W <= n; i += W) {
      const F d = V::load(x + i) - mean;
      qv = V::fmadd(d, d, qv);
    }
    if (i < n) {  // the padding lanes must add 0, not mean^2
      const F d = V::keep(V::load_tail(x + i, n - i) - mean, n - i);
      qv = V::fmadd(d, d, qv);
    }
    const F inv = V::set1(1.0f / __builtin_sqrtf(V::hsum(qv) / (float)n + eps));
    const auto row = [&](F xv, F wv, F bv) { return V::fmadd((xv - mean) * inv, wv, bv); };
    for (i = 0; i + W <= n; i += W)
      V::store(out + i, row(V::load(x + i), V::load(weight + i), bias ? V::load(bias + i) : F{}));
    if (i < n)
      V::store_tail(out + i, row(V::load_tail(x + i, n - i), V::load_tail(weight + i, n - i),
                                 bias ? V::load_tail(bias + i, n - i) : F{}), n - i);
  }

  // gelu(x) = x / (1 + e^(-2u)), 2u = x (a + b x^2) (see kernels.h).
  static void gelu(const float* x, float* out, size_t n) {
    const F a = V::set1(2.0f * 0.7978845608028654f), b = V::set1(2.0f * 0.7978845608028654f * 0.044715f);
    map1(x, out, n, [a, b](F xv) {
      const F u2 = xv * V::fmadd(b, xv * xv, a);
      return xv / (V::set1(1.0f) + V::exp(F{} - u2));
    });
  }

  static void swiglu(const float* gate, const float* up, float* out, size_t n) {
    map2(gate, up, out, n, [](F g, F u) { return (g / (V::set1(1.0f) + V::exp(F{} - g))) * u; });
  }

  static void rope_pairs(float* head, size_t n_rot, const float* cs) {
    map2(head, cs, head, n_rot, [](F xv, F csv) { return V::rotate_pairs(xv, csv); });
  }

  // NeoX halves (x[i], x[i + half]) by (cos, sin) pairs interleaved in cs.
  static void rope_halves(float* head, size_t half, const float* cs) {
    const auto rotate = [](F x0, F x1, F cs_lo, F cs_hi, F* o0, F* o1) {
      F c, s;
      V::split_cos_sin(cs_lo, cs_hi, &c, &s);
      *o0 = V::fmsub(x0, c, x1 * s);
      *o1 = V::fmadd(x0, s, x1 * c);
    };
    size_t i = 0;
    F o0, o1;
    for (; i + W <= half; i += W) {
      rotate(V::load(head + i), V::load(head + i + half), V::load(cs + 2 * i), V::load(cs + 2 * i + W), &o0, &o1);
      V::store(head + i, o0);
      V::store(head + i + half, o1);
    }
    if (i < half) {
      const size_t n = half - i, n_cs = 2 * n;
      const F cs_lo = V::load_tail(cs + 2 * i, n_cs < W ? n_cs : W);
      const F cs_hi = n_cs > W ? V::load_tail(cs + 2 * i + W, n_cs - W) : F{};
      rotate(V::load_tail(head + i, n), V::load_tail(head + i + half, n), cs_lo, cs_hi, &o0, &o1);
      V::store_tail(head + i, o0, n);
      V::store_tail(head + i + half, o1, n);
    }
  }

  static void rope(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin, bool neox) {
    for (size_t h = 0; h < n_heads; ++h) {
      if (neox) rope_halves(x + h * head_dim, n_rot / 2, cos_sin);
      else rope_pairs(x + h * head_dim, n_rot & ~size_t{1}, cos_sin);
    }
  }

  // Halves to floats by widen(), and floats to halves by narrow().
  template <F (*widen)(typename V::H)>
  static void from_halves(const uint16_t* in, float* out, size_t n) {
    size_t i = 0;
    for (; i + W <= n; i += W) V::store(out + i, widen(V::load_h(in + i)));
    if (i < n) V::store_tail(out + i, widen(V::load_h_tail(in + i, n - i)), n - i);
  }
  template <typename V::H (*narrow)(F)>
  static void to_halves(const float* in, uint16_t* out, size_t n) {
    size_t i = 0;
    for (; i + W <= n; i += W) V::store_h(out + i, narrow(V::load(in + i)));
    if (i < n) V::store_h_tail(out + i, narrow(V::load_tail(in + i, n - i)), n - i);
  }
};

// What an x86 table takes from its ISA's other files.
struct IsaEntries {
  Isa isa;
  void (*gemm)(const GemmArgs& args);
  void (*pv)(const PvArgs& args);
};

// Every entry by name, so -Wmissing-field-initializers names any Ops member left out.
// Weight types are those of the scalar gemm, which the x86 gemms fall back on for the
// types they have no kernels for.
template <VectorTraits V>
constexpr Ops vector_table(const IsaEntries& e) {
  using K = VectorOps<V>;
  using P = PackedActivations<V>;
  return Ops{
      .isa = e.isa,
      .gemm_supports = [](TensorType t) { return scalar_ops().gemm_supports(t); },
      .gemm = e.gemm,
      .dot = K::dot,
      .axpy = K::axpy,
      .scale = K::scale,
      .add = K::add,
      .rmsnorm = K::rmsnorm,
      .softmax = K::softmax,
      .swiglu = K::swiglu,
      .rope = K::rope,
      .fp16_to_f32 = K::template from_halves<V::from_fp16>,
      .f32_to_fp16 = K::template to_halves<V::to_fp16>,
      .bf16_to_f32 = K::template from_halves<V::from_bf16>,
      .f32_to_bf16 = K::template to_halves<V::to_bf16>,
      .layernorm = K::layernorm,
      .gelu = K::gelu,
      .packed_bytes = P::packed_bytes,
      .prepared_bytes = P::prepared_bytes,
      .prepare = P::prepare,
      .gemm_packed_dots = gemm_packed_dots<V>,
      .gemm_chain = gemm_chain<V, K::template from_halves<V::from_fp16>, K::template from_halves<V::from_bf16>>,
      .exp_sum = K::exp_sum,
      .pv = e.pv,
      .ssm_update = K::ssm_update,
      .ssm_update_rows = K::ssm_update_rows,
  };
}

}  // namespace kiln::kernels::x86
