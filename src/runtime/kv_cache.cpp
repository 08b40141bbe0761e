#include "runtime/kv_cache.h"

#include <cctype>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr size_t kBlock = 32;  // q8_0 and q4_0 values per block
constexpr size_t kMaxSlice = 512;

size_t value_bytes(TensorType t) { return t == TensorType::F32 ? 4 : 2; }

// The state code of a type: 3 bits each for keys and values, bit 6 for values by position.
uint32_t type_code(TensorType t) {
  switch (t) {
    case TensorType::F32: return 0;
    case TensorType::F16: return 1;
    case TensorType::BF16: return 2;
    case TensorType::Q8_0: return 3;
    case TensorType::Q4_0: return 4;
    default: return 7;
  }
}

// Floats of values [e0, e0 + n) of one row of `t` into out.
void row_to_f32(TensorType t, const uint8_t* row, size_t e0, size_t n, float* out) {
  const kernels::Ops& ops = kernels::ops();
  switch (t) {
    case TensorType::F32: std::memcpy(out, row + 4 * e0, n * sizeof(float)); return;
    case TensorType::F16: ops.fp16_to_f32(reinterpret_cast<const uint16_t*>(row) + e0, out, n); return;
    case TensorType::BF16: ops.bf16_to_f32(reinterpret_cast<const uint16_t*>(row) + e0, out, n); return;
    default: break;
  }
  const size_t block_bytes = KvCache::row_bytes(t, kBlock);
  if (e0 % kBlock == 0 && n % kBlock == 0) {
    kernels::ref::dequantize_row(t, row + e0 / kBlock * block_bytes, out, n);
    return;
  }
  // A head narrower than a block: dequantize the blocks it touches, keep its part.
  float block[kBlock];
  for (size_t b = e0 / kBlock; b * kBlock < e0 + n; ++b) {
    kernels::ref::dequantize_row(t, row + b * block_bytes, block, kBlock);
    const size_t lo = std::max(e0, b * kBlock), hi = std::min(e0 + n, (b + 1) * kBlock);
    std::memcpy(out + (lo - e0), block + (lo - b * kBlock), (hi - lo) * sizeof(float));
  }
}

void f32_to_row(TensorType t, const float* in, size_t n, uint8_t* row) {
  const kernels::Ops& ops = kernels::ops();
  switch (t) {
    case TensorType::F32: std::memcpy(row, in, n * sizeof(float)); return;
    case TensorType::F16: ops.f32_to_fp16(in, reinterpret_cast<uint16_t*>(row), n); return;
    case TensorType::BF16: ops.f32_to_bf16(in, reinterpret_cast<uint16_t*>(row), n); return;
    default: kernels::ref::quantize_row(t, in, row, n); return;
  }
}

}  // namespace

bool KvCache::is_cache_type(TensorType t) { return type_code(t) != 7; }

void KvCache::encode_row(TensorType t, const float* in, size_t n, uint8_t* row) { f32_to_row(t, in, n, row); }
void KvCache::decode_row(TensorType t, const uint8_t* row, size_t e0, size_t n, float* out) {
  row_to_f32(t, row, e0, n, out);
}

std::string KvCache::type_label(TensorType t) {
  std::string name = type_name(t);
  for (char& ch : name) ch = (char)std::tolower((unsigned char)ch);
  return name;
}

bool KvCache::is_one_value(TensorType t) {
  return is_float_type(t);
}

size_t KvCache::row_bytes(TensorType t, size_t n) {
  if (is_one_value(t)) return n * value_bytes(t);
  return n / kBlock * (t == TensorType::Q8_0 ? sizeof(kernels::block_q8_0) : sizeof(kernels::block_q4_0));
}

