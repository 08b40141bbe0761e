// The scalar reference of ggml's quantized formats (kernels/quant.h):
//  * round trips of the quantizers within error bounds derived from each format (legacy),
//    or measured relative-RMSE bounds (K-quants, whose quantizers search for scales);
//  * exact special cases (zeros, spikes, values on the grid, one sign only);
//  * dequantization of blocks packed here by hand from the layout description, so every
//    scale/min packing is checked independently of the code's own unpacking;
//  * bit-exact agreement with ggml on a fixture llama.cpp wrote (tests/data/quant), for
//    ordinary rows and for rows that take the quantizers' special paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "test_util.h"

namespace kiln::kernels {
namespace {

using ref::dequantize_row;
using ref::quantize_row;

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The value a float scale has once stored as fp16.
float as_fp16(float x) { return fp16_to_f32(f32_to_fp16(x)); }

const TensorType kLegacy[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                              TensorType::Q5_1, TensorType::Q8_0};
const TensorType kQuantizable[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                                   TensorType::Q5_1, TensorType::Q8_0, TensorType::Q8_K};
// The file formats of llama-quantize's K presets (their quantizers search for scales, so
// their round-trip bounds are statistical: see QuantKRoundTrip).
const TensorType kKQuants[] = {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K,
                               TensorType::Q5_K, TensorType::Q6_K};

size_t block_size(TensorType t) { return ref::quant_traits(t)->block_size; }
size_t row_bytes(TensorType t, size_t n) {
  return n / block_size(t) * ref::quant_traits(t)->block_bytes;
}

std::vector<float> round_trip(TensorType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, x.size()));
  quantize_row(t, x.data(), q.data(), x.size());
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), x.size());
  return y;
}

// ---------------------------------------------------------------- traits

TEST(QuantTraits, AgreeWithTheGgufTypeTable) {
  size_t count = 0;
  for (auto* t = ref::quant_traits_begin(); t != ref::quant_traits_end(); ++t, ++count) {
    const TypeInfo& info = type_info(t->type);
    EXPECT_STREQ(t->name, info.name);
    EXPECT_EQ(t->block_size, info.block_size) << t->name;
    EXPECT_EQ(t->block_bytes, info.block_bytes) << t->name;
    EXPECT_TRUE(t->can_dequantize) << t->name;
    EXPECT_EQ(ref::quant_traits(t->type), t);
  }
  EXPECT_EQ(count, 23u);  // 12 + the 11 i-quant and ternary types
  for (TensorType t : kQuantizable) EXPECT_TRUE(ref::quant_traits(t)->can_quantize);
  for (TensorType t : kKQuants) EXPECT_TRUE(ref::quant_traits(t)->can_quantize);
  EXPECT_EQ(ref::quant_traits(TensorType::F16), nullptr);
}

TEST(QuantTraits, RejectsWhatItCannotDo) {
  float f[256] = {};
  uint8_t b[512] = {};
  EXPECT_THROW(dequantize_row(TensorType::F32, b, f, 32), Error);
  EXPECT_THROW(dequantize_row(TensorType::Q8_1, b, f, 256), Error);
  EXPECT_THROW(quantize_row(TensorType::Q8_1, f, b, 256), Error);
  EXPECT_THROW(quantize_row(TensorType::F16, f, b, 256), Error);
  EXPECT_THROW(quantize_row(TensorType::Q4_K, f, b, 128), Error);  // half a super-block
  EXPECT_NO_THROW(quantize_row(TensorType::Q4_K, f, b, 256));
  EXPECT_THROW(quantize_row(TensorType::Q8_0, f, b, 48), Error);  // not whole blocks
  EXPECT_THROW(dequantize_row(TensorType::Q6_K, b, f, 128), Error);
  EXPECT_NO_THROW(dequantize_row(TensorType::Q6_K, b, f, 256));
}

// ---------------------------------------------------------------- round trip bounds

// The largest |x - dequantize(quantize(x))| the format allows for element j of a block, as
// (step error) + |q|max * (error of storing the scale as fp16) + (error of storing the min)
// + float slop. Float slop: x * (1/d) is off from x/d by a few ulps of at most 127, i.e.
// < 1e-4 of a step, and the final q*d (+ m) rounds twice by 6e-8 of values up to 2*range.
struct Bound {
  std::vector<float> per_element;
};

