#pragma once
// The single dispatch point for numeric kernels. Kernels know nothing of models, files
// or threads: the runtime splits work (by output rows) and calls these on its slices.
//
// Contract every ISA keeps (tests check it against kernels/scalar on random inputs):
//  * Results match the scalar reference within float rounding (tests state the bound).
//  * gemm: Y[b][r] depends only on W row r, X row b, k and whether n_batch is 1; never on
//    r0/r1, on the batch size otherwise, or on how a caller split the rows. That is what
//    makes greedy output identical at any thread count. (A single activation row is the
//    bandwidth-bound decode case and may sum in another order than batches do.)
//  * No allocation, no threads, no global state beyond the table chosen at startup.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/tensor_type.h"

namespace kiln::kernels {

// In order of preference. avxvnni is AVX2 plus AVX-VNNI (the VEX vpdpbusd on 256-bit
// registers: Alder Lake and later, Zen 5) for the packed integer kernels.
enum class Isa { scalar, avx2, avxvnni, avx512 };
const char* isa_name(Isa isa);

// Y[b * ldy + r] = sum_{i<k} W_r[i] * X[b * ldx + i]   for b < n_batch, r0 <= r < r1.
// Row r of W starts at (const char*)w + r * w_row_bytes and holds k values of w_type.
struct GemmArgs {
  TensorType w_type;
  const void* w;
  size_t w_row_bytes;
  const float* x;
  size_t ldx;
  float* y;
  size_t ldy;
  size_t k;
  size_t n_batch;
  size_t r0, r1;
  // w was made by pack_weights for this table (w_row_bytes is then unused).
  bool w_packed = false;
  // Optional: rows 0..n_batch-1 of x already converted by this table's prepare() for
  // w_type; saves gemm the conversion when several calls share the same activations.
  const void* x_prepared = nullptr;
  // Packed float weights (F32, F16, BF16; gemm) only: bytes from one 16-row group to the
  // next, 0 for the packed size of k columns. Larger: the first k columns of a matrix
  // packed with more (attention's P V over the keys a block of queries sees).
  size_t w_group_bytes = 0;
};

// P V of tiled attention with the values stored by position (quantized value caches):
//   out[i * ldo + e] += sum_{j < n_pos} p[i * ldp + j] * V_j[e0 + e]   for i < rows, e < n
// V_j, value row j, starts at (const char*)v + j * v_stride and holds values of v_type
// (F32, F16, BF16, Q8_0 or Q4_0; block types in whole 32-value blocks from the row start,
// any e0 and n). Every output gets its terms one position at a time, in order (a fused
// multiply-add in the SIMD tables, a product then a sum in the scalar one), so its bits
// depend neither on rows nor on how a caller splits the positions over several calls.
struct PvArgs {
  TensorType v_type;
  const void* v;
  size_t v_stride;
  size_t e0, n;
  const float* p;
  size_t ldp;
  size_t rows, n_pos;
  float* out;
  size_t ldo;
};

struct Ops {
  Isa isa;

  // Supported weight types of gemm; false for the rest (the loader reports them).
  bool (*gemm_supports)(TensorType w_type);
  void (*gemm)(const GemmArgs& args);

  float (*dot)(const float* a, const float* b, size_t n);
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, size_t n);
  // y[i] *= a
  void (*scale)(float* y, float a, size_t n);
  // out[i] = a[i] + b[i]   (out may alias a or b)
  void (*add)(const float* a, const float* b, float* out, size_t n);
  // out = x / sqrt(mean(x^2) + eps) * weight   (out may alias x)
  void (*rmsnorm)(const float* x, const float* weight, float* out, size_t n, float eps);
  // x = exp(x - max) / sum, in place; returns nothing, max and sum computed in float
  void (*softmax)(float* x, size_t n);
  // out[i] = silu(gate[i]) * up[i]   (SwiGLU; out may alias gate)
  void (*swiglu)(const float* gate, const float* up, float* out, size_t n);
  // Rotary embedding of n_heads heads of head_dim floats, rotating the first n_rot
  // dimensions of each head. cos_sin holds n_rot/2 pairs (cos theta_i, sin theta_i) for
  // this token's position. neox=false rotates adjacent pairs (x[2i], x[2i+1]) as GGUF
  // llama files expect; neox=true rotates (x[i], x[i + n_rot/2]).
  void (*rope)(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin,
               bool neox);

