// File layout -> packed layout (kernels/packed.h). Each record is built from the file's
// blocks of 16 rows: quantized values are decoded to small unsigned integers per row,
// then written lane by lane. Load-time code: clarity over speed.
#include <cstring>
#include <type_traits>

#include "kernels/bf16_dot.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"

namespace kiln::kernels::packed {
namespace {

constexpr size_t G = kGroupRows;

// One group's record being written: lane r of vector v is 4 bytes at v*64 + 4r.
struct Vectors {
  uint8_t* p;
  uint8_t& at(size_t v, size_t r, size_t i) const { return p[v * 64 + r * 4 + i]; }
};

void put_fp16(uint8_t* dst, size_t r, uint16_t h) { std::memcpy(dst + 2 * r, &h, 2); }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Bit `bit` of p[0..3] as a nibble (p[i]'s bit at bit i): one row's 4 bits of a packed
// mask word.
uint64_t bit_nibble(const uint8_t* p, int bit) {
  const uint32_t y = (load_u32(p) >> bit) & 0x01010101u;
  return (y | y >> 7 | y >> 14 | y >> 21) & 15;
}

template <class Block>
const Block* block_at(const void* src, size_t row_bytes, size_t row, size_t blk) {
  return reinterpret_cast<const Block*>(static_cast<const uint8_t*>(src) + row * row_bytes) + blk;
}

// Legacy types: q[32] unsigned (the file's stored value, +128 for Q8_0), d, optional m.
struct Legacy {
  uint8_t q[32];
  uint16_t d, m;
};

Legacy decode_legacy(TensorType t, const void* src, size_t row_bytes, size_t row, size_t blk) {
  Legacy out{};
  switch (t) {
    case TensorType::Q8_0: {
      const auto* b = block_at<block_q8_0>(src, row_bytes, row, blk);
      out.d = b->d;
      for (int i = 0; i < 32; ++i) out.q[i] = uint8_t(b->qs[i] + 128);
      break;
    }
    case TensorType::Q4_0: case TensorType::Q4_1: {
      const uint8_t* qs;
      if (t == TensorType::Q4_0) {
        const auto* b = block_at<block_q4_0>(src, row_bytes, row, blk);
        out.d = b->d, qs = b->qs;
      } else {
        const auto* b = block_at<block_q4_1>(src, row_bytes, row, blk);
        out.d = b->d, out.m = b->m, qs = b->qs;
      }
      for (int i = 0; i < 16; ++i) out.q[i] = qs[i] & 15, out.q[i + 16] = qs[i] >> 4;
      break;
    }
    case TensorType::Q5_0: case TensorType::Q5_1: {
      const uint8_t *qs, *qh;
      if (t == TensorType::Q5_0) {
        const auto* b = block_at<block_q5_0>(src, row_bytes, row, blk);
        out.d = b->d, qs = b->qs, qh = b->qh;
      } else {
        const auto* b = block_at<block_q5_1>(src, row_bytes, row, blk);
        out.d = b->d, out.m = b->m, qs = b->qs, qh = b->qh;
      }
      uint32_t high;
      std::memcpy(&high, qh, 4);
      for (int i = 0; i < 16; ++i) {
        out.q[i] = uint8_t((qs[i] & 15) | (((high >> i) & 1) << 4));
        out.q[i + 16] = uint8_t((qs[i] >> 4) | (((high >> (i + 16)) & 1) << 4));
      }
      break;
    }
    default: break;
  }
  return out;
}

void pack_legacy_record(TensorType t, const Legacy* rows, size_t n, uint8_t* rec) {
  const bool has_m = t == TensorType::Q4_1 || t == TensorType::Q5_1;
  const bool has_qh = t == TensorType::Q5_0 || t == TensorType::Q5_1;
  std::memset(rec, 0, record_bytes(t));
  uint8_t* p = rec;
  for (size_t r = 0; r < n; ++r) put_fp16(p, r, rows[r].d);
  p += 32;
  if (has_m) {
    for (size_t r = 0; r < n; ++r) put_fp16(p, r, rows[r].m);
    p += 32;
  }
  if (has_qh) {
    for (size_t j = 0; j < 8; ++j) {
      uint64_t word = 0;
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < 4; ++i) word |= uint64_t((rows[r].q[4 * j + i] >> 4) & 1) << (4 * r + i);
      std::memcpy(p + 8 * j, &word, 8);
    }
    p += 64;
  }
  const Vectors qs{p};
  for (size_t r = 0; r < n; ++r)
    for (size_t v = 0; v < 4; ++v)
      for (size_t i = 0; i < 4; ++i) {
        if (t == TensorType::Q8_0) {
          qs.at(v, r, i) = rows[r].q[4 * v + i];
          qs.at(v + 4, r, i) = rows[r].q[16 + 4 * v + i];
        } else {
          qs.at(v, r, i) = uint8_t((rows[r].q[4 * v + i] & 15) | ((rows[r].q[16 + 4 * v + i] & 15) << 4));
        }
      }
}

// Q4_0 and Q8_0 need no decoding: every lane takes 4 consecutive file bytes (Q4_0's
// nibble pairs are already element j and j + 16), so records are plain copies.
void pack_q4_0_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::Q4_0));
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_q4_0>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    for (size_t v = 0; v < 4; ++v) std::memcpy(rec + 32 + v * 64 + r * 4, b->qs + 4 * v, 4);
  }
}

