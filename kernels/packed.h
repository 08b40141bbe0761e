#pragma once
// The interleaved ("packed") weight layout the x86 integer kernels read, and the 8-bit
// activation formats they multiply it with. Internal to kernels/.
//
// Why: a file's quantized row is a run of blocks, so a dot product of one row needs a
// horizontal sum per block and a scale per 32 elements. Packed, 16 consecutive rows form
// a group, and every 32-bit lane of a 64-byte vector belongs to one row: vpdpbusd with
// four broadcast activation bytes then advances 16 dot products at once, block scales
// are 16-lane vectors, results are stored as a vector, and no horizontal sums remain.
// AVX2 reads the same layout as two 8-lane halves.
//
// A packed tensor: ceil(rows / 16) groups, one after another; a group is the records of
// its blocks in k order; rows past the end of the tensor are zero (scales 0). Within a
// record, "vector v" is 64 bytes = 16 lanes x 4 bytes, lane r holding row r of the group.
// Weights are stored unsigned (offset-shifted); the kernels subtract offset x sum(x_q).
//
// Legacy records, one per 32 elements (qs vectors: lane r, byte i of vector v):
//   Q8_0: d[16] fp16 | 8 vectors: element 4v+i, stored q+128            = 544 bytes
//   Q4_0: d[16]      | 4 vectors: low nibble element 4v+i, high 16+4v+i = 288 bytes
//   Q4_1: d[16] | m[16] | nibbles as Q4_0                               = 320 bytes
//   Q5_0: d[16] | qh: 8 x uint64 | nibbles as Q4_0                       = 352 bytes
//   Q5_1: d[16] | m[16] | qh | nibbles                                  = 384 bytes
//   qh word j, bit 4r+i: bit 4 (the 16) of row r's element 4j+i.
// K records, one per 256 elements; "unpacked vector" u of a 32-element sub-block holds
// its elements 4u..4u+3:
//   Q4_K: d[16] | dmin[16] fp16 | sc[8][16] u8 | mpair[4][16][2] u8 (m of sub-blocks
//         2p, 2p+1) | 4 pairs x 8 vectors: vector v of pair p, low nibble = sub-block
//         2p's unpacked vector v, high nibble = sub-block 2p+1's             = 2368 bytes
//   Q6_K: d[16] | scpair[8][16][2] i8 (sub-blocks of 16: 2P, 2P+1) | 8 x (ql 4 vectors,
//         qh 2 vectors): for 32-element chunk P, unpacked vector u < 8 (u < 4: sub-block
//         2P, else 2P+1) has low 4 bits from ql vector u % 4 (u < 4 low nibble, else
//         high) and bits 4..5 from bits 2(u % 4)..+1 of qh vector u / 4; q in 0..63 is
//         the file's q + 32                                                 = 3360 bytes
//   Q5_K: as Q4_K, each pair's 8 vectors followed by its fifth bits: 16 x uint64, word
//         8h+v bit 4r+i is bit 4 (the 16) of row r's byte i of sub-block 2p+h's
//         unpacked vector v (a mask for one masked add)   320 + 4 x 640 = 2880 bytes
// Sub-blocks of 16 (Q2_K, Q3_K): "crumb vector" s holds sub-block s, the 2-bit values
// of its elements 4j..4j+3 in bits 2j..2j+1 of lane r's bytes 0..3 (unpacked vector j
// of s is (crumb >> 2j) & 3).
//   Q3_K: d[16] | scpair[8][16][2] i8 (file scale - 32 of sub-blocks 2P, 2P+1) | 8
//         chunks: crumb vectors 2P, 2P+1 (the file's low 2 bits), then 8 x uint64,
//         word u bit 4r+i: the file's hmask bit of row r's element 32P + 4u + i; q in
//         0..7 is the file's q + 4                        288 + 8 x 192 = 1824 bytes
//   Q2_K: d[16] | dmin[16] | scm[8][16][2] u8 (the file's scales byte, sc | m << 4, of
//         sub-blocks 2P, 2P+1) | 16 crumb vectors                          = 1344 bytes
// i-quants with 4-bit indices into kIq4nlValues (the kernels look each nibble up as
// value + 128, unsigned, and subtract 128 x sum(x_q)):
//   IQ4_NL: nibbles and scales as Q4_0 (one record per 32)               = 288 bytes
//   IQ4_XS: d[16] fp16 | sc[8][16] i8 (the 6-bit scale - 32 of sub-block b at 16b + r) |
//           8 sub-blocks x 4 vectors: vector v of sub-block b, lane r byte i = the file's
//           qs[16b + 4v + i] (elements 32b + 4v + i low, + 16 high)  32 + 128 + 2048 = 2208
// Float weights (F32, F16, BF16; kernels/x86/gemm_float_packed.h): F32 and F16 one
// record per element of k, the 16 rows' values of that column in the file's type (16 x 4
// or 16 x 2 bytes). A gemm multiplies a record by one broadcast activation into 16
// outputs: every output is one FMA chain over k in order, and no horizontal sums remain.
// BF16 one record per pair of elements 2j, 2j + 1: row r's two values at slot r (16 x 2 x
// 2 bytes; subnormals stored as zero), what one vdpbf16ps multiplies by a broadcast pair
// of bf16 activations (kernels/bf16_dot.h).
// Each record is read front to back: extra bits sit next to the values they complete
// (Q3_K decode from DRAM: 7 GB/s with its high bits at the record's end, 12-18 so).
// Bytes per row and 256 elements against the file's: Q4_K 148/144, Q5_K 180/176 (the
// 6-bit scales and mins widened to bytes), Q3_K 114/110 (scales widened), Q6_K 210/210,
// Q2_K 84/84. Widened scales cost no unpacking in the kernels; decode reads ~3% more.
#include <cstddef>
#include <cstdint>