  void (*fp16_to_f32)(const uint16_t* in, float* out, size_t n);
  void (*f32_to_fp16)(const float* in, uint16_t* out, size_t n);
  void (*bf16_to_f32)(const uint16_t* in, float* out, size_t n);
  void (*f32_to_bf16)(const float* in, uint16_t* out, size_t n);

  // LayerNorm (Ba et al. 2016): out = (x - mean) / sqrt(var + eps) * weight + bias, the
  // variance of the centered values (two passes: no cancellation when |mean| >> std).
  // bias may be nullptr (no bias); out may alias x.
  void (*layernorm)(const float* x, const float* weight, const float* bias, float* out, size_t n, float eps);
  // GELU, tanh approximation (Hendrycks & Gimpel 2016) as GPT-2/MPT use it:
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as x * sigmoid(2 u) (the same
  // function; no 1 + tanh cancellation for negative x). out may alias x.
  void (*gelu)(const float* x, float* out, size_t n);

  // Packed weights: bytes to hold rows x k of `type` in the layout this table's gemm
  // reads fastest (kernels/packed.h; built by pack_weights), or 0: it reads the file's.
  size_t (*packed_bytes)(TensorType type, size_t rows, size_t k);
  // Activations: bytes of n_batch rows of k floats converted for weights of w_type (0:
  // gemm takes the floats), and the conversion of rows [b0, b1) of x into out (row b at
  // b times the per-row size). Lets a caller convert once for several gemm calls.
  size_t (*prepared_bytes)(TensorType w_type, size_t k, size_t n_batch);
  void (*prepare)(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out);

  // gemm on F32 weights packed as pack_weights lays them out (kernels/packed.h, whatever
  // packed_bytes says), giving bit for bit what gemm gives for the same rows in the file
  // layout (a.w_packed false). For short k (attention's Q K^T over a head dimension),
  // where the file layout's arithmetic is cheaper to run on packed records. r0 a multiple
  // of 16.
  void (*gemm_packed_dots)(const GemmArgs& args);

  // gemm on F32, F16 or BF16 weights in the file layout (a.w_packed false) with the
  // packed F32 gemm's arithmetic: every output one chain of fused multiply-adds over k in
  // order, from +0, of the weights' float values. So it gives, bit for bit, what gemm
  // gives for the same values packed as F32 records, without packing them: attention's
  // decode (a few query rows against keys and values read once) then matches a prefill
  // that packed them (runtime/attention.h). The lanes run across activation rows.
  void (*gemm_chain)(const GemmArgs& args);

  // x[i] = exp(x[i] - max), returns the sum (exp(-inf) = 0): the unnormalized softmax that
  // tiled attention rescales block by block.
  float (*exp_sum)(float* x, size_t n, float max);

  // See PvArgs. Each value row is decoded once per call, whatever rows is.
  void (*pv)(const PvArgs& args);

  // One row of a selective-scan state (Mamba-2's h, one head dimension over d_state = n):
  // h[j] = h[j] * decay + x_dt * B[j], then returns sum_j h[j] * C[j] over the new h.
  float (*ssm_update)(float* h, const float* B, const float* C, float decay, float x_dt, size_t n);
  // ssm_update on the `rows` consecutive state rows of one head (h: rows x n) sharing B,
  // C and decay, row i with x_dt = x[i] * dt; y[i] gets its sum. Each row's h and y are
  // bit for bit what ssm_update gives it.
  void (*ssm_update_rows)(float* h, const float* B, const float* C, float decay, float dt, const float* x, float* y,
                          size_t rows, size_t n);
};

// Writes rows [r0, r1) (r0 a multiple of 16) of a file-layout weight of `type` into the
// packed tensor at dst (sized by packed_bytes of a table that returned non-zero).
void pack_weights(TensorType type, const void* src, size_t src_row_bytes, size_t rows, size_t k, size_t r0,
                  size_t r1, void* dst);

// The table for this CPU, chosen once (KILN_ISA=scalar|avx2|avxvnni|avx512 forces one; asking
// for an ISA the CPU lacks throws kiln::Error).
const Ops& ops();
// The table for one ISA, or nullptr if not compiled in or the CPU lacks it.
const Ops* ops_for(Isa isa);
// Every ISA usable on this machine, scalar first.
std::vector<Isa> available_isas();

}  // namespace kiln::kernels