void pack_q8_0_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::Q8_0));
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_q8_0>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    for (size_t v = 0; v < 8; ++v) {
      uint32_t word;
      std::memcpy(&word, b->qs + 4 * v, 4);
      word ^= 0x80808080u;  // q + 128 for every byte
      std::memcpy(rec + 32 + v * 64 + r * 4, &word, 4);
    }
  }
}

// Q5_K is Q4_K plus its fifth bits as masks after each pair's nibble vectors.
template <class Block>
void pack_k4_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  constexpr bool q5 = std::is_same_v<Block, block_q5_K>;
  if (n < G) std::memset(rec, 0, record_bytes(q5 ? TensorType::Q5_K : TensorType::Q4_K));
  uint8_t *d = rec, *dmin = rec + 32, *sc = rec + 64, *mpair = rec + 192;
  const Vectors qs{rec + 320};
  [[maybe_unused]] uint64_t qh[q5 ? 64 : 1] = {};
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<Block>(src, row_bytes, row0 + r, blk);
    put_fp16(d, r, b->d);
    put_fp16(dmin, r, b->dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      ref::unpack_scale_min_k4(b->scales, j, &s, &m);
      sc[16 * j + r] = s;
      mpair[32 * (j / 2) + 2 * r + (j % 2)] = m;
    }
    // The file's 32 bytes of sub-blocks 2p/2p+1 already pair them by nibble.
    for (size_t v = 0; v < 32; ++v) std::memcpy(&qs.at(v % 8 + v / 8 * (q5 ? 10 : 8), r, 0), b->qs + 4 * v, 4);
    if constexpr (q5)  // element 32sb + 4v + i has its fifth bit at bit sb of qh[4v + i]
      for (int sb = 0; sb < 8; ++sb)
        for (size_t v = 0; v < 8; ++v) qh[8 * sb + v] |= bit_nibble(b->qh + 4 * v, sb) << (4 * r);
  }
  if constexpr (q5)  // each pair's 16 words follow its 8 nibble vectors
    for (size_t p = 0; p < 4; ++p) std::memcpy(rec + 320 + 640 * p + 512, qh + 16 * p, 128);
}

// Chunk P (elements 32P..32P+31) lies in one half h = P / 4 of the file's block and one
// 2-bit field g = P % 4: its low nibbles are 32 bytes of ql (low or high halves) and its
// high bits one bit pair of 32 qh bytes. Packed ql vector v pairs elements 4v+i and
// 16+4v+i of the chunk, qh vector h2 holds elements 16 h2 + 4j + i at bits 2j, so whole
// 32-bit words of the file give a lane's 4 bytes (this took 150 ms for a 32000 x 2048
// output matrix element by element, a third of a Q4_0 file's load).
void pack_q6_k_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::Q6_K));
  int8_t* scpair = reinterpret_cast<int8_t*>(rec + 32);
  uint8_t* chunks = rec + 288;
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_q6_K>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    for (int j = 0; j < 16; ++j) scpair[32 * (j / 2) + 2 * r + (j % 2)] = b->scales[j];
    for (size_t P = 0; P < 8; ++P) {
      const size_t h = P / 4, g = P % 4;
      const uint8_t* ql = b->ql + 64 * h + 32 * (g % 2);
      const uint8_t* qh = b->qh + 32 * h;
      const int shift = g < 2 ? 0 : 4;
      uint8_t* out = chunks + P * 384 + 4 * r;
      for (size_t v = 0; v < 4; ++v) {
        const uint32_t lo = (load_u32(ql + 4 * v) >> shift) & 0x0f0f0f0fu;
        const uint32_t hi = (load_u32(ql + 16 + 4 * v) >> shift) & 0x0f0f0f0fu;
        const uint32_t word = lo | hi << 4;
        std::memcpy(out + 64 * v, &word, 4);
      }
      for (size_t h2 = 0; h2 < 2; ++h2) {
        uint32_t word = 0;
        for (size_t j = 0; j < 4; ++j) word |= ((load_u32(qh + 16 * h2 + 4 * j) >> (2 * g)) & 0x03030303u) << (2 * j);
        std::memcpy(out + 256 + 64 * h2, &word, 4);
      }
    }
  }
}