Bound bound_for(TensorType t, const float* x) {
  const size_t n = block_size(t);
  float amax = 0, maxm = 0, mn = x[0], mx = x[0];
  for (size_t j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), maxm = x[j];
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const float range = std::max(std::fabs(mn), std::fabs(mx));
  Bound b;
  b.per_element.resize(n);
  for (size_t j = 0; j < n; ++j) {
    double e = 0;
    switch (t) {
      case TensorType::Q8_0: {
        // d = amax/127, q = round(x/d) in -127..127: half a step, and q can be 127.
        const double d = amax / 127.0f;
        e = d / 2 + 127 * std::fabs(d - as_fp16(float(d))) + 1e-4 * d;
        break;
      }
      case TensorType::Q4_0:
      case TensorType::Q5_0: {
        // d = (value of largest magnitude) / -8 (-16): the grid is -8..7 (-16..15) steps of
        // d, so values with x/d in (7.5, 8] ((15.5, 16]) clamp to 7 (15) and can be off by
        // up to a whole step; everything else is within half a step.
        const double half = t == TensorType::Q4_0 ? 8 : 16;
        const double d = maxm / -half;
        const double steps = d != 0 ? x[j] / d : 0;
        e = std::fabs(d) * std::max(0.5, steps - (half - 1)) +
            half * std::fabs(d - as_fp16(float(d))) + 1e-4 * std::fabs(d);
        break;
      }
      case TensorType::Q4_1:
      case TensorType::Q5_1: {
        // d = (max - min)/15 (31), q = round((x - min)/d) in 0..15 (0..31), x ~ q*d + min:
        // half a step, plus the fp16 errors of d (times the largest q) and of min.
        const double qmax = t == TensorType::Q4_1 ? 15 : 31;
        const double d = (mx - mn) / float(qmax);
        e = d / 2 + qmax * std::fabs(d - as_fp16(float(d))) + std::fabs(mn - as_fp16(mn)) +
            1e-4 * d;
        break;
      }
      case TensorType::Q8_K: {
        // d = max/-127 kept in float: half a step and nothing else.
        const double d = maxm / -127.0;
        e = std::fabs(d) / 2 + 1e-4 * std::fabs(d);
        break;
      }
      default:
        ADD_FAILURE() << "no bound for " << type_name(t);
    }
    b.per_element[j] = float(e + 4e-7 * range);
  }
  return b;
}

enum class Dist { uniform, normal, outliers, positive, negative, tiny, mixed_scales };
const char* dist_name(Dist d) {
  const char* names[] = {"uniform", "normal", "outliers", "positive", "negative", "tiny",
                         "mixed_scales"};
  return names[int(d)];
}

std::vector<float> sample(Dist dist, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dist) {
      case Dist::uniform: x[i] = u(rng); break;
      case Dist::normal: x[i] = g(rng); break;
      case Dist::outliers: x[i] = g(rng) * (rng() % 50 == 0 ? 100.0f : 1.0f); break;
      case Dist::positive: x[i] = 0.5f + std::fabs(u(rng)) * 1.5f; break;
      case Dist::negative: x[i] = -0.01f - std::fabs(g(rng)); break;
      // Scales below fp16's normal range: d is stored as a subnormal half.
      case Dist::tiny: x[i] = u(rng) * 1e-3f; break;
      case Dist::mixed_scales: x[i] = u(rng) * std::pow(10.0f, float(int(i / 32 % 7) - 3)); break;
    }
  }
  return x;
}

TEST(QuantRoundTrip, WithinTheFormatBound) {
  std::mt19937 rng(1234);
  for (TensorType t : kQuantizable) {
    const size_t bs = block_size(t);
    for (size_t blocks : {1, 2, 3, 7, 33}) {
      for (Dist dist : {Dist::uniform, Dist::normal, Dist::outliers, Dist::positive,
                        Dist::negative, Dist::tiny, Dist::mixed_scales}) {
        const size_t n = blocks * bs;
        const auto x = sample(dist, n, rng);
        const auto y = round_trip(t, x);
        double worst = 0;  // largest error as a fraction of its bound
        for (size_t b = 0; b < blocks; ++b) {
          const Bound bound = bound_for(t, &x[b * bs]);
          for (size_t j = 0; j < bs; ++j) {
            const size_t i = b * bs + j;
            const double err = std::fabs(double(x[i]) - y[i]);
            worst = std::max(worst, err / bound.per_element[j]);
            ASSERT_LE(err, bound.per_element[j])
                << type_name(t) << " " << dist_name(dist) << " n=" << n << " i=" << i
                << " x=" << x[i] << " y=" << y[i];
          }
        }
        // The bound must be tight enough to mean something: random data gets close to it.
        if (blocks >= 7) {
          EXPECT_GT(worst, 0.5) << type_name(t) << " " << dist_name(dist);
        }
      }
    }
  }
}

// The K-quant quantizers search for their scales, so there is no per-element formula to
// check against; their bound is statistical instead: the relative RMSE
// sqrt(sum (x - y)^2 / sum x^2) over 64 super-blocks of each distribution. The bounds are
// the largest value measured over these distributions and five seeds, plus 10%. Measured
// on normal data (what weights look like), ggml's and kiln's identical quantizers give
// Q2_K 0.30, Q3_K 0.15, Q4_K 0.072, Q5_K 0.036, Q6_K 0.018: about one halving per bit.
// "tiny" and "outliers" are the worst cases of Q5_K/Q6_K (fp16 scales lose precision below
// 6e-5, and an outlier coarsens its whole sub-block).
struct KBound {
  TensorType type;
  double relative_rmse;
};
constexpr KBound kKBounds[] = {{TensorType::Q2_K, 0.33},
                               {TensorType::Q3_K, 0.167},
                               {TensorType::Q4_K, 0.079},
                               {TensorType::Q5_K, 0.048},
                               {TensorType::Q6_K, 0.029}};