void KvCache::check(const Shape& s) {
  for (const auto& [what, t] : {std::pair{"keys", s.k_type}, std::pair{"values", s.v_type}}) {
    if (!is_cache_type(t))
      throw Error("KV cache type " + type_label(t) + " for " + what + " is not supported (f32, f16, bf16, q8_0, q4_0)");
    if (!is_one_value(t) && s.kv_dim % kBlock != 0)
      throw Error("KV cache type " + type_label(t) + " needs a KV width that is a multiple of 32 (this model's is " +
                  std::to_string(s.kv_dim) + ")");
  }
  if (s.v_transposed && !is_one_value(s.v_type))
    throw Error("KV cache type " + type_label(s.v_type) + " for values needs flash attention (-fa on)");
  if (s.head_dim == 0 || s.head_dim > kMaxSlice || s.kv_dim % s.head_dim != 0 || s.kv_dim > kMaxRow)
    throw Error("KV cache: head dimension " + std::to_string(s.head_dim) + " is not supported");
  if (!s.layer_ctx.empty() && s.layer_ctx.size() != s.n_layers)
    throw Error("KV cache: " + std::to_string(s.layer_ctx.size()) + " layer sizes for " + std::to_string(s.n_layers) + " layers");
  for (size_t cap : s.layer_ctx)
    if (cap == 0 || cap > s.n_ctx) throw Error("KV cache: a layer of " + std::to_string(cap) + " slots in a context of " + std::to_string(s.n_ctx));
}

double KvCache::bytes_for(const Shape& s) {
  const double per_pos = double(row_bytes(s.k_type, s.kv_dim)) + double(row_bytes(s.v_type, s.kv_dim));
  double slots = 0;
  for (size_t l = 0; l < s.n_layers; ++l) slots += double(s.capacity(l));
  return slots * per_pos;
}

double KvCache::layer_bytes(size_t layer) const {
  return double(capacity(layer)) * double(k_row_bytes_ + v_row_bytes_);
}

size_t KvCache::value_size() const { return value_bytes(s_.v_type); }

KvCache::KvCache(const Shape& shape) : s_(shape) {
  check(s_);
  k_row_bytes_ = row_bytes(s_.k_type, s_.kv_dim);
  v_row_bytes_ = row_bytes(s_.v_type, s_.kv_dim);
  size_t k_bytes = 0, v_bytes = 0;
  for (size_t l = 0; l < s_.n_layers; ++l) {
    k_off_.push_back(k_bytes), v_off_.push_back(v_bytes);
    k_bytes += capacity(l) * k_row_bytes_, v_bytes += capacity(l) * v_row_bytes_;
  }
  held_from_.assign(s_.n_layers, 0);
  k_.resize(k_bytes);
  v_.resize(v_bytes);
  v_converted_.resize(v_row_bytes_);
}

void KvCache::store(size_t layer, size_t pos, const float* k, const float* v) {
  const size_t cap = capacity(layer), s = pos % cap;
  if (pos >= cap) held_from_[layer] = std::max(held_from_[layer], pos - cap + 1);  // the slot's old row is gone
  f32_to_row(s_.k_type, k, s_.kv_dim, &k_[k_off_[layer] + s * k_row_bytes_]);
  if (!s_.v_transposed) return f32_to_row(s_.v_type, v, s_.kv_dim, &v_[v_off_[layer] + s * v_row_bytes_]);
  f32_to_row(s_.v_type, v, s_.kv_dim, v_converted_.data());
  const size_t elem = value_size(), vt_row = vt_row_bytes(layer);
  uint8_t* column = &v_[v_off_[layer] + s * elem];
  for (size_t d = 0; d < s_.kv_dim; ++d) std::memcpy(column + d * vt_row, &v_converted_[d * elem], elem);
}

void KvCache::store_key(size_t layer, size_t slot, const float* k) {
  f32_to_row(s_.k_type, k, s_.kv_dim, &k_[k_off_[layer] + slot * k_row_bytes_]);
}

void KvCache::move_values(size_t layer, size_t n_keep, size_t n_discard, size_t n_past) {
  const size_t n_moved = n_past - n_keep - n_discard;
  if (!s_.v_transposed) {
    uint8_t* base = &v_[v_off_[layer]];
    std::memmove(base + n_keep * v_row_bytes_, base + (n_keep + n_discard) * v_row_bytes_, n_moved * v_row_bytes_);
    return;
  }
  const size_t elem = value_size(), vt_row = vt_row_bytes(layer);
  for (size_t d = 0; d < s_.kv_dim; ++d) {
    uint8_t* row = &v_[v_off_[layer] + d * vt_row];
    std::memmove(row + n_keep * elem, row + (n_keep + n_discard) * elem, n_moved * elem);
  }
}

