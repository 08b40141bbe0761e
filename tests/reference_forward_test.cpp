// The engine's forward pass against an independent float64 Llama written here with plain
// loops: its own GGUF weight decoding, RMSNorm, RoPE, grouped-query attention, SwiGLU and
// classifier. Nothing of src/runtime or kernels/ is used by the reference, so a shared
// misunderstanding is the only way both can be wrong in the same way; the reference is
// itself pinned to llama.cpp's greedy output for stories260K.
//
// Every decode path (one batch, token by token, several batches, several calls, after a
// truncate) is compared on every position by NMSE = sum (a-b)^2 / sum b^2 and by argmax.
// The kernel table is chosen once per process (KILN_ISA), so other ISAs are checked by
// re-running this binary under each one (ReferenceForwardIsas.EveryOtherIsa).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "model_gen/generate_model.h"
#include "test_util.h"

namespace {

using kiln::TensorType;
using Logits = std::vector<std::vector<double>>;  // [position][vocab]

// ---------------------------------------------------------------------------------------
// Reference: float64 everywhere, weights decoded from the GGUF bytes by this file.

// IEEE binary16 -> double by its definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals
// 2^-14 * m/1024. Written independently of tensor_type.h so that its bugs show up here.
double half_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(double(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(1.0 + double(mant) / 1024.0, exp - 15);
  return sign ? -v : v;
}

// bfloat16 is the top half of a float32: sign, 8-bit exponent, 7-bit mantissa.
double bfloat16_to_double(uint16_t b) {
  const int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0) v = std::ldexp(double(mant), -133);
  else if (exp == 255) v = mant ? NAN : INFINITY;
  else v = std::ldexp(1.0 + double(mant) / 128.0, exp - 127);
  return sign ? -v : v;
}

std::vector<double> tensor_values(const kiln::gguf::File& f, const std::string& name) {
  const kiln::gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw std::runtime_error(f.path() + ": reference: no tensor " + name);
  std::vector<double> out(t->n_elements);
  for (uint64_t i = 0; i < t->n_elements; ++i) {
    if (t->type == TensorType::F32) {
      float v;
      std::memcpy(&v, t->data + 4 * i, 4);
      out[i] = v;
    } else {
      uint16_t v;
      std::memcpy(&v, t->data + 2 * i, 2);
      if (t->type == TensorType::F16) out[i] = half_to_double(v);
      else if (t->type == TensorType::BF16) out[i] = bfloat16_to_double(v);
      else throw std::runtime_error(name + ": reference decodes only F32, F16 and BF16");
    }
  }
  return out;
}

// v to the nearest bfloat16 (8 significant bits), ties to even; below 2^-126 zero.
double round_to_bfloat16(double v) {
  if (std::fabs(v) < std::ldexp(1.0, -126)) return std::copysign(0.0, v);
  int e;
  std::frexp(v, &e);  // v = f 2^e, 0.5 <= |f| < 1
  return std::ldexp(std::nearbyint(std::ldexp(v, 8 - e)), e - 8);
}

// W[rows][cols] with GGUF dims {cols, rows}: y = W x. BF16 weights of an even width take
// their inputs rounded to bfloat16, as the engine promises (kernels/bf16_dot.h: it packs
// such matrices and multiplies them as vdpbf16ps does, as llama.cpp also rounds them).
struct Matrix {
  size_t rows = 0, cols = 0;
  std::vector<double> w;
  bool bf16_inputs = false;