double relative_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, energy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    energy += double(x[i]) * x[i];
  }
  return std::sqrt(err / energy);
}

TEST(QuantKRoundTrip, RelativeRmseWithinTheMeasuredBound) {
  std::mt19937 rng(2024);
  for (Dist dist : {Dist::uniform, Dist::normal, Dist::outliers, Dist::positive, Dist::negative,
                    Dist::tiny, Dist::mixed_scales}) {
    const auto x = sample(dist, 64 * 256, rng);
    for (const KBound& b : kKBounds) {
      const auto y = round_trip(b.type, x);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << type_name(b.type) << " " << i;
      EXPECT_LE(relative_rmse(x, y), b.relative_rmse) << type_name(b.type) << " " << dist_name(dist);
    }
  }
}

// Each K format has one more bit per value than the one before (2..6) and should roughly
// halve the error: a quantizer that silently fell back to a coarser grid would show here
// even within its bound.
TEST(QuantKRoundTrip, EachExtraBitRoughlyHalvesTheError) {
  std::mt19937 rng(7);
  for (Dist dist : {Dist::uniform, Dist::normal}) {
    const auto x = sample(dist, 64 * 256, rng);
    double previous = 0;
    for (const KBound& b : kKBounds) {
      const double e = relative_rmse(x, round_trip(b.type, x));
      if (previous > 0) {
        EXPECT_GT(previous / e, 1.6) << type_name(b.type) << " " << dist_name(dist);
        EXPECT_LT(previous / e, 2.7) << type_name(b.type) << " " << dist_name(dist);
      }
      previous = e;
    }
  }
}

// An all-zero super-block encodes to all-zero bytes (every scale, min and quant 0) in every
// K format, and decodes to zeros.
TEST(QuantKRoundTrip, ZerosGiveZeroBytes) {
  for (TensorType t : kKQuants) {
    std::vector<float> x(512, 0.0f);
    std::vector<uint8_t> q(row_bytes(t, 512), 0xAB);
    quantize_row(t, x.data(), q.data(), 512);
    for (size_t k = 0; k < q.size(); ++k) ASSERT_EQ(q[k], 0) << type_name(t) << " byte " << k;
    const auto y = round_trip(t, x);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], 0.0f) << type_name(t) << " " << i;
  }
}

TEST(QuantRoundTrip, SymmetricFormatsKeepTheSignOfOneSignedBlocks) {
  std::mt19937 rng(99);
  for (TensorType t : {TensorType::Q4_0, TensorType::Q5_0, TensorType::Q8_0, TensorType::Q8_K}) {
    const auto x = sample(Dist::negative, 4 * block_size(t), rng);
    const auto y = round_trip(t, x);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(y[i], 0.0f) << type_name(t) << " " << i;
  }
}

// ---------------------------------------------------------------- exact cases

TEST(QuantExact, ZerosGiveZerosAndTheZeroPointBytes) {
  for (TensorType t : kQuantizable) {
    const size_t n = 2 * block_size(t);
    std::vector<float> x(n, 0.0f);
    std::vector<uint8_t> q(row_bytes(t, n), 0xAB);
    quantize_row(t, x.data(), q.data(), n);
    std::vector<float> y(n, 1.0f);
    dequantize_row(t, q.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 0.0f) << type_name(t) << " " << i;

    // With d = 0 the quantizers put every value on the zero point: 8 for Q4_0, 16 for
    // Q5_0 (low nibble 0, high bit set), 0 elsewhere. Q4_0/Q5_0 store d = 0 / -8 = -0
    // (fp16 0x8000), as ggml does, so they decode to -0.
    const bool symmetric = t == TensorType::Q4_0 || t == TensorType::Q5_0;
    const size_t bb = ref::quant_traits(t)->block_bytes;
    for (size_t b = 0; b < 2; ++b) {
      const uint8_t* blk = q.data() + b * bb;
      for (size_t k = 0; k < bb; ++k) {
        uint8_t want = 0;
        if (symmetric && k == 1) want = 0x80;
        if (t == TensorType::Q4_0 && k >= 2) want = 0x88;
        if (t == TensorType::Q5_0 && k >= 2 && k < 6) want = 0xFF;  // qh
        ASSERT_EQ(blk[k], want) << type_name(t) << " block " << b << " byte " << k;
      }
    }
  }
}

