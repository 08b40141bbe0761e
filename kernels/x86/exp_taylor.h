#pragma once
// The polynomial half of both ISAs' exp (kernels/x86/*/vec.h): e^r for |r| <= ln2/2 by
// its degree-7 Taylor series in Horner form (truncation error < 6e-9 relative). The range
// reduction around it and the 2^n scaling differ per ISA and stay there.
namespace kiln::kernels::x86 {

template <class V>
inline typename V::F exp_taylor7(typename V::F r) {
  typename V::F p = V::fmadd(V::set1(1.0f / 5040), r, V::set1(1.0f / 720));
  p = V::fmadd(V::fmadd(V::fmadd(p, r, V::set1(1.0f / 120)), r, V::set1(1.0f / 24)), r, V::set1(1.0f / 6));
  return V::fmadd(V::fmadd(V::fmadd(p, r, V::set1(0.5f)), r, V::set1(1.0f)), r, V::set1(1.0f));
}

}  // namespace kiln::kernels::x86
