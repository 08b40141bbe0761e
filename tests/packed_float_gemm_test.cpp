// Float weights (F32, F16, BF16) in the packed layout (kernels/packed.h), for the tables
// that pack them: values against float64, the file layout's answer, and the batch
// contract (an output's bits do not depend on the batch around it, on which rows a call
// covers, or on the tile that computed it: decode equals batch).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16_dot.h"
#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kiln/tensor_type.h"
#ifdef KILN_HAVE_AVX512BF16
#include "kernels/x86/avx512bf16/gemm_bf16.h"
#endif

namespace kiln::kernels {
namespace {

size_t elem_bytes(TensorType t) { return t == TensorType::F32 ? 4 : 2; }

// Random weights stored in type t, and the float values they hold.
void random_weights(TensorType t, size_t n, std::mt19937& rng, std::vector<uint8_t>& stored, std::vector<float>& values) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  stored.resize(n * elem_bytes(t));
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (t == TensorType::F32) {
      std::memcpy(&stored[4 * i], &v, 4), values[i] = v;
    } else {
      const uint16_t h = t == TensorType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
      std::memcpy(&stored[2 * i], &h, 2);
      values[i] = t == TensorType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
    }
  }
}

struct Packed {
  std::vector<uint8_t> bytes;
  void* at() { return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64; }
};

TEST(PackedFloatGemm, MatchesFloat64TheFileLayoutAndTheBatchContract) {
  std::mt19937 rng(31);
  int tables_packing = 0;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
      // Rows: one, under a group, groups plus a remainder, more than a decode tile.
      // Widths: awkward ones (no vector multiple) and a model-like one.
      for (size_t rows : {size_t{1}, size_t{17}, size_t{40}, size_t{70}}) {
        for (size_t k : {size_t{1}, size_t{7}, size_t{64}, size_t{300}}) {
          const size_t packed_size = o.packed_bytes(t, rows, k);
          if (!packed_size) continue;
          tables_packing += t == TensorType::F16 && rows == 1 && k == 1;
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(t) + " rows=" + std::to_string(rows) +
                       " k=" + std::to_string(k));
          std::vector<uint8_t> file;
          std::vector<float> w;
          random_weights(t, rows * k, rng, file, w);
          const size_t row_bytes = k * elem_bytes(t);
          Packed p{std::vector<uint8_t>(packed_size + 64, 0xcd)};  // garbage where packing must write
          // In two slices, as the loader's threads do.
          const size_t half = rows / 2 / 16 * 16;
          pack_weights(t, file.data(), row_bytes, rows, k, 0, half, p.at());
          pack_weights(t, file.data(), row_bytes, rows, k, half, rows, p.at());

          const size_t n_batch = 29;  // whole prefill tiles and a remainder
          std::vector<float> x(n_batch * k);
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          for (float& v : x) v = dist(rng);
          std::vector<float> y(n_batch * rows, NAN), file_y(n_batch * rows, NAN);
          o.gemm({t, p.at(), row_bytes, x.data(), k, y.data(), rows, k, n_batch, 0, rows, true});
          o.gemm({t, file.data(), row_bytes, x.data(), k, file_y.data(), rows, k, n_batch, 0, rows});
          // Packed BF16 reads the activations rounded to bf16 (kernels/bf16_dot.h).
          std::vector<float> x_read = x;
          if (t == TensorType::BF16)
            for (float& v : x_read) v = bf16_to_f32(f32_to_bf16(v));
          for (size_t b = 0; b < n_batch; ++b)
            for (size_t r = 0; r < rows; ++r) {
              double want = 0, want_read = 0, magnitude = 0;
              for (size_t i = 0; i < k; ++i) {
                want += double(w[r * k + i]) * x[b * k + i], magnitude += std::fabs(double(w[r * k + i]) * x[b * k + i]);
                want_read += double(w[r * k + i]) * x_read[b * k + i];
              }
              // One f32 FMA chain over k: each step rounds once.
              const double bound = 1.2e-7 * double(k) * magnitude + 1e-30;
              ASSERT_NEAR(y[b * rows + r], want_read, bound) << "b=" << b << " r=" << r;
              ASSERT_NEAR(file_y[b * rows + r], want, bound) << "b=" << b << " r=" << r;
            }
          // Each activation row alone (decode), small batches, and row ranges split at a
          // group boundary give the bits of the batch of 29.
          for (size_t nb : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{12}}) {
            for (size_t b0 = 0; b0 + nb <= n_batch; b0 += 7) {
              std::vector<float> part(nb * rows, NAN);
              o.gemm({t, p.at(), row_bytes, &x[b0 * k], k, part.data(), rows, k, nb, 0, rows, true});
              for (size_t b = 0; b < nb; ++b)
                for (size_t r = 0; r < rows; ++r)
                  ASSERT_EQ(std::bit_cast<uint32_t>(part[b * rows + r]), std::bit_cast<uint32_t>(y[(b0 + b) * rows + r]))
                      << "nb=" << nb << " b=" << b0 + b << " r=" << r;
            }
          }
          if (rows > 16) {
            std::vector<float> split(n_batch * rows, NAN);
            o.gemm({t, p.at(), row_bytes, x.data(), k, split.data(), rows, k, n_batch, 0, 16, true});
            o.gemm({t, p.at(), row_bytes, x.data(), k, split.data(), rows, k, n_batch, 16, rows, true});
            for (size_t i = 0; i < split.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(split[i]), std::bit_cast<uint32_t>(y[i])) << i;
          }
        }
      }
    }
  }
  // This machine's AVX-512 table packs floats; other CPUs may have no table that does.
  if (ops_for(Isa::avx512)) {
    EXPECT_GT(tables_packing, 0);
  }
}