// Q2_K and Q3_K keep the low 2 bits of element e = 128h + 32c + l in bits 2c..2c+1 of
// qs[32h + l]; packed, crumb vector s (sub-block s) byte (r, i) gathers elements 16s +
// 4j + i, j = 0..3, at bits 2j: the same 2-bit field of file bytes l0 + 4j (l0 = 16(s %
// 2) + i), so 32-bit words of file bytes give all four i at once. Chunk P's two crumb
// vectors start at chunks + P * stride.
void put_crumbs(uint8_t* chunks, size_t stride, size_t r, const uint8_t* file_qs) {
  for (size_t s = 0; s < 16; ++s) {
    const uint8_t* q = file_qs + 32 * (s / 8) + 16 * (s % 2);
    const int shift = int(2 * (s / 2 % 4));
    uint32_t out = 0;
    for (int j = 0; j < 4; ++j) out |= ((load_u32(q + 4 * j) >> shift) & 0x03030303u) << (2 * j);
    std::memcpy(chunks + stride * (s / 2) + 64 * (s % 2) + 4 * r, &out, 4);
  }
}

void pack_q3_k_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::Q3_K));
  int8_t* scpair = reinterpret_cast<int8_t*>(rec + 32);
  uint64_t hmask[64] = {};
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_q3_K>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    for (size_t j = 0; j < 16; ++j) {
      const int low4 = j < 8 ? b->scales[j] & 15 : b->scales[j - 8] >> 4;
      const int high2 = (b->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      scpair[32 * (j / 2) + 2 * r + (j % 2)] = int8_t((low4 | high2 << 4) - 32);
    }
    put_crumbs(rec + 288, 192, r, b->qs);
    // element 32P + 4u + i has its high bit at bit P of hmask[4u + i]
    for (int P = 0; P < 8; ++P)
      for (size_t u = 0; u < 8; ++u) hmask[8 * P + u] |= bit_nibble(b->hmask + 4 * u, P) << (4 * r);
  }
  for (size_t P = 0; P < 8; ++P) std::memcpy(rec + 288 + 192 * P + 128, hmask + 8 * P, 64);
}

// IQ4_XS: the file's 16 bytes of sub-block b already pair elements j and j + 16 by
// nibble, so each lane takes 4 consecutive bytes; the 6-bit scales widen to bytes.
void pack_iq4_xs_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::IQ4_XS));
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_iq4_xs>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    for (size_t sub = 0; sub < 8; ++sub) {
      const int low = (b->scales_l[sub / 2] >> (4 * (sub % 2))) & 15, high = (b->scales_h >> (2 * sub)) & 3;
      rec[32 + 16 * sub + r] = uint8_t(int8_t((low | high << 4) - 32));
      for (size_t v = 0; v < 4; ++v) std::memcpy(rec + 160 + 256 * sub + 64 * v + 4 * r, b->qs + 16 * sub + 4 * v, 4);
    }
  }
}

void pack_q2_k_record(const void* src, size_t row_bytes, size_t row0, size_t n, size_t blk, uint8_t* rec) {
  if (n < G) std::memset(rec, 0, record_bytes(TensorType::Q2_K));
  for (size_t r = 0; r < n; ++r) {
    const auto* b = block_at<block_q2_K>(src, row_bytes, row0 + r, blk);
    put_fp16(rec, r, b->d);
    put_fp16(rec + 32, r, b->dmin);
    for (size_t j = 0; j < 16; ++j) rec[64 + 32 * (j / 2) + 2 * r + (j % 2)] = b->scales[j];
    put_crumbs(rec + 320, 128, r, b->qs);
  }
}

}  // namespace