#include "kiln/tensor_type.h"

namespace kiln::kernels::packed {

inline constexpr size_t kGroupRows = 16;

// Bytes of one record and elements it covers, or 0 for a type without a packed layout.
constexpr size_t record_bytes(TensorType t) {
  switch (t) {
    case TensorType::Q8_0: return 544;
    case TensorType::Q4_0: return 288;
    case TensorType::Q4_1: return 320;
    case TensorType::Q5_0: return 352;
    case TensorType::Q5_1: return 384;
    case TensorType::Q4_K: return 2368;
    case TensorType::Q6_K: return 3360;
    case TensorType::Q5_K: return 2880;
    case TensorType::Q3_K: return 1824;
    case TensorType::Q2_K: return 1344;
    case TensorType::IQ4_NL: return 288;
    case TensorType::IQ4_XS: return 2208;
    case TensorType::F32: return 16 * 4;
    case TensorType::F16: return 16 * 2;
    case TensorType::BF16: return 16 * 2 * 2;
    default: return 0;
  }
}
constexpr size_t record_elements(TensorType t) {
  switch (t) {
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: case TensorType::IQ4_XS: return 256;
    case TensorType::F32: case TensorType::F16: return 1;
    case TensorType::BF16: return 2;
    default: return 32;
  }
}
constexpr size_t group_bytes(TensorType t, size_t k) { return k / record_elements(t) * record_bytes(t); }
constexpr size_t tensor_bytes(TensorType t, size_t rows, size_t k) {
  return (rows + kGroupRows - 1) / kGroupRows * group_bytes(t, k);
}

// Packs rows [r0, r1) of a file-layout tensor (r0 a multiple of 16) into dst, the start
// of the whole packed tensor. Portable code, shared by every ISA that reads the layout.
void pack_rows(TensorType t, const void* src, size_t src_row_bytes, size_t rows, size_t k, size_t r0, size_t r1,
               void* dst);

// ---- 8-bit activations. One row of k floats becomes, at a 64-byte aligned stride:
// Legacy weights (as ggml's Q8_0): per 32 elements d = fp16(amax / 127) kept as float,
// q = round-half-away(x / d), and s = sum(q) as int32 for the offset corrections.
//   int8 q[k] | float d[k/32] | int32 s[k/32]
// K-quant weights (as ggml's Q8_K): per 256 elements d = amax / 127 (float), q rounded
// to nearest, plus sums of q over each 16 and each 32 elements for mins and offsets.
//   int8 q[k] | float d[k/256] | int16 s16[k/16] | int16 s32[k/32]
//
// Error budget (what tests/packed_gemm_test.cpp enforces): weight blocks are exact
// integers times their scales, and block sums are exact in int32, so the only error
// beyond float rounding of the few per-block products is the activations' 8 bits. Each
// x_i moves by at most half a step, step = amax / 127 of its block, plus for q8_32 the
// fp16 rounding of that step (<= 127/2048 of it):
//   |y - sum w_i x_i| <= sum |w_i| * amax(block of i) / 127 * (1/2 + 127/2048)   (q8_32)
//   |y - sum w_i x_i| <= sum |w_i| * amax(block of i) / 127 * 1/2                (q8_256)
// plus 1e-5 * sum |w_i x_i| for the float arithmetic. On smooth activations that is
// ~0.3% of sum |w_i x_i| for 32-blocks; an outlier widens its block's steps (why ggml and
// kiln keep blocks small).
// BF16 weights (kernels/bf16_dot.h): the row rounded to bf16 (nearest even, subnormals
// flushed to zero), as k bf16 for the tables that multiply with vdpbf16ps and as the k
// floats they stand for elsewhere (Vec::bf16_dot_instruction()).
//   uint16 x[k] | unused, or  float x[k]
enum class ActFormat { none, q8_32, q8_256, bf16 };

constexpr ActFormat act_format(TensorType w) {
  switch (w) {
    case TensorType::Q8_0: case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0:
    case TensorType::Q5_1: case TensorType::IQ4_NL: return ActFormat::q8_32;
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: case TensorType::IQ4_XS: return ActFormat::q8_256;
    case TensorType::BF16: return ActFormat::bf16;
    default: return ActFormat::none;
  }
}
constexpr size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }
constexpr size_t act_row_bytes(ActFormat f, size_t k) {
  switch (f) {
    case ActFormat::q8_32: return align64(k + k / 32 * 8);
    case ActFormat::q8_256: return align64(k + k / 256 * 4 + k / 16 * 2 + k / 32 * 2);
    case ActFormat::bf16: return align64(k * 4);
    default: return 0;
  }
}