// Position p' of the shifted layer comes from p' (kept) or p' + n_discard (moved). Every
// position of the new ring's range whose source the ring still holds is copied to its new
// slot, newest first, until one is missing: held_from() then starts above it.
void KvCache::shift_ring(size_t layer, size_t n_keep, size_t n_discard, size_t n_past,
                         const std::function<void(float*)>& rerotate) {
  const size_t cap = capacity(layer), n_new = n_past - n_discard, lo = n_new > cap ? n_new - cap : 0;
  const std::vector<uint8_t> old_k(k_.begin() + k_off_[layer], k_.begin() + k_off_[layer] + cap * k_row_bytes_);
  const std::vector<uint8_t> old_v(v_.begin() + v_off_[layer], v_.begin() + v_off_[layer] + cap * v_row_bytes_);
  const size_t elem = s_.v_transposed ? value_size() : 0, vt_row = vt_row_bytes(layer);
  float row[kMaxRow];
  size_t from = n_new;
  for (size_t p = n_new; p-- > lo;) {
    const size_t src = p < n_keep ? p : p + n_discard;
    if (src < held_from_[layer]) break;
    const size_t s_old = src % cap, s_new = p % cap;
    uint8_t* k_dst = &k_[k_off_[layer] + s_new * k_row_bytes_];
    if (p < n_keep) {
      std::memcpy(k_dst, &old_k[s_old * k_row_bytes_], k_row_bytes_);
    } else {
      row_to_f32(s_.k_type, &old_k[s_old * k_row_bytes_], 0, s_.kv_dim, row);
      rerotate(row);
      f32_to_row(s_.k_type, row, s_.kv_dim, k_dst);
    }
    if (!s_.v_transposed) {
      std::memcpy(&v_[v_off_[layer] + s_new * v_row_bytes_], &old_v[s_old * v_row_bytes_], v_row_bytes_);
    } else {
      for (size_t d = 0; d < s_.kv_dim; ++d)
        std::memcpy(&v_[v_off_[layer] + d * vt_row + s_new * elem], &old_v[d * vt_row + s_old * elem], elem);
    }
    from = p;
  }
  held_from_[layer] = from;
}

// Full-size layers only (eviction refuses rings): slot == position.
void KvCache::gather_values(size_t layer, const int32_t* kept, size_t n_kept) {
  if (!s_.v_transposed) {
    uint8_t* base = &v_[v_off_[layer]];
    for (size_t i = 0; i < n_kept; ++i)
      if (size_t(kept[i]) != i) std::memcpy(base + i * v_row_bytes_, base + size_t(kept[i]) * v_row_bytes_, v_row_bytes_);
    return;
  }
  const size_t elem = value_size(), vt_row = vt_row_bytes(layer);
  for (size_t d = 0; d < s_.kv_dim; ++d) {
    uint8_t* row = &v_[v_off_[layer] + d * vt_row];
    for (size_t i = 0; i < n_kept; ++i)
      if (size_t(kept[i]) != i) std::memcpy(row + i * elem, row + size_t(kept[i]) * elem, elem);
  }
}

void KvCache::keys_to_f32(size_t layer, size_t j0, size_t nj, size_t e0, size_t n, float* out, size_t ld) const {
  for (size_t j = 0; j < nj; ++j) row_to_f32(s_.k_type, k_row(layer, j0 + j), e0, n, out + j * ld);
}

uint32_t KvCache::state_type_of(TensorType k, TensorType v, bool v_transposed) {
  return type_code(k) | type_code(v) << 3 | uint32_t(!v_transposed) << 6;
}

std::string KvCache::state_type_name(uint32_t code) {
  static const char* const names[5] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
  if (code >> 7 || (code & 7) > 4 || (code >> 3 & 7) > 4) return "type " + std::to_string(code);
  return std::string(names[code & 7]) + " keys, " + names[code >> 3 & 7] + " values" +
         (code >> 6 & 1 ? " by position" : "");
}

uint64_t KvCache::state_layer_bytes(size_t n) const {
  return uint64_t(n) * (k_row_bytes_ + v_row_bytes_);
}

}  // namespace kiln
