// The RoPE metadata of a GGUF (rope.scaling.*, rope_freqs.weight, LongRoPE's factor
// tensors) read into ModelConfig. What the runtime makes of it (the cos/sin tables,
// a session's overrides) is src/runtime/rope.cpp: the model layer only reads the file.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kiln/error.h"
#include "kiln/rope.h"
#include "families/architecture.h"

namespace kiln {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool positive(double v) { return v > 0 && std::isfinite(v); }

// One divisor per rotated pair, as rope_freqs.weight and LongRoPE's tensors hold them.
// Empty when the file has no tensor of that name.
std::vector<float> read_factors(const gguf::File& f, const std::string& name, uint32_t n_rot) {
  const auto fail = [&](const std::string& what) { throw Error(f.path() + ": tensor '" + name + "' " + what); };
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return {};
  const uint64_t want = n_rot / 2;
  if (t->type != TensorType::F32) fail("is " + type_name(t->type) + ", expected F32");
  if (t->dims.size() != 1 || t->dims[0] != want) {
    std::string dims;
    for (uint64_t d : t->dims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    fail("has shape [" + dims + "], expected [" + std::to_string(want) + "] (one factor per pair of the " +
         std::to_string(n_rot) + " rotary dimensions)");
  }
  std::vector<float> out(want);
  std::memcpy(out.data(), t->data, want * sizeof(float));
  for (size_t i = 0; i < want; ++i)
    if (!positive(out[i])) fail("has factor " + num(out[i]) + " at " + std::to_string(i) + "; factors must be positive");
  return out;
}

}  // namespace

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Ntk: return "ntk";
    case RopeScaling::Yarn: return "yarn";
  }
  return "?";
}

std::optional<RopeScaling> parse_rope_scaling(std::string_view name) {
  for (RopeScaling s : {RopeScaling::None, RopeScaling::Linear, RopeScaling::Ntk, RopeScaling::Yarn})
    if (name == rope_scaling_name(s)) return s;
  return std::nullopt;
}

void read_rope_scaling(const gguf::File& f, const std::string& p, ModelConfig& c) {
  const auto fail = [&](const std::string& what) { throw Error(f.path() + ": " + what); };

  // llama.cpp's converters once wrote the factor as rope.scale_linear (type implied).
  std::string factor_key = p + "rope.scaling.factor";
  if (!f.has(factor_key) && f.has(p + "rope.scale_linear")) factor_key = p + "rope.scale_linear";
  const double factor = f.get_float(factor_key, 1.0);
  if (!positive(factor)) fail(factor_key + " must be a positive number, got " + num(factor));
  c.rope_scale = (float)factor;

  const std::string type_key = p + "rope.scaling.type";
  if (f.has(type_key)) {
    const std::string name = f.get_string(type_key);
    const auto type = parse_rope_scaling(name);
    // NTK-aware scaling is a runtime choice (--rope-scaling ntk); no converter writes it.
    if (!type || *type == RopeScaling::Ntk) fail(type_key + " '" + name + "' is not one of none, linear, yarn");
    c.rope_scaling = *type;
  } else {
    c.rope_scaling = factor != 1.0 ? RopeScaling::Linear : RopeScaling::None;
  }

  c.rope_orig_ctx = f.get_u32(p + "rope.scaling.original_context_length", 0);
  const double attn = f.get_float(p + "rope.scaling.attn_factor", 1.0);
  if (!positive(attn)) fail(p + "rope.scaling.attn_factor must be a positive number, got " + num(attn));
  c.rope_attn_factor = (float)attn;

  c.rope_freq_factors = read_factors(f, "rope_freqs.weight", c.n_rot);
}

void read_longrope_factors(const gguf::File& f, ModelConfig& c) {
  const bool has_long = f.find_tensor("rope_factors_long.weight"), has_short = f.find_tensor("rope_factors_short.weight");
  if (!has_long && !has_short) return;
  const auto fail = [&](const std::string& what) { throw Error(f.path() + ": " + what); };
  // llama.cpp would run a lone one for some contexts and none for others; converters write both.
  if (!has_long || !has_short)
    fail(std::string("tensor 'rope_factors_") + (has_long ? "long" : "short") + ".weight' without 'rope_factors_" +
         (has_long ? "short" : "long") + ".weight' (LongRoPE needs both)");
  if (!c.rope_freq_factors.empty()) fail("LongRoPE factors and rope_freqs.weight in one file");
  c.rope_freq_factors = read_factors(f, "rope_factors_short.weight", c.n_rot);
  c.rope_freq_factors_long = read_factors(f, "rope_factors_long.weight", c.n_rot);
}

}  // namespace kiln