// Packed BF16 on every table that packs it, with vdpbf16ps where this CPU has it and with
// two FMAs a pair otherwise, gives bf16_dot::reference_gemm's bits: subnormal weights and
// activations read as zero, the odd element of each pair before the even one, batch rows
// prepared or converted by the gemm itself.
TEST(PackedBf16Gemm, SameBitsAsTheReferenceWithAndWithoutTheDotInstruction) {
  std::mt19937 rng(53);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Mostly model-like values, some zeros and subnormals (no product or partial sum falls
  // below 2^-126, where the FMA pairs may differ: DotInstructionReadsBitsAsTheReference).
  const auto value = [&](int i) {
    switch (i % 29) {
      case 3: return 0.0f;
      case 7: return -1e-39f;
      case 11: return 3e-39f;
      default: return dist(rng);
    }
  };
  std::vector<bool> dot_modes{false};
#ifdef KILN_HAVE_AVX512BF16
  const bool instruction = avx512bf16::g_enabled;
  if (instruction) dot_modes.push_back(true);
#endif
  int checked = 0;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t rows : {size_t{1}, size_t{17}, size_t{40}, size_t{70}}) {
      for (size_t k : {size_t{2}, size_t{64}, size_t{300}, size_t{2050}}) {
        const size_t packed_size = o.packed_bytes(TensorType::BF16, rows, k);
        if (!packed_size) continue;
        std::vector<uint16_t> file(rows * k);
        for (size_t i = 0; i < file.size(); ++i) file[i] = f32_to_bf16(0.05f * value(int(i)));
        Packed p{std::vector<uint8_t>(packed_size + 64, 0xcd)};
        pack_weights(TensorType::BF16, file.data(), k * 2, rows, k, 0, rows, p.at());
        const size_t n_batch = 29, ldy = rows + 3;
        std::vector<float> x(n_batch * k);
        for (size_t i = 0; i < x.size(); ++i) x[i] = value(int(i * 7 + 1));
        std::vector<float> want(n_batch * ldy, NAN);
        bf16_dot::reference_gemm({TensorType::BF16, p.at(), 0, x.data(), k, want.data(), ldy, k, n_batch, 0, rows, true});
        for (bool dot : dot_modes) {
#ifdef KILN_HAVE_AVX512BF16
          avx512bf16::g_enabled = dot;
#endif
          // Prepared as this mode reads them (bf16 for the instruction, floats for FMAs).
          std::vector<uint8_t> prepared(o.prepared_bytes(TensorType::BF16, k, n_batch) + 64);
          if (o.prepared_bytes(TensorType::BF16, k, n_batch)) o.prepare(TensorType::BF16, x.data(), k, k, 0, n_batch, prepared.data());
          SCOPED_TRACE(std::string(isa_name(isa)) + (dot ? " vdpbf16ps" : " FMA pairs") + " rows=" + std::to_string(rows) +
                       " k=" + std::to_string(k));
          for (bool use_prepared : {false, true}) {
            if (use_prepared && !o.prepared_bytes(TensorType::BF16, k, n_batch)) continue;
            for (size_t nb : {size_t{1}, size_t{3}, n_batch}) {
              std::vector<float> got(n_batch * ldy, NAN);
              GemmArgs a{TensorType::BF16, p.at(), 0, x.data(), k, got.data(), ldy, k, nb, 0, rows, true};
              if (use_prepared) a.x_prepared = prepared.data();
              o.gemm(a);
              for (size_t b = 0; b < nb; ++b)
                for (size_t r = 0; r < rows; ++r)
                  ASSERT_EQ(std::bit_cast<uint32_t>(got[b * ldy + r]), std::bit_cast<uint32_t>(want[b * ldy + r]))
                      << "nb=" << nb << " b=" << b << " r=" << r << " prepared=" << use_prepared;
              ++checked;
            }
          }
        }
#ifdef KILN_HAVE_AVX512BF16
        avx512bf16::g_enabled = instruction;
#endif
      }
    }
  }
  EXPECT_GT(checked, 0);
}