  std::vector<double> operator*(const std::vector<double>& x_in) const {
    std::vector<double> x = x_in, y(rows, 0.0);
    if (bf16_inputs)
      for (double& v : x) v = round_to_bfloat16(v);
    for (size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[c];
      y[r] = s;
    }
    return y;
  }
};

Matrix matrix(const kiln::gguf::File& f, const std::string& name, size_t rows, size_t cols) {
  const kiln::gguf::TensorInfo* t = f.find_tensor(name);
  if (!t || t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows)
    throw std::runtime_error(f.path() + ": reference: " + name + " missing or not [" + std::to_string(rows) +
                             "][" + std::to_string(cols) + "]");
  return {rows, cols, tensor_values(f, name), t->type == TensorType::BF16 && cols % 2 == 0};
}

class ReferenceLlama {
 public:
  explicit ReferenceLlama(const std::string& path) : file_(kiln::gguf::File::open(path)) {
    const kiln::gguf::File& f = *file_;
    const std::string p = f.get_string("general.architecture") + ".";
    dim_ = f.get_uint(p + "embedding_length");
    n_layers_ = f.get_uint(p + "block_count");
    ffn_ = f.get_uint(p + "feed_forward_length");
    n_heads_ = f.get_uint(p + "attention.head_count");
    n_kv_heads_ = f.get_uint(p + "attention.head_count_kv", n_heads_);
    head_dim_ = f.get_uint(p + "attention.key_length", dim_ / n_heads_);
    n_rot_ = f.get_uint(p + "rope.dimension_count", head_dim_);
    eps_ = f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
    theta_base_ = f.get_float(p + "rope.freq_base", 10000.0);

    const kiln::gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
    if (!embd) throw std::runtime_error(path + ": no token_embd.weight");
    n_vocab_ = embd->dims.at(1);
    token_embd_ = matrix(f, "token_embd.weight", n_vocab_, dim_);
    output_norm_ = tensor_values(f, "output_norm.weight");
    // Tied embeddings: the classifier is the embedding table itself.
    output_ = f.find_tensor("output.weight") ? matrix(f, "output.weight", n_vocab_, dim_) : token_embd_;
    const size_t q_dim = n_heads_ * head_dim_, kv_dim = n_kv_heads_ * head_dim_;
    for (size_t l = 0; l < n_layers_; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Layer L;
      L.attn_norm = tensor_values(f, b + "attn_norm.weight");
      L.wq = matrix(f, b + "attn_q.weight", q_dim, dim_);
      L.wk = matrix(f, b + "attn_k.weight", kv_dim, dim_);
      L.wv = matrix(f, b + "attn_v.weight", kv_dim, dim_);
      L.wo = matrix(f, b + "attn_output.weight", dim_, q_dim);
      L.ffn_norm = tensor_values(f, b + "ffn_norm.weight");
      L.w_gate = matrix(f, b + "ffn_gate.weight", ffn_, dim_);
      L.w_up = matrix(f, b + "ffn_up.weight", ffn_, dim_);
      L.w_down = matrix(f, b + "ffn_down.weight", dim_, ffn_);
      layers_.push_back(std::move(L));
    }
    reset();
  }

  size_t n_vocab() const { return n_vocab_; }
  void reset() {
    keys_.assign(n_layers_, {});
    values_.assign(n_layers_, {});
    pos_ = 0;
  }

  // Logits of every position of `tokens`, from position 0.
  Logits forward(const std::vector<int32_t>& tokens) {
    reset();
    Logits out;
    for (int32_t t : tokens) out.push_back(step(t));
    return out;
  }

  // One token at the next position; the cache of past keys/values grows by one.
  std::vector<double> step(int32_t token) {
    std::vector<double> x(token_embd_.w.begin() + size_t(token) * dim_,
                          token_embd_.w.begin() + size_t(token + 1) * dim_);
    const size_t group = n_heads_ / n_kv_heads_;  // query heads per KV head
    for (size_t l = 0; l < n_layers_; ++l) {
      const Layer& L = layers_[l];
      std::vector<double> xn = rms_norm(x, L.attn_norm);
      std::vector<double> q = L.wq * xn, k = L.wk * xn, v = L.wv * xn;
      rope(q, n_heads_);
      rope(k, n_kv_heads_);
      keys_[l].push_back(k);
      values_[l].push_back(v);

      std::vector<double> att(n_heads_ * head_dim_, 0.0);
      const double scale = 1.0 / std::sqrt(double(head_dim_));
      for (size_t h = 0; h < n_heads_; ++h) {
        const size_t kvh = h / group;
        std::vector<double> score(pos_ + 1);  // causal: keys 0..pos only
        for (size_t s = 0; s <= pos_; ++s) {
          double d = 0;
          for (size_t i = 0; i < head_dim_; ++i) d += q[h * head_dim_ + i] * keys_[l][s][kvh * head_dim_ + i];
          score[s] = d * scale;
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (size_t s = 0; s <= pos_; ++s)
          for (size_t i = 0; i < head_dim_; ++i)
            att[h * head_dim_ + i] += score[s] / sum * values_[l][s][kvh * head_dim_ + i];
      }
      const std::vector<double> attn_out = L.wo * att;
      for (size_t i = 0; i < dim_; ++i) x[i] += attn_out[i];

      xn = rms_norm(x, L.ffn_norm);
      std::vector<double> gate = L.w_gate * xn, up = L.w_up * xn;
      for (size_t i = 0; i < ffn_; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];  // SwiGLU
      const std::vector<double> ffn_out = L.w_down * gate;
      for (size_t i = 0; i < dim_; ++i) x[i] += ffn_out[i];
    }
    ++pos_;
    return output_ * rms_norm(x, output_norm_);
  }

 private:
  struct Layer {
    std::vector<double> attn_norm, ffn_norm;
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };

  std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& weight) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps_);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * weight[i];
    return out;
  }

  // GGUF llama files keep Q/K rows permuted so that RoPE rotates adjacent pairs
  // (x[2i], x[2i+1]) of each head by theta_i = pos * base^(-2i/n_rot).
  void rope(std::vector<double>& x, size_t n_heads) const {
    for (size_t h = 0; h < n_heads; ++h)
      for (size_t i = 0; i < n_rot_ / 2; ++i) {
        const double theta = double(pos_) * std::pow(theta_base_, -2.0 * double(i) / double(n_rot_));
        double& a = x[h * head_dim_ + 2 * i];
        double& b = x[h * head_dim_ + 2 * i + 1];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(theta) - b0 * std::sin(theta);
        b = a0 * std::sin(theta) + b0 * std::cos(theta);
      }
  }

  std::unique_ptr<kiln::gguf::File> file_;
  size_t dim_, n_layers_, ffn_, n_heads_, n_kv_heads_, head_dim_, n_rot_, n_vocab_;
  double eps_, theta_base_;
  Matrix token_embd_, output_;
  std::vector<double> output_norm_;
  std::vector<Layer> layers_;
  std::vector<std::vector<std::vector<double>>> keys_, values_;  // [layer][pos][kv_dim]
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------
// The engine's decode paths, each returning [position][vocab] logits as doubles.

