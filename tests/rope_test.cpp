// RoPE scaling (issue 5): the cos/sin table against ggml's formulas written out here in
// float64, the GGUF keys and tensor that ask for scaling, session overrides winning over
// them, errors naming the key or flag, and the kiln binary with the flags.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "kiln/model.h"
#include "kiln/session.h"
#include "model_gen/generate_model.h"
#include "runtime/rope.h"
#include "test_util.h"

using namespace kiln;

namespace {

// ggml's rope with YaRN (ggml_rope_yarn_corr_dims, rope_yarn_ramp, rope_yarn) in plain
// float64, one pair at a time.
struct Reference {
  int n_rot = 64;
  double base = 10000;
  double freq_scale = 1;  // 1 / factor
  double ext_factor = 0;
  double attn_factor = 1;
  double orig_ctx = 4096;
  double beta_fast = 32, beta_slow = 1;
  std::vector<double> freq_factors;  // empty: all 1

  double corr_dim(double beta) const {
    return n_rot * std::log(orig_ctx / (beta * 2 * std::numbers::pi)) / (2 * std::log(base));
  }
  std::pair<double, double> cos_sin(double pos, int i) const {
    double theta_extrap = pos * std::pow(base, -2.0 * i / n_rot);
    if (!freq_factors.empty()) theta_extrap /= freq_factors[i];
    const double theta_interp = freq_scale * theta_extrap;
    double theta = theta_interp, mscale = attn_factor;
    if (ext_factor != 0) {
      const double low = std::max(0.0, std::floor(corr_dim(beta_fast)));
      const double high = std::min(n_rot - 1.0, std::ceil(corr_dim(beta_slow)));
      const double y = (i - low) / std::max(0.001, high - low);
      const double ramp = 1 - std::min(1.0, std::max(0.0, y));
      const double mix = ramp * ext_factor;
      theta = theta_interp * (1 - mix) + theta_extrap * mix;
      mscale *= 1 + 0.1 * std::log(1 / freq_scale);
    }
    return {std::cos(theta) * mscale, std::sin(theta) * mscale};
  }
};

ModelConfig config(uint32_t n_rot = 64, float theta = 10000, uint32_t n_ctx_train = 4096) {
  ModelConfig c;
  c.n_rot = n_rot;
  c.rope_theta = theta;
  c.n_ctx_train = n_ctx_train;
  return c;
}

// The positions of the brief: the start, small ones, and far beyond any training context.
constexpr int64_t kPositions[] = {0, 1, 17, 1000, 30000};

void expect_matches(const RopeConfig& r, const Reference& ref) {
  ASSERT_EQ(int(r.n_rot), ref.n_rot);
  std::vector<float> cs(r.n_rot);
  const std::vector<float> table = rope_cos_sin_table(r, 30001);
  double worst = 0;
  for (int64_t pos : kPositions) {
    rope_cos_sin(r, pos, cs.data());
    for (int i = 0; i < ref.n_rot / 2; ++i) {
      const auto [c, s] = ref.cos_sin(double(pos), i);
      // One float rounding of values of magnitude ~mscale; theta up to 3e4 rad in double.
      const double tol = 2e-7 * std::max(1.0, std::abs(c) + std::abs(s)) + 1e-9;
      EXPECT_NEAR(cs[2 * i], c, tol) << "cos, pos " << pos << " pair " << i;
      EXPECT_NEAR(cs[2 * i + 1], s, tol) << "sin, pos " << pos << " pair " << i;
      worst = std::max({worst, std::abs(cs[2 * i] - c), std::abs(cs[2 * i + 1] - s)});
      // The session's table holds exactly the values of one position.
      EXPECT_EQ(table[(size_t(pos) * (ref.n_rot / 2) + i) * 2], cs[2 * i]);
      EXPECT_EQ(table[(size_t(pos) * (ref.n_rot / 2) + i) * 2 + 1], cs[2 * i + 1]);
    }
  }
  testing::Test::RecordProperty("worst_abs_error", std::to_string(worst));
}

}  // namespace

