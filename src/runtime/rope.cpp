#include "runtime/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>

#include "kiln/error.h"

namespace kiln {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool positive(double v) { return v > 0 && std::isfinite(v); }

void require_positive(double v, const char* field) {
  if (!positive(v)) throw Error(std::string("SessionParams.rope.") + field + " must be a positive number, got " + num(v));
}

// Per pair: the angle per position before interpolation, and YaRN's share of it.
struct PairFreq {
  double inv_freq;  // base^(-2i/n_rot) / freq_factor_i
  double mix;       // share of the extrapolated (unscaled) angle; 0 without YaRN's ramp
};

std::vector<PairFreq> pair_freqs(const RopeConfig& r) {
  const size_t half = r.n_rot / 2;
  std::vector<PairFreq> out(half);
  std::array<double, 2> corr{0, 0};
  if (r.ext_factor != 0) corr = yarn_corr_dims(r);
  for (size_t i = 0; i < half; ++i) {
    // Computed as before scaling existed: an unscaled table stays bit-identical.
    out[i].inv_freq = std::pow(r.freq_base, -2.0 * double(i) / double(r.n_rot));
    if (!r.freq_factors.empty()) out[i].inv_freq /= r.freq_factors[i];
    if (r.ext_factor != 0) {
      const double y = (double(i) - corr[0]) / std::max(0.001, corr[1] - corr[0]);
      out[i].mix = (1.0 - std::clamp(y, 0.0, 1.0)) * r.ext_factor;
    } else {
      out[i].mix = 0;
    }
  }
  return out;
}

// YaRN's "length scaling": interpolated attention grows flatter, so cos/sin (hence both q
// and k, hence the logits twice) are scaled up; only where the ramp is in use, as in ggml.
double magnitude(const RopeConfig& r) {
  return r.ext_factor != 0 ? r.attn_factor * (1.0 + 0.1 * std::log(1.0 / r.freq_scale)) : r.attn_factor;
}

void fill(const RopeConfig& r, const std::vector<PairFreq>& freqs, double mscale, int64_t pos, float* out) {
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double extrap = double(pos) * freqs[i].inv_freq;
    const double interp = r.freq_scale * extrap;
    const double theta = freqs[i].mix != 0 ? interp * (1.0 - freqs[i].mix) + extrap * freqs[i].mix : interp;
    out[2 * i] = (float)(std::cos(theta) * mscale);
    out[2 * i + 1] = (float)(std::sin(theta) * mscale);
  }
}

}  // namespace