const char* current_isa() { return kiln::kernels::isa_name(kiln::kernels::ops().isa); }

// The child runs of EveryOtherIsa look for this line to prove KILN_ISA took effect.
void announce_isa() {
  std::printf("[ kiln isa ] %s\n", current_isa());
  testing::Test::RecordProperty("isa", current_isa());
}

// An f32 KV cache: the float64 reference keeps keys and values exactly (tests/kv_cache_test
// bounds what the smaller cache types add).
kiln::SessionParams params(int32_t n_batch, int32_t n_threads = 2) {
  kiln::SessionParams p;
  p.n_batch = n_batch;
  p.n_threads = n_threads;
  p.kv_type_k = p.kv_type_v = kiln::TensorType::F32;
  return p;
}

void append_rows(Logits& out, std::span<const float> logits, size_t n_vocab) {
  for (size_t at = 0; at < logits.size(); at += n_vocab)
    out.emplace_back(logits.begin() + at, logits.begin() + at + n_vocab);
}

// decode() called once per entry of `calls` (token counts), all_logits each time.
Logits run_calls(const kiln::Model& m, const std::vector<int32_t>& tokens, const kiln::SessionParams& p,
                 const std::vector<size_t>& calls) {
  kiln::Session s(m, p);
  Logits out;
  size_t at = 0;
  for (size_t n : calls) {
    append_rows(out, s.decode(std::span(tokens).subspan(at, n), /*all_logits=*/true), m.config().n_vocab);
    at += n;
  }
  EXPECT_EQ(at, tokens.size());
  EXPECT_EQ(s.n_past(), (int32_t)tokens.size());
  return out;
}

Logits run_token_by_token(const kiln::Model& m, const std::vector<int32_t>& tokens, const kiln::SessionParams& p) {
  kiln::Session s(m, p);
  Logits out;
  for (int32_t t : tokens) append_rows(out, s.decode(std::span(&t, 1)), m.config().n_vocab);
  return out;
}

// The whole sequence, then truncate to half and decode the second half again: the rows
// of the second call must be those of positions half.. (stale cache entries unused).
Logits run_truncate_redecode(const kiln::Model& m, const std::vector<int32_t>& tokens, const kiln::SessionParams& p) {
  kiln::Session s(m, p);
  Logits out;
  const size_t half = tokens.size() / 2;
  append_rows(out, s.decode(std::span(tokens).first(half), true), m.config().n_vocab);
  std::vector<int32_t> junk(tokens.size() - half, tokens[1]);  // fills the cache beyond half
  s.decode(junk);
  s.truncate((int32_t)half);
  append_rows(out, s.decode(std::span(tokens).subspan(half), true), m.config().n_vocab);
  return out;
}

// ---------------------------------------------------------------------------------------
// Comparison.

