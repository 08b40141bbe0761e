// Reference kernels: plain loops, the ground truth every SIMD table is tested against.
// Also the only table on non-x86 builds, so each loop is kept auto-vectorizer friendly.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16_dot.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "kernels/tables.h"

namespace kiln::kernels {
namespace {

float weight_at(TensorType type, const char* row, size_t i) {
  switch (type) {
    case TensorType::F32: {
      float v;
      std::memcpy(&v, row + 4 * i, 4);
      return v;
    }
    case TensorType::F16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * i, 2);
      return fp16_to_f32(h);
    }
    case TensorType::BF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * i, 2);
      return bf16_to_f32(h);
    }
    default:
      return 0.0f;  // unreachable: gemm_supports() gates the types
  }
}

// Weight types that can be quantized weights (Q8_K is only an activation format).
bool is_weight_quant(TensorType t) {
  const ref::QuantTraits* q = ref::quant_traits(t);
  return q && q->can_dequantize && t != TensorType::Q8_K;
}

bool gemm_supports(TensorType t) { return is_float_type(t) || is_weight_quant(t); }

// Quantized weights: each block is dequantized once per weight row and dotted with every
// activation row, the partial sums added block by block in k order.
void gemm_quant(const GemmArgs& a) {
  const ref::QuantTraits& q = *ref::quant_traits(a.w_type);
  const size_t n_blocks = a.k / q.block_size;
  constexpr size_t kBatchChunk = 64;
  float block[256];
  float acc[kBatchChunk];
  for (size_t r = a.r0; r < a.r1; ++r) {
    const char* row = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    for (size_t b0 = 0; b0 < a.n_batch; b0 += kBatchChunk) {
      const size_t nb = std::min(kBatchChunk, a.n_batch - b0);
      std::fill_n(acc, nb, 0.0f);
      for (size_t blk = 0; blk < n_blocks; ++blk) {
        ref::dequantize_row(a.w_type, row + blk * q.block_bytes, block, q.block_size);
        for (size_t b = 0; b < nb; ++b) {
          const float* x = a.x + (b0 + b) * a.ldx + blk * q.block_size;
          float part = 0.0f;
          for (size_t i = 0; i < q.block_size; ++i) part += block[i] * x[i];
          acc[b] += part;
        }
      }
      for (size_t b = 0; b < nb; ++b) a.y[(b0 + b) * a.ldy + r] = acc[b];
    }
  }
}

// One float accumulator per output, k in order: the simplest rounding to reason about.
void gemm(const GemmArgs& a) {
  if (a.w_packed && a.w_type == TensorType::BF16) return bf16_dot::reference_gemm(a);  // all this table packs
  if (!is_float_type(a.w_type)) {
    gemm_quant(a);
    return;
  }
  for (size_t r = a.r0; r < a.r1; ++r) {
    const char* row = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    for (size_t b = 0; b < a.n_batch; ++b) {
      const float* x = a.x + b * a.ldx;
      float sum = 0.0f;
      for (size_t i = 0; i < a.k; ++i) sum += weight_at(a.w_type, row, i) * x[i];
      a.y[b * a.ldy + r] = sum;
    }
  }
}

// gemm's sums above, reading element i of row r from its packed F32 record.
void gemm_packed_dots(const GemmArgs& a) {
  constexpr size_t G = packed::kGroupRows;
  const size_t gbytes = packed::group_bytes(TensorType::F32, a.k);
  for (size_t r = a.r0; r < a.r1; ++r) {
    const float* w = reinterpret_cast<const float*>(static_cast<const char*>(a.w) + r / G * gbytes) + r % G;
    for (size_t b = 0; b < a.n_batch; ++b) {
      const float* x = a.x + b * a.ldx;
      float sum = 0.0f;
      for (size_t i = 0; i < a.k; ++i) sum += w[i * G] * x[i];
      a.y[b * a.ldy + r] = sum;
    }
  }
}

// Each output's fused multiply-adds over k in order from +0 (Ops::gemm_chain's definition).
void gemm_chain(const GemmArgs& a) {
  for (size_t r = a.r0; r < a.r1; ++r) {
    const char* row = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    for (size_t b = 0; b < a.n_batch; ++b) {
      const float* x = a.x + b * a.ldx;
      float acc = 0.0f;
      for (size_t i = 0; i < a.k; ++i) acc = std::fma(weight_at(a.w_type, row, i), x[i], acc);
      a.y[b * a.ldy + r] = acc;
    }
  }
}

float dot(const float* a, const float* b, size_t n) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float a, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale(float* y, float a, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= a;
}

void add(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void rmsnorm(const float* x, const float* weight, float* out, size_t n, float eps) {
  float sum_sq = 0.0f;
  for (size_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq / (float)n + eps);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

float exp_sum(float* x, size_t n, float max) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  return sum;
}

void softmax(float* x, size_t n) {
  if (n == 0) return;
  float max = x[0];
  for (size_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  const float inv = 1.0f / exp_sum(x, n, max);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin,
          bool neox) {
  const size_t half = n_rot / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* head = x + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      float* p0 = neox ? head + i : head + 2 * i;
      float* p1 = neox ? head + i + half : head + 2 * i + 1;
      const float x0 = *p0, x1 = *p1;
      *p0 = x0 * c - x1 * s;
      *p1 = x0 * s + x1 * c;
    }
  }
}