RopeConfig resolve_rope(const ModelConfig& c, const RopeParams& p, int64_t n_ctx) {
  RopeConfig r;
  r.n_rot = c.n_rot;
  r.freq_factors = c.rope_freq_factors;
  if (!c.rope_freq_factors_long.empty()) {
    // llama.cpp's rule (the context, not the current length as in transformers, so that
    // cached keys keep their angles), against the model's original context; with it an
    // override of YaRN's original context does not move the switch. llama.cpp rounds the
    // context up to a multiple of 256 first, which changes nothing for the 4096 of Phi-3.
    const int64_t orig = c.rope_orig_ctx ? c.rope_orig_ctx : c.n_ctx_train;
    const std::string o = std::to_string(orig);
    if (n_ctx > orig) {
      r.freq_factors = c.rope_freq_factors_long;
      r.factors_from = "rope_factors_long.weight (LongRoPE, context " + std::to_string(n_ctx) + " > " + o + ")";
    } else {
      r.factors_from = "rope_factors_short.weight (LongRoPE" +
                       (n_ctx > 0 ? ", context " + std::to_string(n_ctx) + " <= " + o
                                  : "; rope_factors_long.weight for contexts over " + o) + ")";
    }
  } else if (!r.freq_factors.empty()) {
    r.factors_from = "rope_freqs.weight";
  }
  // As llama.cpp: a factor on its own scales a model without a scaling type linearly.
  r.scaling = p.scaling ? *p.scaling
              : p.factor && c.rope_scaling == RopeScaling::None ? RopeScaling::Linear
                                                                : c.rope_scaling;
  r.factor = p.factor ? *p.factor : c.rope_scale;
  r.freq_base = p.freq_base ? *p.freq_base : c.rope_theta;
  r.attn_factor = p.yarn_attn_factor ? *p.yarn_attn_factor : c.rope_attn_factor;
  r.beta_fast = p.yarn_beta_fast;
  r.beta_slow = p.yarn_beta_slow;
  require_positive(r.factor, "factor");
  require_positive(r.freq_base, "freq_base");
  require_positive(r.attn_factor, "yarn_attn_factor");
  require_positive(r.beta_fast, "yarn_beta_fast");
  require_positive(r.beta_slow, "yarn_beta_slow");
  if (!std::isfinite(p.yarn_ext_factor))
    throw Error("SessionParams.rope.yarn_ext_factor must be a number, got " + num(p.yarn_ext_factor));

  switch (r.scaling) {
    case RopeScaling::None: r.freq_scale = 1; break;
    case RopeScaling::Linear:
    case RopeScaling::Yarn: r.freq_scale = 1.0 / r.factor; break;
    case RopeScaling::Ntk:
      // Stretches the slowest pair's wavelength by `factor` and leaves the fastest alone.
      if (r.n_rot <= 2) throw Error("NTK scaling needs more than 2 rotary dimensions, the model has " + std::to_string(r.n_rot));
      r.freq_base *= std::pow(r.factor, double(r.n_rot) / double(r.n_rot - 2));
      r.freq_scale = 1;
      break;
  }
  r.ext_factor = p.yarn_ext_factor >= 0 ? p.yarn_ext_factor : r.scaling == RopeScaling::Yarn ? 1.0 : 0.0;
  r.orig_ctx = p.yarn_orig_ctx.value_or(0) > 0 ? *p.yarn_orig_ctx : c.rope_orig_ctx > 0 ? c.rope_orig_ctx : c.n_ctx_train;
  if (r.ext_factor != 0 && r.orig_ctx == 0)
    throw Error("YaRN needs the original context length: the model has neither rope.scaling.original_context_length "
                "nor context_length (give it: --yarn-orig-ctx, SessionParams.rope.yarn_orig_ctx)");
  return r;
}

std::array<double, 2> yarn_corr_dims(const RopeConfig& r) {
  // Pair i turns orig_ctx / (2 pi base^(2i/n_rot)) times over the original context; the
  // pair that turns exactly beta times solves to this i.
  const auto corr_dim = [&](double beta) {
    return double(r.n_rot) * std::log(double(r.orig_ctx) / (beta * 2.0 * std::numbers::pi)) / (2.0 * std::log(r.freq_base));
  };
  return {std::max(0.0, std::floor(corr_dim(r.beta_fast))), std::min(double(r.n_rot) - 1, std::ceil(corr_dim(r.beta_slow)))};
}

void rope_cos_sin(const RopeConfig& r, int64_t pos, float* out) { fill(r, pair_freqs(r), magnitude(r), pos, out); }

std::vector<float> rope_cos_sin_table(const RopeConfig& r, int32_t n_pos) {
  const size_t half = r.n_rot / 2;
  const std::vector<PairFreq> freqs = pair_freqs(r);
  const double mscale = magnitude(r);
  std::vector<float> table(size_t(std::max(n_pos, 0)) * half * 2);
  // data() + offset, not &table[i]: with no rotated dimensions (ALiBi models) the table is
  // empty and operator[] on it is undefined even when nothing is written.
  for (int32_t pos = 0; pos < n_pos; ++pos) fill(r, freqs, mscale, pos, table.data() + size_t(pos) * half * 2);
  return table;
}

std::string describe_rope(const RopeConfig& r) {
  std::string s = rope_scaling_name(r.scaling);
  if (r.scaling != RopeScaling::None) s += " x" + num(r.factor);
  if (r.scaling == RopeScaling::Ntk) s += ", base " + num(r.freq_base);
  if (r.scaling != RopeScaling::None || r.ext_factor != 0) s += ", original context " + std::to_string(r.orig_ctx);
  if (r.ext_factor != 0) s += ", ext factor " + num(r.ext_factor) + ", beta " + num(r.beta_fast) + "/" + num(r.beta_slow);
  if (r.attn_factor != 1 || r.ext_factor != 0) s += ", attn factor " + num(r.attn_factor);
  if (!r.freq_factors.empty()) s += ", frequency factors from " + r.factors_from;
  return s;
}

}  // namespace kiln