TEST(RopeTable, UnscaledIsBitIdenticalToTheClassicFormula) {
  const RopeConfig r = resolve_rope(config(), {});
  EXPECT_EQ(r.scaling, RopeScaling::None);
  std::vector<float> cs(64);
  for (int64_t pos : kPositions) {
    rope_cos_sin(r, pos, cs.data());
    for (int i = 0; i < 32; ++i) {
      // What the session computed before scaling existed: golden texts depend on it.
      const double theta = double(pos) * std::pow(10000.0, -2.0 * double(i) / 64.0);
      EXPECT_EQ(cs[2 * i], (float)std::cos(theta)) << pos << " " << i;
      EXPECT_EQ(cs[2 * i + 1], (float)std::sin(theta)) << pos << " " << i;
    }
  }
  Reference ref;
  expect_matches(r, ref);
}

TEST(RopeTable, LinearInterpolatesPositions) {
  RopeParams p;
  p.scaling = RopeScaling::Linear;
  p.factor = 4;
  const RopeConfig r = resolve_rope(config(), p);
  EXPECT_DOUBLE_EQ(r.freq_scale, 0.25);
  EXPECT_EQ(r.ext_factor, 0);
  Reference ref;
  ref.freq_scale = 0.25;
  expect_matches(r, ref);
  // By hand: pair 0 at position 1000 turns by 1000 / 4 radians.
  float cs[64];
  rope_cos_sin(r, 1000, cs);
  EXPECT_NEAR(cs[0], std::cos(250.0), 1e-6);
  EXPECT_NEAR(cs[1], std::sin(250.0), 1e-6);
}

TEST(RopeTable, NtkRaisesTheBase) {
  RopeParams p;
  p.scaling = RopeScaling::Ntk;
  p.factor = 4;
  const RopeConfig r = resolve_rope(config(), p);
  const double base = 10000 * std::pow(4.0, 64.0 / 62.0);
  EXPECT_NEAR(r.freq_base, base, 1e-6 * base);
  EXPECT_EQ(r.freq_scale, 1);
  Reference ref;
  ref.base = base;
  expect_matches(r, ref);
  // The fastest pair is untouched, the slowest turns 4 times slower.
  float cs[64];
  rope_cos_sin(r, 1000, cs);
  EXPECT_NEAR(cs[0], std::cos(1000.0), 1e-6);
  EXPECT_NEAR(cs[62], std::cos(1000.0 * std::pow(10000.0, -62.0 / 64) / 4), 1e-6);
}

TEST(RopeTable, YarnCorrectionDimsByHand) {
  RopeParams p;
  p.scaling = RopeScaling::Yarn;
  p.factor = 4;
  // n_rot 64, base 1e4, original context 4096: beta 32 at pair 10.47, beta 1 at 22.51.
  const auto dims = yarn_corr_dims(resolve_rope(config(), p));
  EXPECT_EQ(dims[0], 10);
  EXPECT_EQ(dims[1], 23);
  // Llama-3-like: n_rot 128, base 5e5, 8192: 18.08 and 34.98.
  const auto llama3 = yarn_corr_dims(resolve_rope(config(128, 500000, 8192), p));
  EXPECT_EQ(llama3[0], 18);
  EXPECT_EQ(llama3[1], 35);
}

TEST(RopeTable, YarnMixesInterpolationAndExtrapolation) {
  RopeParams p;
  p.scaling = RopeScaling::Yarn;
  p.factor = 4;
  const RopeConfig r = resolve_rope(config(), p);
  EXPECT_EQ(r.ext_factor, 1);  // derived for yarn
  EXPECT_EQ(r.orig_ctx, 4096u);
  Reference ref;
  ref.freq_scale = 0.25;
  ref.ext_factor = 1;
  expect_matches(r, ref);
  // Below the ramp, pairs keep their frequency, scaled by mscale = 1 + 0.1 ln 4.
  float cs[64];
  rope_cos_sin(r, 1000, cs);
  const double mscale = 1 + 0.1 * std::log(4.0);
  EXPECT_NEAR(cs[0], std::cos(1000.0) * mscale, 1e-6);
  // Past it, they are interpolated as linear scaling does.
  const double theta31 = 1000.0 * std::pow(10000.0, -62.0 / 64) / 4;
  EXPECT_NEAR(cs[62], std::cos(theta31) * mscale, 1e-6);
}