// One nonzero value per block, chosen so the scale is exact in fp16: the spike comes back
// exactly and every zero stays exactly zero (Q4_1/Q5_1: zero is min or min + 15d/31d).
TEST(QuantExact, SingleSpikeComesBackExactly) {
  struct Case {
    TensorType t;
    float spike;
  };
  const Case cases[] = {{TensorType::Q8_0, 63.5f},   {TensorType::Q8_0, -63.5f},
                        {TensorType::Q4_0, 3.0f},    {TensorType::Q4_0, -3.0f},
                        {TensorType::Q5_0, 4.0f},    {TensorType::Q5_0, -4.0f},
                        {TensorType::Q4_1, 3.75f},   {TensorType::Q4_1, -3.75f},
                        {TensorType::Q5_1, 3.875f},  {TensorType::Q5_1, -3.875f},
                        {TensorType::Q8_K, 127.0f},  {TensorType::Q8_K, -127.0f}};
  for (const Case& c : cases) {
    const size_t bs = block_size(c.t);
    for (size_t pos : {size_t(0), size_t(17), bs - 1}) {
      std::vector<float> x(3 * bs, 0.0f);
      for (size_t b = 0; b < 3; ++b) x[b * bs + pos] = c.spike;
      const auto y = round_trip(c.t, x);
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(y[i], x[i]) << type_name(c.t) << " spike " << c.spike << " at " << pos
                              << ", element " << i;
    }
  }
}

// Blocks whose values all lie on the format's grid (steps of a power of two, the extreme
// on the largest step count) are reproduced exactly, for either sign.
TEST(QuantExact, ValuesOnTheGridComeBackExactly) {
  for (float sign : {-1.0f, 1.0f}) {
    for (TensorType t : kQuantizable) {
      const size_t n = 2 * block_size(t);
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) {
        const size_t j = i % block_size(t);
        switch (t) {
          case TensorType::Q8_0: x[i] = sign * float((j * 4 + 3) % 128) / 32; break;  // d = 1/32
          case TensorType::Q8_K: x[i] = sign * float(j % 128); break;           // d = 1
          case TensorType::Q4_0: x[i] = sign * float(j % 9) / 4; break;         // d = 1/4
          case TensorType::Q5_0: x[i] = sign * float(j % 17) / 2; break;        // d = 1/2
          case TensorType::Q4_1: x[i] = sign * (1 + float(j % 16) / 2); break;  // min +-1|8.5
          case TensorType::Q5_1: x[i] = sign * (2 + float(j % 32) / 4); break;
          default: break;
        }
      }
      const auto y = round_trip(t, x);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(y[i], x[i]) << type_name(t) << " sign " << sign << " element " << i;
    }
  }
}

// Q4_0/Q5_0 put the value of largest magnitude on q = 0; its opposite clamps one step short.
TEST(QuantExact, LargestMagnitudeSetsTheSignOfTheScale) {
  std::vector<float> x(32, 0.0f);
  x[3] = -2.0f;  // largest magnitude: d = -2 / -8 = 0.25
  x[9] = 2.0f;   // +8 steps does not exist: clamps to 7 * 0.25
  block_q4_0 b;
  quantize_row(TensorType::Q4_0, x.data(), &b, 32);
  EXPECT_EQ(fp16_to_f32(b.d), 0.25f);
  EXPECT_EQ(b.qs[3] & 0x0F, 0);
  EXPECT_EQ(b.qs[9] & 0x0F, 15);
  float y[32];
  dequantize_row(TensorType::Q4_0, &b, y, 32);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(y[9], 1.75f);
}

// Exact halves between two quants, with d = 1: ggml's rules differ per format and each
// is kept. Q8_0 rounds half away from zero (roundf), the 4/5-bit formats truncate
// x/d + offset + 0.5 (half up, so -2.5 -> -2), Q8_K rounds half to even (nearest_int).
TEST(QuantExact, TiesRoundAsGgmlDoes) {
  struct Case {
    TensorType t;
    float extreme;  // sets d = 1
    float x;
    float want;
  };
  const Case cases[] = {
      {TensorType::Q8_0, 127, 2.5f, 3},   {TensorType::Q8_0, 127, -2.5f, -3},
      {TensorType::Q8_0, 127, 0.5f, 1},   {TensorType::Q4_0, -8, 2.5f, 3},
      {TensorType::Q4_0, -8, -2.5f, -2},  {TensorType::Q5_0, -16, -0.5f, 0},
      {TensorType::Q5_0, -16, 3.5f, 4},   {TensorType::Q4_1, 15, 2.5f, 3},
      {TensorType::Q5_1, 31, 0.5f, 1},    {TensorType::Q8_K, -127, 2.5f, 2},
      {TensorType::Q8_K, -127, 3.5f, 4},  {TensorType::Q8_K, -127, -2.5f, -2},
  };
  for (const Case& c : cases) {
    const size_t n = block_size(c.t);
    std::vector<float> x(n, 0.0f);
    x[0] = c.extreme;
    x[5] = c.x;
    const auto y = round_trip(c.t, x);
    EXPECT_EQ(y[0], c.extreme) << type_name(c.t);
    EXPECT_EQ(y[5], c.want) << type_name(c.t) << " x " << c.x;
  }
}