#ifdef KILN_HAVE_AVX512BF16
// The reference against the instruction it describes, on any bits (NaN and infinity
// aside): subnormals in and out, products and partial sums near 2^-126, signed zeros.
TEST(PackedBf16Gemm, DotInstructionReadsBitsAsTheReference) {
  if (!avx512bf16::g_enabled) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  std::mt19937 rng(59);
  const auto finite_bits = [&](int max_exponent) {
    for (;;) {
      const uint16_t h = uint16_t(rng());
      if (((h >> 7) & 0xff) <= max_exponent) return h;
    }
  };
  const size_t rows = 32, k = 64, n_batch = 9;
  const Ops& o = *ops_for(Isa::avx512);
  for (int max_exponent : {4, 70, 140}) {  // tiny, small, and around 1
    std::vector<uint16_t> file(rows * k);
    for (uint16_t& h : file) h = finite_bits(max_exponent);
    Packed p{std::vector<uint8_t>(o.packed_bytes(TensorType::BF16, rows, k) + 64)};
    pack_weights(TensorType::BF16, file.data(), k * 2, rows, k, 0, rows, p.at());
    std::vector<float> x(n_batch * k);
    for (float& v : x) v = bf16_to_f32(finite_bits(max_exponent + 1));
    std::vector<float> want(n_batch * rows), got(n_batch * rows);
    bf16_dot::reference_gemm({TensorType::BF16, p.at(), 0, x.data(), k, want.data(), rows, k, n_batch, 0, rows, true});
    o.gemm({TensorType::BF16, p.at(), 0, x.data(), k, got.data(), rows, k, n_batch, 0, rows, true});
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "exponents <= " << max_exponent << " i=" << i;
  }
}
#endif