// Batch rows one pass over a task's weight groups multiplies (a multiple of the tile's
// rows): ~128 KiB of prepared activations, which stay in L2 while every group meets them.
// A pass over the whole batch re-read all of it from L3 for each 16-row group (pp512:
// 1.3 MB at k = 2048); 1.1B pp512 +3-6% on a Zen 5 (Q4_0 390 -> 405-415, bench/RESULTS.md).
// The AVX-512 tiles chunk; the AVX2 ones (two passes over a group per tile, half the
// arithmetic per byte) lost 2-4% with it and do not.
inline constexpr size_t kBatchChunkBytes = 128 << 10;
constexpr size_t batch_chunk_rows(size_t act_stride, size_t tile_rows) {
  const size_t rows = kBatchChunkBytes / act_stride / tile_rows * tile_rows;
  return rows > tile_rows ? rows : tile_rows;
}

struct ActRow32 {
  const int8_t* q;
  const float* d;
  const int32_t* s;
};
inline ActRow32 act_row32(const void* base, size_t k, size_t b) {
  const auto* p = static_cast<const uint8_t*>(base) + b * act_row_bytes(ActFormat::q8_32, k);
  return {reinterpret_cast<const int8_t*>(p), reinterpret_cast<const float*>(p + k),
          reinterpret_cast<const int32_t*>(p + k + k / 32 * 4)};
}
struct ActRow256 {
  const int8_t* q;
  const float* d;
  const int16_t* s16;
  const int16_t* s32;
};
// The same four arrays for the code that writes a row (prepare_q8_256).
struct ActRow256Out {
  int8_t* q;
  float* d;
  int16_t* s16;
  int16_t* s32;
};
inline ActRow256Out act_row256_out(void* row, size_t k) {
  auto* p = static_cast<uint8_t*>(row);
  return {reinterpret_cast<int8_t*>(p), reinterpret_cast<float*>(p + k), reinterpret_cast<int16_t*>(p + k + k / 256 * 4),
          reinterpret_cast<int16_t*>(p + k + k / 256 * 4 + k / 16 * 2)};
}
inline ActRow256 act_row256(const void* base, size_t k, size_t b) {
  const ActRow256Out r =
      act_row256_out(const_cast<uint8_t*>(static_cast<const uint8_t*>(base)) + b * act_row_bytes(ActFormat::q8_256, k), k);
  return {r.q, r.d, r.s16, r.s32};
}

}  // namespace kiln::kernels::packed
