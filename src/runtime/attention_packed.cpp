// Attention's packed keys and values (runtime/attention.h): when a prefill span packs
// them, and how.
#include "runtime/attention.h"

#include <algorithm>

#include "kernels/packed.h"

namespace kiln {
namespace {

// Runs pack.operator()<Elem>(widen) with a float cache type's element and its exact
// widening to float (F32, F16 or BF16).
template <class Pack>
void with_float_elements(TensorType t, Pack&& pack) {
  if (t == TensorType::F32) pack.template operator()<float>([](float v) { return v; });
  else if (t == TensorType::F16) pack.template operator()<uint16_t>([](uint16_t h) { return fp16_to_f32(h); });
  else pack.template operator()<uint16_t>([](uint16_t h) { return bf16_to_f32(h); });
}

}  // namespace

// A prefill span's Q K^T from packed keys: with the keys as rows of the file layout and a
// head dimension of 64, the file tile pays a horizontal sum and a scalar store for every
// 4 vector FMAs (1.1B Q4_0 pp512: 12% of the time in it). In plain chains (below) by the
// packed gemm, elsewhere by Ops::gemm_packed_dots, the file tile's bits on packed
// records: decode (one query per head: packing would cost as much as the products)
// keeps the file layout either way, and a prefilled cache equals a decoded one.
bool Attention::packs_keys(const QuerySpan& sp, uint32_t window) const {
  return window == 0 && sp.n >= kPackKeysMinQueries && is_float_type(k_type_);
}

// Keys of head kvh at positions [lo, lo + n) into dst as packed F32 records
// (kernels/packed.h: position lo + j is slot j % 16 of group j / 16, one record per
// dimension; widening F16 and BF16 is exact); the last group's slots past n are zero.
void Attention::pack_keys(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* dst) const {
  const size_t hd = c_.head_dim, G = kernels::packed::kGroupRows;
  with_float_elements(k_type_, [&]<class Elem>(auto widen) {
    runs(l, seq, lo, lo + n, [&](size_t p, const uint8_t* k, const uint8_t*, size_t m) {
      for (size_t i = 0; i < m; ++i) {
        const size_t j = p - lo + i;
        const Elem* row = reinterpret_cast<const Elem*>(k + i * k_row_bytes_) + kvh * hd;
        float* slot = dst + j / G * G * hd + j % G;
        for (size_t d = 0; d < hd; ++d) slot[d * G] = widen(row[d]);
      }
    });
  });
  float* last = dst + n / G * G * hd;
  if (n % G)
    for (size_t d = 0; d < hd; ++d) std::fill(last + d * G + n % G, last + (d + 1) * G, 0.0f);
}

// Values of head kvh at positions [lo, lo + n) (transposed in the cache) into dst as
// packed F32 records of the dimensions: group g (dimensions 16g..16g+15) at g * 16n
// floats, position lo + j its record j; the last group's slots past head_dim are left
// as they are (their outputs are never stored). A P V gemm over the first keys reads the
// groups n records apart (GemmArgs::w_group_bytes).
void Attention::pack_values(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* dst) const {
  const size_t hd = c_.head_dim, G = kernels::packed::kGroupRows, stride = v_stride(l);
  with_float_elements(v_type_, [&]<class Elem>(auto widen) {
    runs(l, seq, lo, lo + n, [&](size_t p, const uint8_t*, const uint8_t* v, size_t m) {
      for (size_t d = 0; d < hd; ++d) {
        const Elem* row = reinterpret_cast<const Elem*>(v + (kvh * hd + d) * stride);
        float* slot = dst + d / G * G * n + (p - lo) * G + d % G;
        for (size_t i = 0; i < m; ++i) slot[i * G] = widen(row[i]);
      }
    });
  });
}

// Layer l's attention in plain chains: Q K^T and P V as gemms on packed F32 keys and
// values for a prefill span of kPackKeysMinQueries queries or more (every output one FMA
// chain, no horizontal sums: one thread, 64 queries, head dim 64, Q K^T 165-200 GFLOP/s
// against the file-tile order's 107-137, P V 181-192 against 68-147), and the same chains
// by Ops::gemm_chain on the cache as stored for shorter spans and decode, so a query's
// result is bit for bit the same however its tokens were batched. Where the table packs
// F32, the cache holds float keys and transposed float values, at least kPlainMinGroup
// query heads share a KV head (decode's lanes run across them: 64 vector FMAs a key of
// head dimension 64 whatever their number, against about 6 a head for the file tile, so
// with fewer heads decode's attention would cost more), and no window cuts a key (a
// window at least the context is none). Elsewhere the file tile's order everywhere (Q K^T
// of long spans from packed keys, gemm_packed_dots).
bool Attention::plain(size_t l) const {
  return ops_.packed_bytes(TensorType::F32, kernels::packed::kGroupRows, c_.head_dim) > 0 &&
         is_float_type(k_type_) && is_float_type(v_type_) && v_transposed_ &&
         c_.n_heads / c_.n_kv_heads >= kPlainMinGroup && (window_[l] == 0 || window_[l] >= n_ctx_);
}

// Keys of head kvh as floats, [n][head_dim], for keys whose blocks span heads.
void Attention::keys_to_f32(size_t l, int32_t seq, size_t kvh, size_t lo, size_t n, float* out) const {
  const size_t hd = c_.head_dim;
  runs(l, seq, lo, lo + n, [&](size_t p, const uint8_t* k, const uint8_t*, size_t m) {
    for (size_t i = 0; i < m; ++i) KvCache::decode_row(k_type_, k + i * k_row_bytes_, kvh * hd, hd, out + (p - lo + i) * hd);
  });
}

}  // namespace kiln