TEST(QuantExact, Q8KBlockSumsAndScale) {
  std::mt19937 rng(5);
  const auto x = sample(Dist::normal, 512, rng);
  block_q8_K q[2];
  quantize_row(TensorType::Q8_K, x.data(), q, 512);
  for (const auto& b : q) {
    int extreme = 0;
    for (size_t s = 0; s < 16; ++s) {
      int sum = 0;
      for (size_t j = 0; j < 16; ++j) sum += b.qs[16 * s + j];
      EXPECT_EQ(b.bsums[s], sum);
    }
    for (int8_t v : b.qs) extreme += v == -127;
    EXPECT_GE(extreme, 1);  // the largest magnitude always maps to -127
  }
}

// ---------------------------------------------------------------- hand-built blocks

// Everything below packs bits element by element straight from the layout description in
// kernels/quant.h, with power-of-two scales so the expected floats are exact.
void put_bits(uint8_t* bytes, size_t byte, int shift, int width, int value) {
  bytes[byte] = uint8_t(bytes[byte] & ~(((1 << width) - 1) << shift));
  bytes[byte] = uint8_t(bytes[byte] | (value & ((1 << width) - 1)) << shift);
}
void put_u16(uint8_t* at, uint16_t v) {
  at[0] = uint8_t(v);
  at[1] = uint8_t(v >> 8);
}
void expect_dequantizes_to(TensorType t, const std::vector<uint8_t>& block,
                           const std::vector<float>& want) {
  ASSERT_EQ(block.size(), ref::quant_traits(t)->block_bytes);
  std::vector<float> y(want.size());
  dequantize_row(t, block.data(), y.data(), y.size());
  for (size_t e = 0; e < want.size(); ++e)
    ASSERT_EQ(y[e], want[e]) << type_name(t) << " element " << e;
}

TEST(QuantHandBuilt, LegacyFormats) {
  std::mt19937 rng(7);
  for (TensorType t : kLegacy) {
    const bool five = t == TensorType::Q5_0 || t == TensorType::Q5_1;
    const bool with_min = t == TensorType::Q4_1 || t == TensorType::Q5_1;
    const size_t bytes = ref::quant_traits(t)->block_bytes;
    std::vector<uint8_t> blk(bytes, 0);
    std::vector<float> want(32);
    put_u16(&blk[0], f32_to_fp16(0.5f));      // d
    if (with_min) put_u16(&blk[2], f32_to_fp16(-3.0f));  // m
    const size_t qh_at = with_min ? 4 : 2, qs_at = qh_at + (five ? 4 : 0);
    for (size_t e = 0; e < 32; ++e) {
      if (t == TensorType::Q8_0) {
        const int q = int(rng() % 256) - 128;  // -128 is never written but must decode
        blk[2 + e] = uint8_t(int8_t(q));
        want[e] = q * 0.5f;
        continue;
      }
      const int q = int(rng() % (five ? 32 : 16));
      put_bits(blk.data(), qs_at + e % 16, e < 16 ? 0 : 4, 4, q);
      if (five) put_bits(blk.data(), qh_at + e / 8, int(e % 8), 1, q >> 4);
      const int offset = with_min ? 0 : (five ? 16 : 8);
      want[e] = (q - offset) * 0.5f + (with_min ? -3.0f : 0.0f);
    }
    expect_dequantizes_to(t, blk, want);
  }
}

TEST(QuantHandBuilt, LegacySpotValues) {
  // Q5_0 with d = 0.5: element 0 = nibble 0xF + high bit (qh bit 0) = 31 -> 15 steps;
  // element 16 = high nibble 3 + qh bit 16 = 19 -> 3; element 1 = 0 -> -16; element 31:
  // qh bit 31 only -> 16 -> 0.
  std::vector<uint8_t> q5(22, 0);
  put_u16(&q5[0], 0x3800);
  q5[2] = 0x01, q5[4] = 0x01, q5[5] = 0x80;  // qh = bits 0, 16, 31
  q5[6] = 0x3F;
  std::vector<float> y(32);
  dequantize_row(TensorType::Q5_0, q5.data(), y.data(), 32);
  EXPECT_EQ(y[0], 7.5f);
  EXPECT_EQ(y[16], 1.5f);
  EXPECT_EQ(y[1], -8.0f);
  EXPECT_EQ(y[31], 0.0f);
  EXPECT_EQ(y[15], -8.0f);
}

struct KCase {
  std::vector<uint8_t> block;
  std::vector<float> want;
};

// x = d*sc*q - dmin*m with 4-bit sc/m per 16 values.
KCase build_q2_K(std::mt19937& rng) {
  KCase k{std::vector<uint8_t>(84, 0), std::vector<float>(256)};
  const size_t scales = 0, qs = 16, d_at = 80;
  put_u16(&k.block[d_at], f32_to_fp16(0.5f));
  put_u16(&k.block[d_at + 2], f32_to_fp16(0.125f));
  int sc[16], m[16];
  for (int s = 0; s < 16; ++s) {
    sc[s] = int(rng() % 16), m[s] = int(rng() % 16);
    k.block[scales + s] = uint8_t(sc[s] | m[s] << 4);
  }
  for (size_t e = 0; e < 256; ++e) {
    const int q = int(rng() % 4);
    put_bits(k.block.data(), qs + 32 * (e / 128) + e % 32, int(2 * (e % 128 / 32)), 2, q);
    k.want[e] = 0.5f * sc[e / 16] * q - 0.125f * m[e / 16];
  }
  return k;
}