TEST(RopeTable, YarnWithExtAndAttnFactors) {
  RopeParams p;
  p.scaling = RopeScaling::Yarn;
  p.factor = 8;
  p.yarn_ext_factor = 0.5f;
  p.yarn_attn_factor = 0.75f;
  p.yarn_beta_fast = 16;
  p.yarn_beta_slow = 2;
  p.yarn_orig_ctx = 2048u;
  Reference ref;
  ref.freq_scale = 1.0 / 8;
  ref.ext_factor = 0.5;
  ref.attn_factor = 0.75;
  ref.beta_fast = 16;
  ref.beta_slow = 2;
  ref.orig_ctx = 2048;
  expect_matches(resolve_rope(config(), p), ref);

  // ext_factor 0: plain interpolation, attn_factor alone sets the magnitude.
  p.yarn_ext_factor = 0;
  Reference interp;
  interp.freq_scale = 1.0 / 8;
  interp.attn_factor = 0.75;
  expect_matches(resolve_rope(config(), p), interp);
}

TEST(RopeTable, FrequencyFactorsDivideTheta) {
  ModelConfig c = config();
  Reference ref;
  for (int i = 0; i < 32; ++i) {
    // Llama 3.1's shape: fast pairs 1, slow pairs 8, a smooth band in between.
    const float f = i < 12 ? 1.0f : i > 20 ? 8.0f : 1.0f + 7.0f * float(i - 12) / 8.0f;
    c.rope_freq_factors.push_back(f);
    ref.freq_factors.push_back(f);
  }
  expect_matches(resolve_rope(c, {}), ref);

  // With YaRN on top, the factors divide the extrapolated angle first.
  RopeParams p;
  p.scaling = RopeScaling::Yarn;
  p.factor = 2;
  ref.freq_scale = 0.5;
  ref.ext_factor = 1;
  expect_matches(resolve_rope(c, p), ref);
}