double nmse(const std::vector<double>& a, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return err / norm;
}

size_t argmax(const std::vector<double>& v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// Gap between the reference's best and second-best logit, relative to the largest |logit|.
double top2_margin(const std::vector<double>& v) {
  double best = -INFINITY, second = -INFINITY, scale = 0;
  for (double x : v) {
    scale = std::max(scale, std::abs(x));
    if (x > best) second = best, best = x;
    else if (x > second) second = x;
  }
  return (best - second) / scale;
}

// float32 arithmetic cannot order two logits closer than this; such a position is not
// an argmax failure (counted and printed, never seen on the models here so far).
constexpr double kTieMargin = 1e-5;

void expect_matches(const std::string& what, const Logits& engine, const Logits& ref, double nmse_bound) {
  ASSERT_EQ(engine.size(), ref.size()) << what;
  double worst = 0, sum = 0, min_margin = INFINITY;
  size_t worst_pos = 0, mismatches = 0, ties = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    ASSERT_EQ(engine[t].size(), ref[t].size()) << what;
    const double e = nmse(engine[t], ref[t]);
    EXPECT_LT(e, nmse_bound) << what << ": position " << t;
    sum += e;
    if (!(e <= worst)) worst = e, worst_pos = t;  // NaN becomes the worst
    min_margin = std::min(min_margin, top2_margin(ref[t]));
    if (argmax(engine[t]) != argmax(ref[t])) {
      if (top2_margin(ref[t]) < kTieMargin) ++ties;
      else ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": argmax differs from the float64 reference";
  std::printf("  %-50s %-7s NMSE max %.2e (pos %2zu) mean %.2e  argmax %zu/%zu (min top-2 margin %.1e)%s\n",
              what.c_str(), current_isa(), worst, worst_pos, sum / double(ref.size()), ref.size() - mismatches - ties,
              ref.size(), min_margin, ties ? (", " + std::to_string(ties) + " near-ties").c_str() : "");
}

// Runs every decode path on `tokens` and compares each with the reference.
void compare_all_paths(const std::string& name, const std::string& path, const std::vector<int32_t>& tokens,
                       double nmse_bound) {
  announce_isa();
  auto model = kiln::Model::load(path);
  ReferenceLlama ref(path);
  ASSERT_EQ(ref.n_vocab(), model->config().n_vocab);
  const Logits want = ref.forward(tokens);
  const size_t T = tokens.size();
  ASSERT_GE(T, 12u) << "the paths below need a dozen positions to differ";

  const Logits batch = run_calls(*model, tokens, params(512), {T});
  expect_matches(name + " one batch", batch, want, nmse_bound);
  struct Path {
    std::string name;
    Logits logits;
    bool batched_only;  // every internal batch has more than one token
  };
  std::vector<Path> paths;
  paths.push_back({"token by token", run_token_by_token(*model, tokens, params(512)), false});
  // n_batch 5 does not divide T, so the last internal batch is a short one.
  paths.push_back({"n_batch 5", run_calls(*model, tokens, params(5), {T}), T % 5 != 1});
  paths.push_back({"calls 1+6+4+rest, n_batch 4", run_calls(*model, tokens, params(4), {1, 6, 4, T - 11}), false});
  paths.push_back({"single thread", run_calls(*model, tokens, params(512, 1), {T}), true});
  paths.push_back({"truncate + re-decode", run_truncate_redecode(*model, tokens, params(3)), false});
  for (const Path& p : paths) {
    expect_matches(name + " " + p.name, p.logits, want, nmse_bound);
    // Stronger than closeness: a gemm row depends only on its weight row and input row
    // (kernels.h), so how tokens are grouped into batches, calls and threads must not
    // change a single bit. Single-token steps take the decode kernel, which sums in
    // another order: those paths are held to the bound above (and to thread-count
    // invariance in the Determinism tests below).
    if (p.batched_only) {
      EXPECT_TRUE(p.logits == batch) << name << " " << p.name << ": logits differ from the one-batch run";
    }
  }

  // Without all_logits, only the last position comes back, also across several batches.
  kiln::Session s(*model, params(5));
  Logits last;
  append_rows(last, s.decode(tokens), model->config().n_vocab);
  expect_matches(name + " last logits only, n_batch 5", last, Logits{want.back()}, nmse_bound);
}

// ---------------------------------------------------------------------------------------
// Models.

std::string stories_path() { return kiln::test::shared_path("models/stories260K.gguf"); }

// A tiny random model written once per process; `tag` names the file.
std::string synthetic_model(const std::string& tag, kiln::gen::GenerateOptions o) {
  static std::map<std::string, std::string> written;
  auto it = written.find(tag);
  if (it != written.end()) return it->second;
  auto vocab = kiln::gguf::File::open(stories_path());
  const std::string path = kiln::test::temp_dir() + "/" + tag + ".gguf";
  kiln::gen::build_model(o, *vocab).write(path);
  return written[tag] = path;
}

kiln::gen::GenerateOptions tiny_options(TensorType type, bool tied) {
  kiln::gen::GenerateOptions o;
  o.shape = *kiln::gen::find_shape("tiny");
  o.type = type;
  o.seed = 1234;
  // Larger than a checkpoint's 0.02 so that on a 72-wide model attention is far from
  // uniform and logits spread (argmax margins of ~1e-2 rather than ~1e-5).
  o.weight_std = 0.12;
  o.norm_jitter = 0.3;  // norms that are not all 1.0, or ignoring them would pass
  o.tie_output = tied;
  return o;
}

std::vector<int32_t> random_tokens(size_t n, int32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t{1};  // BOS
  while (t.size() < n) t.push_back(int32_t(rng() % uint32_t(n_vocab)));
  return t;
}

const char* kStoryText = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

// NMSE bounds. Measured worst position over every path (this machine, GCC 12 -O3):
//                 stories260K F32   tiny F16   tiny BF16   tiny F32 tied   split F16
//   scalar        7.6e-12           2.4e-12    1.8e-7*     1.6e-12         3.2e-12
//   avx2          3.8e-13           1.3e-12    1.8e-7*     5.8e-13         5.0e-13
//   avx512        3.7e-13           6.7e-13    1.8e-7*     4.2e-13         3.1e-13
// (* kNmseBoundBf16 below.) float32 rounding alone gives ~1e-12 (scalar sums serially,
// hence its larger error); 1e-10 leaves a 13x margin over the worst, and real bugs are
// far above it: perturbing a single logit by 0.05 gives 2e-7, a wrong RoPE pairing or GQA
// head map or a dropped norm weight gives > 1e-3.
constexpr double kNmseBoundStories = 1e-10;
constexpr double kNmseBoundSynthetic = 1e-10;
// BF16 weights read their inputs rounded to bfloat16 (Matrix above), and an input within
// float32 rounding of a bfloat16 tie (about 1 in 40000) rounds one way in the engine and
// the other in float64: 2^-8 of that input, NMSE 1.8e-7 at the worst position of tiny BF16
// (mean 4.6e-9; the same bits on every table). 1e-6 still fails every structural bug.
constexpr double kNmseBoundBf16 = 1e-6;

// ---------------------------------------------------------------------------------------

// The reference itself against llama.cpp: its greedy continuation of "Once upon a time"
// must be the published one, or a comparison with it would prove nothing.
TEST(ReferenceForward, ReferenceReproducesLlamaCppGreedyText) {
  auto model = kiln::Model::load(stories_path());
  ReferenceLlama ref(stories_path());
  const std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time", true);
  std::vector<double> logits;
  for (int32_t t : prompt) logits = ref.step(t);
  std::vector<int32_t> generated;
  for (int i = 0; i < 100; ++i) {
    generated.push_back((int32_t)argmax(logits));
    logits = ref.step(generated.back());
  }
  const std::string expected =
      kiln::test::read_file(kiln::test::shared_path("models/expected/stories260K.once-upon-a-time.greedy100.txt"));
  EXPECT_EQ(kiln::test::trim(model->tokenizer().decode(generated)), kiln::test::trim(expected));
}

TEST(ReferenceForward, Stories260K) {
  auto model = kiln::Model::load(stories_path());
  const std::vector<int32_t> tokens = model->tokenizer().encode(kStoryText, true);
  ASSERT_EQ(tokens.front(), model->tokenizer().bos());
  compare_all_paths("stories260K F32", stories_path(), tokens, kNmseBoundStories);
}

TEST(ReferenceForward, TinyF16) {
  const std::string path = synthetic_model("tiny-f16", tiny_options(TensorType::F16, false));
  compare_all_paths("tiny F16 (GQA 4:2, untied)", path, random_tokens(40, 512, 7), kNmseBoundSynthetic);
}

TEST(ReferenceForward, TinyBF16) {
  const std::string path = synthetic_model("tiny-bf16", tiny_options(TensorType::BF16, false));
  compare_all_paths("tiny BF16 (GQA 4:2, untied)", path, random_tokens(40, 512, 8), kNmseBoundBf16);
}

TEST(ReferenceForward, TinyF32Tied) {
  const std::string path = synthetic_model("tiny-f32-tied", tiny_options(TensorType::F32, true));
  compare_all_paths("tiny F32 (tied output)", path, random_tokens(40, 512, 9), kNmseBoundSynthetic);
}

// ---------------------------------------------------------------------------------------
// Determinism: the kernel contract says a gemm row never depends on how rows were split
// between threads, so greedy decoding must give the same tokens, and the same logit
// bits, at any thread count.

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // of every step
};

GreedyRun greedy(const kiln::Model& m, const std::vector<int32_t>& prompt, int32_t n_threads, int steps) {
  kiln::Session s(m, params(512, n_threads));
  EXPECT_EQ(s.n_threads(), n_threads);
  GreedyRun run;
  std::span<const float> logits = s.decode(prompt);
  for (int i = 0; i < steps; ++i) {
    run.logits.emplace_back(logits.begin(), logits.end());
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(next);
    logits = s.decode(std::span(&next, 1));
  }
  return run;
}

void expect_thread_count_invariant(const std::string& path) {
  announce_isa();
  auto model = kiln::Model::load(path);
  const std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time", true);
  const GreedyRun one = greedy(*model, prompt, 1, 40), two = greedy(*model, prompt, 2, 40);
  EXPECT_EQ(one.tokens, two.tokens);
  for (size_t i = 0; i < one.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(one.logits[i].data(), two.logits[i].data(), one.logits[i].size() * sizeof(float)))
        << "logits of step " << i << " differ between 1 and 2 threads";
}

TEST(Determinism, Stories260KGreedyThreads1vs2) { expect_thread_count_invariant(stories_path()); }

// stories260K's matrices are all below the size at which the runtime splits a gemm
// between threads; this one's (256x256 and up) are split, so the invariance is real.
TEST(Determinism, ThreadSplitModelGreedyThreads1vs2) {
  kiln::gen::GenerateOptions o = tiny_options(TensorType::F16, false);
  o.shape = {"split", 256, 2, 8, 2, 688, 256, 10000.0f, 1e-5f};
  o.weight_std = 0.06;
  const std::string path = synthetic_model("split-f16", o);
  expect_thread_count_invariant(path);
  auto model = kiln::Model::load(path);
  ReferenceLlama ref(path);
  const std::vector<int32_t> tokens = random_tokens(24, 512, 11);
  expect_matches("split F16 one batch, 2 threads", run_calls(*model, tokens, params(512, 2), {tokens.size()}),
                 ref.forward(tokens), kNmseBoundSynthetic);
}

// ---------------------------------------------------------------------------------------
// Every other ISA: this binary again, under KILN_ISA, running the tests above.

TEST(ReferenceForwardIsas, EveryOtherIsa) {
  const auto isas = kiln::kernels::available_isas();
  // Resolved here: inside the shell, /proc/self/exe would be the shell.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  size_t ran = 0;
  for (kiln::kernels::Isa isa : isas) {
    if (isa == kiln::kernels::ops().isa) continue;
    const std::string name = kiln::kernels::isa_name(isa);
    const auto r = kiln::test::run_command("KILN_ISA=" + name + " " + kiln::test::shell_quote(self) +
                                           " --gtest_filter='ReferenceForward.*:Determinism.*' --gtest_color=no 2>&1");
    std::printf("---- KILN_ISA=%s ----\n", name.c_str());
    for (size_t at = 0; at < r.out.size();) {  // the NMSE lines and failures only
      const size_t end = std::min(r.out.find('\n', at), r.out.size());
      const std::string line = r.out.substr(at, end - at);
      if (line.rfind("  ", 0) == 0 || line.find("Failure") != std::string::npos || line.find("FAILED") != std::string::npos)
        std::printf("%s\n", line.c_str());
      at = end + 1;
    }
    EXPECT_EQ(r.exit_code, 0) << "KILN_ISA=" << name << " run failed:\n" << r.out;
    EXPECT_NE(r.out.find("[ kiln isa ] " + name), std::string::npos) << "KILN_ISA=" << name << " did not take effect";
    EXPECT_NE(r.out.find("[  PASSED  ]"), std::string::npos) << r.out;
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "only " << current_isa() << " is available on this CPU";
}

}  // namespace