// x = d*(sc-32)*(q-4*!hbit) with 6-bit sc split into nibbles and 2-bit pairs.
KCase build_q3_K(std::mt19937& rng) {
  KCase k{std::vector<uint8_t>(110, 0), std::vector<float>(256)};
  const size_t hmask = 0, qs = 32, scales = 96, d_at = 108;
  put_u16(&k.block[d_at], f32_to_fp16(0.25f));
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = int(rng() % 64);
    put_bits(k.block.data(), scales + j % 8, j < 8 ? 0 : 4, 4, sc[j] & 15);
    put_bits(k.block.data(), scales + 8 + j % 4, 2 * (j / 4), 2, sc[j] >> 4);
  }
  for (size_t e = 0; e < 256; ++e) {
    const int q = int(rng() % 8) - 4;  // -4..3: high bit set means no -4
    const int stored = q + 4;
    put_bits(k.block.data(), qs + 32 * (e / 128) + e % 32, int(2 * (e % 128 / 32)), 2,
             stored & 3);
    put_bits(k.block.data(), hmask + e % 32, int(e / 32), 1, stored >> 2);
    k.want[e] = 0.25f * (sc[e / 16] - 32) * q;
  }
  return k;
}

// Q4_K/Q5_K scales: 8 six-bit (sc, m) pairs in 12 bytes.
void put_scales_k4(uint8_t* scales, const int* sc, const int* m) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      put_bits(scales, j, 0, 6, sc[j]);
      put_bits(scales, j + 4, 0, 6, m[j]);
    } else {
      put_bits(scales, j + 4, 0, 4, sc[j] & 15);
      put_bits(scales, j + 4, 4, 4, m[j] & 15);
      put_bits(scales, j - 4, 6, 2, sc[j] >> 4);
      put_bits(scales, j, 6, 2, m[j] >> 4);
    }
  }
}

KCase build_q45_K(std::mt19937& rng, bool five) {
  KCase k{std::vector<uint8_t>(five ? 176 : 144, 0), std::vector<float>(256)};
  const size_t scales = 4, qh = 16, qs = five ? 48 : 16;
  put_u16(&k.block[0], f32_to_fp16(0.5f));
  put_u16(&k.block[2], f32_to_fp16(0.25f));
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) sc[j] = int(rng() % 64), m[j] = int(rng() % 64);
  put_scales_k4(&k.block[scales], sc, m);
  for (size_t e = 0; e < 256; ++e) {
    const size_t b = e / 32;
    const int q = int(rng() % (five ? 32 : 16));
    put_bits(k.block.data(), qs + 32 * (b / 2) + e % 32, int(4 * (b % 2)), 4, q & 15);
    if (five) put_bits(k.block.data(), qh + e % 32, int(b), 1, q >> 4);
    k.want[e] = 0.5f * sc[b] * q - 0.25f * m[b];
  }
  return k;
}

// x = d*sc*(q-32), 6-bit q split into ql nibbles and qh pairs, int8 sc per 16.
KCase build_q6_K(std::mt19937& rng) {
  KCase k{std::vector<uint8_t>(210, 0), std::vector<float>(256)};
  const size_t ql = 0, qh = 128, scales = 192, d_at = 208;
  put_u16(&k.block[d_at], f32_to_fp16(0.125f));
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = int(rng() % 256) - 128;
    k.block[scales + j] = uint8_t(int8_t(sc[j]));
  }
  for (size_t e = 0; e < 256; ++e) {
    const size_t h = e / 128, g = e % 128 / 32, l = e % 32;
    const int q = int(rng() % 64);
    put_bits(k.block.data(), ql + 64 * h + 32 * (g % 2) + l, int(4 * (g / 2)), 4, q & 15);
    put_bits(k.block.data(), qh + 32 * h + l, int(2 * g), 2, q >> 4);
    k.want[e] = 0.125f * sc[e / 16] * (q - 32);
  }
  return k;
}

TEST(QuantHandBuilt, KQuantsRandomBlocks) {
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    const KCase q2 = build_q2_K(rng), q3 = build_q3_K(rng), q4 = build_q45_K(rng, false),
                q5 = build_q45_K(rng, true), q6 = build_q6_K(rng);
    expect_dequantizes_to(TensorType::Q2_K, q2.block, q2.want);
    expect_dequantizes_to(TensorType::Q3_K, q3.block, q3.want);
    expect_dequantizes_to(TensorType::Q4_K, q4.block, q4.want);
    expect_dequantizes_to(TensorType::Q5_K, q5.block, q5.want);
    expect_dequantizes_to(TensorType::Q6_K, q6.block, q6.want);
  }
}