// LongRoPE (Phi-3 128k): the short divisors up to the original context, the long ones
// beyond it (llama.cpp's rule), the original context defaulting to context_length; the
// attention factor scales cos/sin with either set.
TEST(RopeTable, LongRopePicksItsFactorsByTheContext) {
  ModelConfig c = config(8, 10000, 2048);
  c.rope_freq_factors = {1, 1.1f, 1.2f, 1.3f};
  c.rope_freq_factors_long = {2, 4, 8, 16};
  c.rope_attn_factor = 1.25f;
  for (uint32_t orig : {256u, 0u}) {
    c.rope_orig_ctx = orig;
    const int64_t edge = orig ? orig : 2048;
    for (int64_t n_ctx : {int64_t(0), int64_t(64), edge, edge + 1}) {
      SCOPED_TRACE("original " + std::to_string(orig) + ", context " + std::to_string(n_ctx));
      const RopeConfig r = resolve_rope(c, {}, n_ctx);
      EXPECT_EQ(r.freq_factors, n_ctx > edge ? c.rope_freq_factors_long : c.rope_freq_factors);
      EXPECT_EQ(r.attn_factor, 1.25);
      float cs[8];
      rope_cos_sin(r, 3, cs);
      EXPECT_NEAR(cs[6], 1.25 * std::cos(3 * std::pow(10000.0, -6.0 / 8) / r.freq_factors[3]), 1e-6);
    }
  }
  EXPECT_NE(describe_rope(resolve_rope(c, {}, 4096)).find("rope_factors_long.weight (LongRoPE, context 4096 > 2048)"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Metadata and overrides.

namespace {

std::unique_ptr<gguf::File>& vocab() {
  static std::unique_ptr<gguf::File> v = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  return v;
}

gguf::Writer tiny_writer() {
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("tiny");
  o.type = TensorType::F32;
  return gen::build_model(o, *vocab());
}

uint32_t tiny_n_rot() {
  const gen::ModelShape s = *gen::find_shape("tiny");
  return s.dim / s.n_heads;
}

void add_rope_freqs(gguf::Writer& w, const std::vector<float>& factors) {
  std::vector<uint8_t> bytes(factors.size() * sizeof(float));
  std::memcpy(bytes.data(), factors.data(), bytes.size());
  w.add_tensor("rope_freqs.weight", TensorType::F32, {factors.size()}, std::move(bytes));
}

std::string save(const std::string& name, const gguf::Writer& w) {
  const std::string path = test::temp_dir() + "/" + name;
  w.write(path);
  return path;
}

std::string load_error(const gguf::Writer& w, const std::string& name) {
  try {
    Model::load(save(name, w));
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<float> logits(const Model& m, const SessionParams& p) {
  Session s(m, p);
  const int32_t tokens[] = {1, 400, 21, 300, 42, 77, 5, 260, 11, 99, 3, 8};
  const auto out = s.decode(tokens, /*all_logits=*/true);
  return {out.begin(), out.end()};
}

}  // namespace

TEST(RopeMetadata, ReadsTheScalingKeys) {
  auto w = tiny_writer();
  w.set("llama.rope.scaling.type", gguf::Value::of_string("yarn"));
  w.set("llama.rope.scaling.factor", gguf::Value::of_f32(4));
  w.set("llama.rope.scaling.original_context_length", gguf::Value::of_u32(1024));
  w.set("llama.rope.scaling.attn_factor", gguf::Value::of_f32(0.5f));
  auto m = Model::load(save("yarn.gguf", w));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.rope_scaling, RopeScaling::Yarn);
  EXPECT_EQ(c.rope_scale, 4.0f);
  EXPECT_EQ(c.rope_orig_ctx, 1024u);
  EXPECT_EQ(c.rope_attn_factor, 0.5f);

  const RopeConfig r = resolve_rope(c, {});
  EXPECT_DOUBLE_EQ(r.freq_scale, 0.25);
  EXPECT_EQ(r.ext_factor, 1);
  EXPECT_EQ(r.orig_ctx, 1024u);
  EXPECT_EQ(r.attn_factor, 0.5);
  EXPECT_EQ(describe_rope(r), "yarn x4, original context 1024, ext factor 1, beta 32/1, attn factor 0.5");

  // Every override wins over the file.
  RopeParams p;
  p.scaling = RopeScaling::Linear;
  p.factor = 8;
  p.freq_base = 5000;
  p.yarn_orig_ctx = 256u;
  p.yarn_attn_factor = 2;
  const RopeConfig o = resolve_rope(c, p);
  EXPECT_EQ(o.scaling, RopeScaling::Linear);
  EXPECT_DOUBLE_EQ(o.freq_scale, 0.125);
  EXPECT_EQ(o.freq_base, 5000);
  EXPECT_EQ(o.ext_factor, 0);  // derived from the overriding type
  EXPECT_EQ(o.orig_ctx, 256u);
  EXPECT_EQ(o.attn_factor, 2);
  RopeParams none;
  none.scaling = RopeScaling::None;
  EXPECT_EQ(resolve_rope(c, none).freq_scale, 1);
}

TEST(RopeMetadata, OlderScaleLinearKeyAndFactorAloneMeanLinear) {
  auto w = tiny_writer();
  w.set("llama.rope.scale_linear", gguf::Value::of_f32(2));
  auto m = Model::load(save("scale_linear.gguf", w));
  EXPECT_EQ(m->config().rope_scaling, RopeScaling::Linear);
  EXPECT_EQ(m->config().rope_scale, 2.0f);

  auto plain = Model::load(save("plain.gguf", tiny_writer()));
  EXPECT_EQ(plain->config().rope_scaling, RopeScaling::None);
  EXPECT_TRUE(plain->config().rope_freq_factors.empty());
  RopeParams p;
  p.factor = 3;  // no type: linear, as llama.cpp's --rope-scale on such a model
  EXPECT_EQ(resolve_rope(plain->config(), p).scaling, RopeScaling::Linear);
  EXPECT_DOUBLE_EQ(resolve_rope(plain->config(), p).freq_scale, 1.0 / 3);
  // Scaling changes the identity (saved sessions must not mix); none keeps it.
  EXPECT_NE(m->identity(), plain->identity());
}

TEST(RopeMetadata, BadValuesNameTheKey) {
  auto zero = tiny_writer();
  zero.set("llama.rope.scaling.factor", gguf::Value::of_f32(0));
  EXPECT_NE(load_error(zero, "f0.gguf").find("llama.rope.scaling.factor must be a positive number, got 0"), std::string::npos)
      << load_error(zero, "f0.gguf");
  auto negative = tiny_writer();
  negative.set("llama.rope.scale_linear", gguf::Value::of_f32(-2));
  EXPECT_NE(load_error(negative, "fneg.gguf").find("llama.rope.scale_linear must be a positive number, got -2"),
            std::string::npos);
  auto type = tiny_writer();
  type.set("llama.rope.scaling.type", gguf::Value::of_string("longrope"));
  EXPECT_NE(load_error(type, "type.gguf").find("llama.rope.scaling.type 'longrope' is not one of none, linear, yarn"),
            std::string::npos)
      << load_error(type, "type.gguf");
  auto attn = tiny_writer();
  attn.set("llama.rope.scaling.attn_factor", gguf::Value::of_f32(-1));
  EXPECT_NE(load_error(attn, "attn.gguf").find("llama.rope.scaling.attn_factor must be"), std::string::npos);

  const uint32_t half = tiny_n_rot() / 2;
  auto freqs = tiny_writer();
  add_rope_freqs(freqs, std::vector<float>(half + 1, 1.0f));
  const std::string err = load_error(freqs, "freqs.gguf");
  EXPECT_NE(err.find("freqs.gguf: tensor 'rope_freqs.weight' has shape [" + std::to_string(half + 1) + "], expected [" +
                     std::to_string(half) + "]"),
            std::string::npos)
      << err;
  auto zero_factor = tiny_writer();
  std::vector<float> f(half, 1.0f);
  f[3] = 0;
  add_rope_freqs(zero_factor, f);
  EXPECT_NE(load_error(zero_factor, "freq0.gguf").find("'rope_freqs.weight' has factor 0 at 3"), std::string::npos);
}

TEST(RopeMetadata, BadSessionParamsNameTheField) {
  auto m = Model::load(save("ok.gguf", tiny_writer()));
  const auto error = [&](const SessionParams& p) -> std::string {
    try {
      Session s(*m, p);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  SessionParams p;
  p.rope.factor = 0;
  EXPECT_EQ(error(p), "SessionParams.rope.factor must be a positive number, got 0");
  p.rope.factor = -1;
  EXPECT_EQ(error(p), "SessionParams.rope.factor must be a positive number, got -1");
  SessionParams b;
  b.rope.freq_base = 0;
  EXPECT_EQ(error(b), "SessionParams.rope.freq_base must be a positive number, got 0");
  SessionParams beta;
  beta.rope.yarn_beta_slow = 0;
  EXPECT_EQ(error(beta), "SessionParams.rope.yarn_beta_slow must be a positive number, got 0");
  SessionParams ntk;
  ntk.rope.scaling = RopeScaling::Ntk;
  ntk.rope.factor = 2;
  ModelConfig two = config(2);
  EXPECT_THROW(resolve_rope(two, ntk.rope), Error);
}

// A file whose rope_freqs are all 2 halves every angle, as linear scaling x2 does: the
// forward pass must give the very same logits (x / 2 and 0.5 * x round alike), and both
// must differ from the unscaled model (the table reaches the attention).
TEST(RopeMetadata, FrequencyFactorsReachTheForwardPass) {
  auto w = tiny_writer();
  add_rope_freqs(w, std::vector<float>(tiny_n_rot() / 2, 2.0f));
  auto with_freqs = Model::load(save("freqs2.gguf", w));
  EXPECT_EQ(with_freqs->config().rope_freq_factors.size(), tiny_n_rot() / 2);
  auto plain = Model::load(save("plain2.gguf", tiny_writer()));

  SessionParams sp;
  sp.n_ctx = 32;
  sp.n_threads = 1;
  SessionParams linear2 = sp;
  linear2.rope.scaling = RopeScaling::Linear;
  linear2.rope.factor = 2;
  SessionParams none = sp;
  none.rope.scaling = RopeScaling::None;
  const auto a = logits(*with_freqs, sp), b = logits(*plain, linear2), base = logits(*plain, sp);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, base);
  EXPECT_EQ(logits(*plain, none), base);
}

// ---------------------------------------------------------------------------------------
// The kiln binary.

namespace {

std::string stories() { return test::shared_path("models/stories260K.gguf"); }
std::string golden() { return test::trim(test::read_file(test::shared_path("models/expected/stories260K.once-upon-a-time.greedy100.txt"))); }

test::CommandResult kiln_run(const std::string& model, const std::string& flags) {
  return test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(model) +
                           " 'Once upon a time' -n 100 --temp 0 -t 1 " + flags);
}

// stories260K with scaling keys added: every tensor and key of the original kept.
std::string stories_with(const std::vector<std::pair<std::string, gguf::Value>>& keys, const std::string& name) {
  auto f = gguf::File::open(stories());
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata())
    if (k != "general.alignment") w.set(k, v);
  for (const auto& [k, v] : keys) w.set(k, v);
  for (const gguf::TensorInfo& t : f->tensors()) w.add_tensor(t.name, t.type, t.dims, {t.data, t.data + t.n_bytes});
  return save(name, w);
}

}  // namespace

TEST(RopeCli, ScalingFlagsChangeTheTextAndNoneKeepsTheGolden) {
  auto none = kiln_run(stories(), "--rope-scaling none");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(test::trim(none.out), golden());

  auto linear = kiln_run(stories(), "--rope-scaling linear --rope-scale 2");
  ASSERT_EQ(linear.exit_code, 0) << linear.err;
  EXPECT_FALSE(test::trim(linear.out).empty());
  EXPECT_NE(test::trim(linear.out), golden());
  EXPECT_NE(linear.err.find("rope scaling: linear x2, original context 2048\n"), std::string::npos) << linear.err;
  EXPECT_EQ(none.err.find("rope scaling"), std::string::npos) << none.err;
  // --rope-freq-scale is the inverse spelling, and a factor alone means linear here.
  EXPECT_EQ(kiln_run(stories(), "--rope-freq-scale 0.5").out, linear.out);

  for (const char* flags : {"--rope-scaling ntk --rope-scale 4", "--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 128"}) {
    auto r = kiln_run(stories(), flags);
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    EXPECT_NE(test::trim(r.out), golden()) << flags;
  }
}

TEST(RopeCli, FlagsOverrideTheFile) {
  const std::string scaled = stories_with({{"llama.rope.scaling.type", gguf::Value::of_string("linear")},
                                           {"llama.rope.scaling.factor", gguf::Value::of_f32(2)}},
                                          "stories-linear2.gguf");
  auto info = test::run_command(test::shell_quote(test::kiln_binary()) + " info " + test::shell_quote(scaled));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("scaling linear x2, original context 2048"), std::string::npos) << info.out;
  auto plain_info = test::run_command(test::shell_quote(test::kiln_binary()) + " info " + test::shell_quote(stories()));
  EXPECT_NE(plain_info.out.find("normal, scaling none\n"), std::string::npos) << plain_info.out;

  const auto from_file = kiln_run(scaled, "");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, kiln_run(stories(), "--rope-scaling linear --rope-scale 2").out);
  EXPECT_EQ(test::trim(kiln_run(scaled, "--rope-scaling none").out), golden());
  EXPECT_EQ(test::trim(kiln_run(scaled, "--rope-scale 1").out), golden());
}

TEST(RopeCli, BadValuesGiveOneLineNamingTheFlagOrKey) {
  test::expect_one_line_error(kiln_run(stories(), "--rope-scaling dynamic"), 2,
                              "--rope-scaling 'dynamic' is not one of none, linear, ntk, yarn");
  test::expect_one_line_error(kiln_run(stories(), "--rope-scale 0"), 2, "--rope-scale must be a positive number, got 0");
  test::expect_one_line_error(kiln_run(stories(), "--rope-freq-scale=-1"), 2, "--rope-freq-scale must be a positive number");
  test::expect_one_line_error(kiln_run(stories(), "--rope-scale 2 --rope-freq-scale 0.5"), 2,
                              "give --rope-scale or --rope-freq-scale");
  test::expect_one_line_error(kiln_run(stories(), "--yarn-beta-fast 0"), 2, "--yarn-beta-fast must be a positive number");
  // bench takes the same flags.
  test::expect_one_line_error(test::run_command(test::shell_quote(test::kiln_binary()) + " bench " +
                                                test::shell_quote(stories()) + " -p 8 -n 0 -r 1 --rope-scaling dynamic"),
                              2, "--rope-scaling 'dynamic' is not one of");

  const std::string bad = stories_with({{"llama.rope.scaling.type", gguf::Value::of_string("su")}}, "stories-su.gguf");
  test::expect_one_line_error(kiln_run(bad, ""), 1, "llama.rope.scaling.type 'su' is not one of none, linear, yarn");
}