// Ops::gemm_packed_dots (attention's Q K^T over packed keys) gives, bit for bit, what the
// same table's gemm gives for the rows in the file layout, whatever the table packs:
// strided activations and outputs, partial groups, activation rows past a multiple of 4,
// k under, at and past a vector and the head dimensions it unrolls (64, 128), row ranges
// from a group boundary, rows in passes of four, two and one vector.
TEST(GemmPackedDots, SameBitsAsTheFileLayoutGemm) {
  std::mt19937 rng(47);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (size_t rows : {size_t{1}, size_t{17}, size_t{40}, size_t{70}, size_t{100}}) {
      for (size_t k : {size_t{1}, size_t{7}, size_t{8}, size_t{64}, size_t{80}, size_t{100}, size_t{128}}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " rows=" + std::to_string(rows) + " k=" + std::to_string(k));
        std::vector<float> w(rows * k);
        for (float& v : w) v = dist(rng);
        Packed p{std::vector<uint8_t>((rows + 15) / 16 * 16 * k * 4 + 64, 0xcd)};
        pack_weights(TensorType::F32, w.data(), k * 4, rows, k, 0, rows, p.at());
        for (size_t n_batch : {size_t{1}, size_t{3}, size_t{8}, size_t{13}, size_t{29}}) {
          const size_t ldx = k + 3, ldy = rows + 5;
          std::vector<float> x(n_batch * ldx);
          for (float& v : x) v = dist(rng);
          for (size_t r0 : {size_t{0}, size_t{16}}) {
            if (r0 >= rows) continue;
            std::vector<float> got(n_batch * ldy, NAN), want(n_batch * ldy, NAN);
            o.gemm_packed_dots({TensorType::F32, p.at(), 0, x.data(), ldx, got.data(), ldy, k, n_batch, r0, rows, true});
            o.gemm({TensorType::F32, w.data(), k * 4, x.data(), ldx, want.data(), ldy, k, n_batch, r0, rows});
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "n_batch=" << n_batch << " r0=" << r0 << " b=" << i / ldy << " r=" << i % ldy;
          }
        }
      }
    }
  }
}