// The word-at-a-time unpack of all eight Q4_K/Q5_K scales and mins gives what the
// per-sub-block rule gives, on every value of each byte position's bits (random arrays
// plus all-zeros and all-ones).
TEST(QuantHandBuilt, AllScalesAndMinsOfAK4ArrayAtOnce) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int round = 0; round < 4096; ++round) {
    uint8_t scales[12];
    for (uint8_t& b : scales) b = static_cast<uint8_t>(round == 0 ? 0 : round == 1 ? 255 : byte(rng));
    const ref::ScalesMinsK4 all = ref::unpack_scales_mins_k4(scales);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      ref::unpack_scale_min_k4(scales, j, &sc, &m);
      ASSERT_EQ(sc, uint8_t(all.sc >> (8 * j))) << "round " << round << " sub-block " << j;
      ASSERT_EQ(m, uint8_t(all.m >> (8 * j))) << "round " << round << " sub-block " << j;
    }
  }
}

// Byte literals worked out on paper, so a shared misreading of the layout between the
// builders above and the code would still show.
TEST(QuantHandBuilt, KQuantSpotValues) {
  std::vector<float> y(256);
  {  // Q2_K: d 0.5, dmin 0.25; sub 0: sc 10, m 3; sub 5: sc 1, m 15.
    std::vector<uint8_t> b(84, 0);
    b[0] = 0x3A, b[5] = 0xF1;
    b[16 + 0] = 0x02;   // element 0: q 2
    b[16 + 16] = 0x30;  // element 80 (h 0, shift 4, l 16): q 3
    put_u16(&b[80], 0x3800), put_u16(&b[82], 0x3400);
    dequantize_row(TensorType::Q2_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 9.25f);
    EXPECT_EQ(y[1], -0.75f);
    EXPECT_EQ(y[80], -2.25f);
    EXPECT_EQ(y[81], -3.75f);
    EXPECT_EQ(y[16], 0.0f);
  }
  {  // Q3_K: d 0.5; scales 0, 4, 8, 12 = 33, 63, 18, 32 (-32: 1, 31, -14, 0); others 0.
    std::vector<uint8_t> b(110, 0);
    b[96 + 0] = 0x21, b[96 + 4] = 0x0F, b[96 + 8] = 0x9E;
    b[32 + 0] = 0x23;   // elements 0, 32, 64, 96 low bits: 3, 0, 2, 0
    b[32 + 32] = 0x11;  // elements 128, 192: 1, 1
    b[0] = 0x11;        // hmask byte 0: high bit for elements 0 and 128
    put_u16(&b[108], 0x3800);
    dequantize_row(TensorType::Q3_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 1.5f);
    EXPECT_EQ(y[64], -31.0f);
    EXPECT_EQ(y[128], -7.0f);
    EXPECT_EQ(y[192], 0.0f);
    EXPECT_EQ(y[32], 64.0f);  // scale -32, q 0 - 4
    EXPECT_EQ(y[1], -2.0f);
    EXPECT_EQ(y[16], 64.0f);
  }
  // Q4_K/Q5_K: d 1, dmin 0.5; sub 0: sc 5 m 3; sub 1: sc 2 m 1; sub 4: sc 55 m 26.
  const uint8_t k4_scales[12] = {0xC5, 0x02, 0, 0, 0x43, 0x01, 0, 0, 0xA7, 0, 0, 0};
  {
    std::vector<uint8_t> b(144, 0);
    put_u16(&b[0], 0x3C00), put_u16(&b[2], 0x3800);
    std::memcpy(&b[4], k4_scales, 12);
    b[16 + 0] = 0x9E;       // element 0: 14, element 32: 9
    b[16 + 64 + 3] = 0x0F;  // element 131: 15, element 163: 0
    dequantize_row(TensorType::Q4_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 68.5f);
    EXPECT_EQ(y[1], -1.5f);
    EXPECT_EQ(y[32], 17.5f);
    EXPECT_EQ(y[131], 812.0f);
    EXPECT_EQ(y[129], -13.0f);
    EXPECT_EQ(y[163], 0.0f);
  }
  {
    std::vector<uint8_t> b(176, 0);
    put_u16(&b[0], 0x3C00), put_u16(&b[2], 0x3800);
    std::memcpy(&b[4], k4_scales, 12);
    b[16 + 0] = 0x03;       // qh: elements 0 and 32 get +16
    b[16 + 3] = 0x10;       // element 131 (sub 4) gets +16
    b[48 + 0] = 0x9E;
    b[48 + 64 + 3] = 0x0F;
    dequantize_row(TensorType::Q5_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 148.5f);
    EXPECT_EQ(y[32], 49.5f);
    EXPECT_EQ(y[131], 1692.0f);
    EXPECT_EQ(y[163], 0.0f);
    EXPECT_EQ(y[1], -1.5f);
  }
  {  // Q6_K: d 0.25; scales[0] 2, [2] -3, [4] 7, [9] 5.
    std::vector<uint8_t> b(210, 0);
    b[192 + 0] = 2, b[192 + 2] = uint8_t(int8_t(-3)), b[192 + 4] = 7, b[192 + 9] = 5;
    b[0] = 0x5A;         // element 0 low 10, element 64 low 5
    b[32] = 0x01;        // element 32 low 1
    b[128 + 0] = 0x1B;   // high pairs of elements 0, 32, 64, 96: 3, 2, 1, 0
    b[64 + 16] = 0x0F;   // element 144 (h 1, g 0, l 16) low 15
    b[128 + 48] = 0x02;  // and its high pair 2
    put_u16(&b[208], 0x3400);
    dequantize_row(TensorType::Q6_K, b.data(), y.data(), 256);
    EXPECT_EQ(y[0], 13.0f);
    EXPECT_EQ(y[32], -0.75f);
    EXPECT_EQ(y[64], -19.25f);
    EXPECT_EQ(y[144], 18.75f);
    EXPECT_EQ(y[96], 0.0f);  // scale[6] is 0
  }
}