// Float records: column-major within a group, row r's element j at record j, slot r (BF16:
// record j / 2, slot r's pair, subnormals as the signed zeros the dot product reads them
// as; kernels/bf16_dot.h); rows past the end of the tensor are zero in its last group.
// Columns go 64 at a time so that a group's 16 source rows and the records they fill stay
// in L1.
template <TensorType T>
void pack_float_rows(const void* src, size_t src_row_bytes, size_t rows, size_t k, size_t r0, size_t r1, void* dst) {
  using Elem = std::conditional_t<T == TensorType::F32, uint32_t, uint16_t>;
  constexpr size_t E = record_elements(T);
  const size_t gbytes = k * G * sizeof(Elem);
  const auto slot = [](size_t j, size_t r) { return j / E * E * G + E * r + j % E; };
  for (size_t g0 = r0; g0 < r1; g0 += G) {
    Elem* group = reinterpret_cast<Elem*>(static_cast<uint8_t*>(dst) + g0 / G * gbytes);
    const size_t n = g0 + G <= rows ? G : rows - g0;
    for (size_t j0 = 0; j0 < k; j0 += 64) {
      const size_t j1 = j0 + 64 < k ? j0 + 64 : k;
      for (size_t r = 0; r < G; ++r) {
        if (r >= n) {
          for (size_t j = j0; j < j1; ++j) group[slot(j, r)] = 0;
          continue;
        }
        const Elem* row = reinterpret_cast<const Elem*>(static_cast<const uint8_t*>(src) + (g0 + r) * src_row_bytes);
        for (size_t j = j0; j < j1; ++j)
          group[slot(j, r)] = T == TensorType::BF16 ? bf16_dot::flush_subnormal(uint16_t(row[j])) : row[j];
      }
    }
  }
}

void pack_rows(TensorType t, const void* src, size_t src_row_bytes, size_t rows, size_t k, size_t r0, size_t r1,
               void* dst) {
  if (!record_bytes(t)) throw Error(std::string("no packed layout for ") + type_name(t));
  if (r0 % G != 0 || k % record_elements(t) != 0) throw Error("pack_rows: misaligned rows or k");
  const size_t n_records = k / record_elements(t), gbytes = group_bytes(t, k);
  r1 = r1 < rows ? r1 : rows;
  if (is_float_type(t)) {
    if (t == TensorType::F32) return pack_float_rows<TensorType::F32>(src, src_row_bytes, rows, k, r0, r1, dst);
    if (t == TensorType::BF16) return pack_float_rows<TensorType::BF16>(src, src_row_bytes, rows, k, r0, r1, dst);
    return pack_float_rows<TensorType::F16>(src, src_row_bytes, rows, k, r0, r1, dst);
  }
  for (size_t g0 = r0; g0 < r1; g0 += G) {
    const size_t n = (g0 + G <= rows ? G : rows - g0);
    uint8_t* group = static_cast<uint8_t*>(dst) + g0 / G * gbytes;
    for (size_t blk = 0; blk < n_records; ++blk) {
      uint8_t* rec = group + blk * record_bytes(t);
      if (t == TensorType::Q4_0 || t == TensorType::IQ4_NL) {  // the same block layout
        static_assert(sizeof(block_iq4_nl) == sizeof(block_q4_0));
        pack_q4_0_record(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q8_0) {
        pack_q8_0_record(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q4_K) {
        pack_k4_record<block_q4_K>(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q5_K) {
        pack_k4_record<block_q5_K>(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q3_K) {
        pack_q3_k_record(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q2_K) {
        pack_q2_k_record(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::IQ4_XS) {
        pack_iq4_xs_record(src, src_row_bytes, g0, n, blk, rec);
      } else if (t == TensorType::Q6_K) {
        pack_q6_k_record(src, src_row_bytes, g0, n, blk, rec);
      } else {
        Legacy lr[G];
        for (size_t r = 0; r < n; ++r) lr[r] = decode_legacy(t, src, src_row_bytes, g0 + r, blk);
        pack_legacy_record(t, lr, n, rec);
      }
    }
  }
}

}  // namespace kiln::kernels::packed

namespace kiln::kernels {
void pack_weights(TensorType type, const void* src, size_t src_row_bytes, size_t rows, size_t k, size_t r0,
                  size_t r1, void* dst) {
  packed::pack_rows(type, src, src_row_bytes, rows, k, r0, r1, dst);
}
}  // namespace kiln::kernels