// GemmArgs::w_group_bytes: a gemm over the first k columns of a matrix packed with K > k
// (attention's P V over the keys a block of queries sees) gives the bits of the same gemm
// on those k columns packed alone, on every table and float type it packs: partial
// groups, batches of one (decode tiles) to past a prefill tile, a row range from a group
// boundary. Without the field the gemm reads the wrong records (groups K records apart
// taken as k apart).
TEST(PackedFloatGemm, FirstColumnsOfAWiderPackedMatrix) {
  std::mt19937 rng(53);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  int checked = 0;
  for (Isa isa : available_isas()) {
    const Ops& o = *ops_for(isa);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
      const size_t K = 300;
      for (size_t rows : {size_t{20}, size_t{64}, size_t{70}}) {
        if (!o.packed_bytes(t, rows, K)) continue;
        std::vector<uint8_t> wide;
        std::vector<float> values;
        random_weights(t, rows * K, rng, wide, values);
        const auto pack = [&](const uint8_t* src, size_t k) {
          Packed p{std::vector<uint8_t>(o.packed_bytes(t, rows, k) + 64)};
          pack_weights(t, src, k * elem_bytes(t), rows, k, 0, rows, p.at());
          return p;
        };
        Packed whole = pack(wide.data(), K);
        for (size_t k : {size_t{2}, size_t{34}, size_t{64}, size_t{200}}) {
          std::vector<uint8_t> narrow(rows * k * elem_bytes(t));
          for (size_t r = 0; r < rows; ++r)
            std::memcpy(&narrow[r * k * elem_bytes(t)], &wide[r * K * elem_bytes(t)], k * elem_bytes(t));
          Packed alone = pack(narrow.data(), k);
          for (size_t n_batch : {size_t{1}, size_t{3}, size_t{13}}) {
            const size_t ldx = k + 3, ldy = rows + 5;
            std::vector<float> x(n_batch * ldx);
            for (float& v : x) v = dist(rng);
            for (size_t r0 : {size_t{0}, size_t{16}}) {
              SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(t) + " rows=" + std::to_string(rows) +
                           " k=" + std::to_string(k) + " n_batch=" + std::to_string(n_batch) + " r0=" + std::to_string(r0));
              std::vector<float> got(n_batch * ldy, NAN), want(n_batch * ldy, NAN);
              GemmArgs a{t, whole.at(), 0, x.data(), ldx, got.data(), ldy, k, n_batch, r0, rows, true};
              a.w_group_bytes = o.packed_bytes(t, 16, K);
              o.gemm(a);
              o.gemm({t, alone.at(), 0, x.data(), ldx, want.data(), ldy, k, n_batch, r0, rows, true});
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                    << "b=" << i / ldy << " r=" << i % ldy;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0) << "no table packs float weights";
}

// Ops::gemm_chain on file-layout F32, F16 and BF16 weights gives, on every table, the
// scalar reference's bits (each output std::fma over k in order from +0), and, where the
// table packs F32, the packed F32 gemm's bits for the same values: what lets attention's
// decode match a prefill that packed its keys and values. Activation rows past a vector
// (lanes), k past a pass (256), rows from any r0, strided activations and outputs.
TEST(GemmChain, ReferenceBitsAndThePackedF32Gemms) {
  std::mt19937 rng(59);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const Ops& ref = *ops_for(Isa::scalar);
  int against_packed = 0;
  for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
    for (size_t rows : {size_t{1}, size_t{9}, size_t{70}}) {
      for (size_t k : {size_t{1}, size_t{7}, size_t{64}, size_t{300}}) {
        std::vector<uint8_t> stored;
        std::vector<float> values;
        random_weights(t, rows * k, rng, stored, values);
        Packed as_f32{std::vector<uint8_t>(packed::tensor_bytes(TensorType::F32, rows, k) + 64)};
        pack_weights(TensorType::F32, values.data(), k * 4, rows, k, 0, rows, as_f32.at());
        for (size_t n_batch : {size_t{1}, size_t{3}, size_t{8}, size_t{17}}) {
          const size_t ldx = k + 3, ldy = rows + 5;
          std::vector<float> x(n_batch * ldx);
          for (float& v : x) v = dist(rng);
          for (size_t r0 : {size_t{0}, rows / 2}) {
            const GemmArgs base{t, stored.data(), k * elem_bytes(t), x.data(), ldx, nullptr, ldy, k, n_batch, r0, rows};
            std::vector<float> want(n_batch * ldy, NAN);
            GemmArgs a = base;
            a.y = want.data();
            ref.gemm_chain(a);
            for (Isa isa : available_isas()) {
              const Ops& o = *ops_for(isa);
              SCOPED_TRACE(std::string(isa_name(isa)) + " " + type_name(t) + " rows=" + std::to_string(rows) +
                           " k=" + std::to_string(k) + " n_batch=" + std::to_string(n_batch) + " r0=" + std::to_string(r0));
              std::vector<float> got(n_batch * ldy, NAN);
              a.y = got.data();
              o.gemm_chain(a);
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                    << "b=" << i / ldy << " r=" << i % ldy;
              if (r0 % 16 || !o.packed_bytes(TensorType::F32, rows, k)) continue;
              std::vector<float> packed_y(n_batch * ldy, NAN);
              o.gemm({TensorType::F32, as_f32.at(), 0, x.data(), ldx, packed_y.data(), ldy, k, n_batch, r0, rows, true});
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(packed_y[i]), std::bit_cast<uint32_t>(want[i]))
                    << "packed F32 gemm b=" << i / ldy << " r=" << i % ldy;
              ++against_packed;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(against_packed, 0) << "no table packs F32 weights";
}

}  // namespace
}  // namespace kiln::kernels