// ---------------------------------------------------------------- llama.cpp fixture

// ggml_quantize_chunk and ggml's own dequantization of the same source, for every type
// (tests/data/quant/README.md). Missing data is a failure, never a skip. `prefix` picks the
// source: "" for 'src' (4 rows of ordinary data), "awkward." for 'awkward' (9 rows taking
// the special paths: all zeros, one huge outlier, tiny and underflowing values,
// negative-only and constant rows, a single nonzero sub-block, integers with exact ties).
void expect_matches_fixture(const gguf::File& file, const std::string& source, const std::string& prefix,
                            size_t rows) {
  const size_t n = rows * 256;
  const gguf::TensorInfo* src = file.find_tensor(source);
  ASSERT_NE(src, nullptr) << source;
  ASSERT_EQ(src->type, TensorType::F32);
  ASSERT_EQ(src->n_elements, n);
  const float* x = reinterpret_cast<const float*>(src->data);

  const TensorType types[] = {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
                              TensorType::Q5_0, TensorType::Q5_1, TensorType::Q2_K,
                              TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                              TensorType::Q6_K};
  for (TensorType t : types) {
    const std::string name = prefix + type_name(t);
    const gguf::TensorInfo* q = file.find_tensor(prefix + "q." + type_name(t));
    const gguf::TensorInfo* dq = file.find_tensor(prefix + "dq." + type_name(t));
    ASSERT_NE(q, nullptr) << name;
    ASSERT_NE(dq, nullptr) << name;
    ASSERT_EQ(q->type, t);
    ASSERT_EQ(dq->type, TensorType::F32);
    ASSERT_EQ(q->n_elements, n);
    ASSERT_EQ(dq->n_elements, n);
    ASSERT_EQ(q->n_bytes, row_bytes(t, n));

    std::vector<float> y(n);
    dequantize_row(t, q->data, y.data(), n);
    const float* want = reinterpret_cast<const float*>(dq->data);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      if (bits_of(y[i]) == bits_of(want[i])) continue;
      if (mismatches++ < 5)
        ADD_FAILURE() << name << " dequantize element " << i << ": " << y[i] << " vs ggml "
                      << want[i];
    }
    EXPECT_EQ(mismatches, 0u) << name;

    ASSERT_TRUE(ref::quant_traits(t)->can_quantize) << name;
    // Quantized row by row (as kiln quantize does) and compared with ggml's whole chunk:
    // the formats are block-local, so the bytes must agree either way.
    std::vector<uint8_t> bytes(row_bytes(t, n));
    for (size_t r = 0; r < rows; ++r)
      quantize_row(t, x + r * 256, bytes.data() + r * row_bytes(t, 256), 256);
    const size_t bb = ref::quant_traits(t)->block_bytes;
    mismatches = 0;
    for (size_t k = 0; k < bytes.size(); ++k) {
      if (bytes[k] == q->data[k]) continue;
      if (mismatches++ < 5)
        ADD_FAILURE() << name << " quantize block " << k / bb << " byte " << k % bb << ": "
                      << int(bytes[k]) << " vs ggml " << int(q->data[k]);
    }
    EXPECT_EQ(mismatches, 0u) << name;
  }
}

std::unique_ptr<gguf::File> open_fixture() {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/data/quant/ggml-quant-fixture.gguf";
  std::unique_ptr<gguf::File> file;
  EXPECT_NO_THROW(file = gguf::File::open(path)) << path;
  return file;
}

TEST(QuantFixture, MatchesGgmlBitForBit) {
  auto file = open_fixture();
  ASSERT_NE(file, nullptr);
  expect_matches_fixture(*file, "src", "", 4);
}

TEST(QuantFixture, AwkwardRowsMatchGgmlBitForBit) {
  auto file = open_fixture();
  ASSERT_NE(file, nullptr);
  expect_matches_fixture(*file, "awkward", "awkward.", 9);
}

}  // namespace
}  // namespace kiln::kernels