void fp16_to_f32_n(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_f32(in[i]);
}
void f32_to_fp16_n(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_fp16(in[i]);
}
void bf16_to_f32_n(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}
void f32_to_bf16_n(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

// The sums in double, as ggml's norm does: one float accumulator over thousands of
// values would lose more to rounding than the SIMD tables' 8 or 16 lanes do.
void layernorm(const float* x, const float* weight, const float* bias, float* out, size_t n, float eps) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += x[i];
  const float mean = float(sum / double(n));
  double sum_sq = 0.0;
  for (size_t i = 0; i < n; ++i) sum_sq += double(x[i] - mean) * double(x[i] - mean);
  const float inv = 1.0f / std::sqrt(float(sum_sq / double(n)) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * weight[i] + (bias ? bias[i] : 0.0f);
}

// sqrt(2/pi) and GELU's cubic coefficient, doubled: x * sigmoid(2u) = x / (1 + e^(-2u)).
constexpr float kGeluA = 2.0f * 0.7978845608028654f, kGeluB = 2.0f * 0.7978845608028654f * 0.044715f;

void gelu(const float* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = v / (1.0f + std::exp(-(kGeluA * v + kGeluB * v * v * v)));
  }
}

// Values [e0, e0 + n) of one value row as floats; a slice that starts or ends inside a
// block (heads narrower than a block) keeps only its part of the blocks it touches.
void value_slice(TensorType t, const char* row, size_t e0, size_t n, float* out) {
  if (is_float_type(t)) {
    for (size_t e = 0; e < n; ++e) out[e] = weight_at(t, row, e0 + e);
    return;
  }
  const ref::QuantTraits& q = *ref::quant_traits(t);
  float block[256];  // the largest block (K-quants)
  for (size_t b = e0 / q.block_size; b * q.block_size < e0 + n; ++b) {
    ref::dequantize_row(t, row + b * q.block_bytes, block, q.block_size);
    const size_t lo = std::max(e0, b * q.block_size), hi = std::min(e0 + n, (b + 1) * q.block_size);
    std::copy(block + (lo - b * q.block_size), block + (hi - b * q.block_size), out + (lo - e0));
  }
}

// Positions outermost: each output's sum runs in position order, as the contract says.
// Columns go 512 at a time so any n fits the stack buffer.
void pv(const PvArgs& a) {
  float row[512];
  for (size_t c0 = 0; c0 < a.n; c0 += 512) {
    const size_t w = std::min<size_t>(512, a.n - c0);
    for (size_t j = 0; j < a.n_pos; ++j) {
      value_slice(a.v_type, static_cast<const char*>(a.v) + j * a.v_stride, a.e0 + c0, w, row);
      for (size_t i = 0; i < a.rows; ++i) {
        const float p = a.p[i * a.ldp + j];
        float* out = a.out + i * a.ldo + c0;
        for (size_t e = 0; e < w; ++e) out[e] += p * row[e];
      }
    }
  }
}

float ssm_update(float* h, const float* B, const float* C, float decay, float x_dt, size_t n) {
  float sum = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    h[j] = h[j] * decay + x_dt * B[j];
    sum += h[j] * C[j];
  }
  return sum;
}

void ssm_update_rows(float* h, const float* B, const float* C, float decay, float dt, const float* x, float* y,
                     size_t rows, size_t n) {
  for (size_t i = 0; i < rows; ++i) y[i] = ssm_update(h + i * n, B, C, decay, x[i] * dt, n);
}

// Weights stay in the file layout and gemm takes float activations, except BF16: packed
// in pairs and read by kernels/bf16_dot.h's reference, so that BF16 weights give the same
// bits on every table.
size_t bf16_packing(TensorType t, size_t rows, size_t k) {
  return t == TensorType::BF16 && k % 2 == 0 ? packed::tensor_bytes(t, rows, k) : 0;
}
size_t no_preparing(TensorType, size_t, size_t) { return 0; }
void no_prepare(TensorType, const float*, size_t, size_t, size_t, size_t, void*) {}

const Ops kScalarOps = {
    .isa = Isa::scalar,
    .gemm_supports = gemm_supports,
    .gemm = gemm,
    .dot = dot,
    .axpy = axpy,
    .scale = scale,
    .add = add,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .swiglu = swiglu,
    .rope = rope,
    .fp16_to_f32 = fp16_to_f32_n,
    .f32_to_fp16 = f32_to_fp16_n,
    .bf16_to_f32 = bf16_to_f32_n,
    .f32_to_bf16 = f32_to_bf16_n,
    .layernorm = layernorm,
    .gelu = gelu,
    .packed_bytes = bf16_packing,
    .prepared_bytes = no_preparing,
    .prepare = no_prepare,
    .gemm_packed_dots = gemm_packed_dots,
    .gemm_chain = gemm_chain,
    .exp_sum = exp_sum,
    .pv = pv,
    .ssm_update = ssm_update,
    .ssm_update_rows = ssm_update_rows,
};

}  // namespace

const Ops& scalar_ops() { return kScalarOps; }

}  // namespace kiln::kernels
