// Sliding-window attention: windows read from GGUF keys or set per session, the ring-buffer
// cache of window layers against a full-size cache with the same masks (--swa-full), and
// the mask itself against an independent fact: a one-layer model's output at position p
// depends only on tokens (p - W, p], so it equals a fresh run of just those tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "kiln/error.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/session_file.h"
#include "model_gen/generate_model.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::stories;

using test::long_tokens;

struct Opts {
  int32_t window = 48, pattern = -1;
  bool full = false, paged = false;
  FlashAttention fa = FlashAttention::off;
  int32_t n_batch = 512, n_threads = 2, n_ctx = 1024;
  TensorType kv = TensorType::F32;
};

SessionParams params(const Opts& o) {
  SessionParams p;
  p.n_ctx = o.n_ctx;
  p.n_batch = o.n_batch;
  p.n_threads = o.n_threads;
  p.kv_type_k = p.kv_type_v = o.kv;
  p.flash_attn = o.fa;
  p.swa_window = o.window;
  p.swa_pattern = o.pattern;
  p.swa_full = o.full;
  if (o.paged) p.kv_layout = KvLayout::paged, p.kv_block = 16;
  return p;
}

// Logits of every position of `tokens`: one decode call (in n_batch batches), or token by token.
std::vector<float> logits(const Model& m, const SessionParams& p, const std::vector<int32_t>& tokens, bool by_token) {
  Session s(m, p);
  std::vector<float> out;
  if (!by_token) {
    auto l = s.decode(tokens, true);
    return {l.begin(), l.end()};
  }
  for (int32_t t : tokens) {
    auto l = s.decode(std::span(&t, 1));
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// The worst over positions of |got - want|^2 / |want|^2.
double worst_nmse(const std::vector<float>& got, const std::vector<float>& want, size_t n_vocab) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t at = 0; at + n_vocab <= std::min(got.size(), want.size()); at += n_vocab) {
    double err = 0, norm = 0;
    for (size_t i = at; i < at + n_vocab; ++i) err += std::pow(double(got[i]) - want[i], 2), norm += double(want[i]) * want[i];
    worst = std::max(worst, err / norm);
  }
  return worst;
}

std::vector<int32_t> greedy(const Model& m, const SessionParams& p, int n) {
  Session s(m, p);
  std::vector<int32_t> out = m.tokenizer().encode("Once upon a time", true);
  auto l = s.decode(out);
  for (int i = 0; i < n; ++i) {
    out.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
    l = s.decode(std::span(&out.back(), 1));
  }
  return out;
}

std::string write_model(const std::string& name, gen::GenerateOptions o,
                        const std::function<void(gguf::Writer&)>& edit = {}) {
  const std::string path = test::temp_dir() + "/" + name;
  gguf::Writer w = gen::build_model(o, *gguf::File::open(test::shared_path("models/stories260K.gguf")));
  if (edit) edit(w);
  w.write(path);
  return path;
}

gen::GenerateOptions tiny(const std::string& shape, uint32_t layers) {
  gen::GenerateOptions o = gen::peaky_options(shape, 7);
  o.shape.n_layers = layers;
  return o;
}

TEST(SlidingWindowConfig, ReadFromTheFileAndOverridden) {
  gen::GenerateOptions o = tiny("tiny", 6);
  auto none = Model::load(write_model("none.gguf", o));
  EXPECT_TRUE(none->config().swa_window.empty());
  o.shape.swa_window = 32;
  auto all = Model::load(write_model("all.gguf", o));
  EXPECT_EQ(all->config().swa_window, std::vector<uint32_t>(6, 32));
  o.shape.swa_pattern = 3;  // every third layer global
  auto pattern = Model::load(write_model("pattern.gguf", o));
  EXPECT_EQ(pattern->config().swa_window, (std::vector<uint32_t>{32, 32, 0, 32, 32, 0}));
  // The per-layer form: booleans, true for a sliding layer.
  auto array = Model::load(write_model("array.gguf", o, [](gguf::Writer& w) {
    std::vector<gguf::Value> slides;
    for (bool b : {false, true, true, false, true, false}) slides.push_back(gguf::Value::of_bool(b));
    w.set("llama.attention.sliding_window_pattern", gguf::Value::of_array(gguf::ValueType::BOOL, slides));
  }));
  EXPECT_EQ(array->config().swa_window, (std::vector<uint32_t>{0, 32, 32, 0, 32, 0}));

  // Session overrides: a new size keeps the model's pattern; a pattern picks other layers.
  const auto windows = [](const Model& m, int32_t w, int32_t pat) {
    Opts o;
    o.window = w, o.pattern = pat, o.n_ctx = 256;
    Session s(m, params(o));
    std::vector<uint32_t> out;
    for (uint32_t l = 0; l < m.config().n_layers; ++l) out.push_back(s.layer_window(int32_t(l)));
    return out;
  };
  EXPECT_EQ(windows(*pattern, -1, -1), (std::vector<uint32_t>{32, 32, 0, 32, 32, 0}));
  EXPECT_EQ(windows(*pattern, 8, -1), (std::vector<uint32_t>{8, 8, 0, 8, 8, 0}));
  EXPECT_EQ(windows(*pattern, -1, 2), (std::vector<uint32_t>{32, 0, 32, 0, 32, 0}));
  EXPECT_EQ(windows(*pattern, 0, -1), std::vector<uint32_t>(6, 0));
  EXPECT_EQ(windows(*none, 16, -1), std::vector<uint32_t>(6, 16));
  EXPECT_THROW(windows(*none, -1, 2), Error);  // a pattern with no window to apply
}

// The mask, checked without kiln's own masked attention: in a one-layer model position p
// sees tokens (p - W, p] only, and RoPE (relative) and ALiBi (relative) make their
// absolute positions irrelevant, so the logits equal those of a fresh run of those tokens.
TEST(SlidingWindow, OneLayerOutputDependsOnlyOnTheWindow) {
  const auto& tokens = long_tokens();
  const std::vector<int32_t> seq(tokens.begin(), tokens.begin() + 90);
  const int32_t W = 16;
  // The window set by the session, and (Mistral) by a llama file's attention.sliding_window,
  // which llama.cpp's llama architecture ignores: this is the reference for that key.
  for (const auto& [shape, from_file] : {std::pair{"tiny", false}, {"mpt-tiny", false}, {"tiny", true}}) {
    gen::GenerateOptions g = tiny(shape, 1);
    if (from_file) g.shape.swa_window = W;
    auto model = Model::load(write_model(std::string(shape) + (from_file ? "-key" : "") + "-1.gguf", g));
    const size_t n_vocab = model->config().n_vocab;
    for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
      SCOPED_TRACE(std::string(shape) + (from_file ? " window from the file" : "") +
                   (fa == FlashAttention::on ? " tiled" : " direct"));
      Opts o;
      o.window = from_file ? -1 : W, o.fa = fa, o.n_ctx = 128, o.n_batch = 32;
      const auto all = logits(*model, params(o), seq, false);
      Opts plain = o;
      plain.window = from_file ? 0 : -1;
      const auto unwindowed = logits(*model, params(plain), seq, false);
      for (size_t p : {size_t(W) + 3, size_t(50), seq.size() - 1}) {
        const std::vector<int32_t> recent(seq.begin() + ptrdiff_t(p + 1 - W), seq.begin() + ptrdiff_t(p + 1));
        const auto fresh = logits(*model, params(plain), recent, false);  // no mask at all
        const std::vector<float> want(fresh.end() - ptrdiff_t(n_vocab), fresh.end());
        const std::vector<float> got(all.begin() + ptrdiff_t(p * n_vocab), all.begin() + ptrdiff_t((p + 1) * n_vocab));
        const std::vector<float> full(unwindowed.begin() + ptrdiff_t(p * n_vocab),
                                      unwindowed.begin() + ptrdiff_t((p + 1) * n_vocab));
        EXPECT_LT(worst_nmse(got, want, n_vocab), 1e-9) << "position " << p;
        EXPECT_GT(worst_nmse(full, want, n_vocab), 1e-4) << "without the window the check cannot fail";
      }
    }
  }
}

// The ring buffer against a full-size cache with the same masks: every position's logits,
// prefill in several batch sizes (a batch of n_batch keeps the ring at W + n_batch - 1
// slots) and token by token, both attention paths, an alternating pattern too.
TEST(SlidingWindow, RingEqualsMaskedFullCache) {
  const auto& tokens = long_tokens();
  const size_t n_vocab = stories().config().n_vocab;
  for (int32_t pattern : {-1, 2}) {
    for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
      Opts full;
      full.pattern = pattern, full.fa = fa, full.full = true;
      const auto want = logits(stories(), params(full), tokens, false);
      Opts plain = full;
      plain.window = -1, plain.pattern = -1;
      EXPECT_GT(worst_nmse(logits(stories(), params(plain), tokens, false), want, n_vocab), 1e-3)
          << "the window changes nothing: is it applied?";
      for (int32_t n_batch : {512, 64, 7, 1}) {
        SCOPED_TRACE("pattern " + std::to_string(pattern) + (fa == FlashAttention::on ? " tiled" : " direct") +
                     " n_batch " + std::to_string(n_batch));
        Opts ring = full;
        ring.full = false, ring.n_batch = n_batch;
        const double e = worst_nmse(logits(stories(), params(ring), tokens, n_batch == 1), want, n_vocab);
        std::printf("[ nmse ] pattern %d %s n_batch %d: %.3g\n", pattern, fa == FlashAttention::on ? "tiled" : "direct",
                    n_batch, e);
        EXPECT_LT(e, 1e-10);
        Session s(stories(), params(ring));
        EXPECT_LT(s.kv_cache_bytes(), Session(stories(), params(full)).kv_cache_bytes());
      }
    }
  }
}

// The paged layout has no rings: a window is a mask over every position it holds. It gives
// the full-size cache's logits whatever the batch, and sequences forked from a shared
// prompt and decoded side by side give what each gives alone.
TEST(SlidingWindow, PagedMasksLikeTheFullCache) {
  const auto& tokens = long_tokens();
  const size_t n_vocab = stories().config().n_vocab;
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Opts full;
    full.pattern = 2, full.fa = fa, full.full = true;
    const auto want = logits(stories(), params(full), tokens, false);
    for (int32_t n_batch : {512, 7, 1}) {
      SCOPED_TRACE(std::string(fa == FlashAttention::on ? "tiled" : "direct") + " n_batch " + std::to_string(n_batch));
      Opts paged = full;
      paged.full = false, paged.paged = true, paged.n_batch = n_batch;
      EXPECT_LT(worst_nmse(logits(stories(), params(paged), tokens, n_batch == 1), want, n_vocab), 1e-10);
    }
    // Two forks of a 40-token prompt (shared blocks), each continued by its own tokens
    // past the window of 48, decoded in parallel steps.
    Opts paged = full;
    paged.full = false, paged.paged = true;
    Session s(stories(), params(paged));
    const size_t prompt = 40, steps = 30;
    s.decode(std::span(tokens.data(), prompt));
    const int32_t other = s.fork_sequence(0);
    const int32_t seqs[2] = {0, other};
    std::vector<float> got[2];
    for (size_t i = 0; i < steps; ++i) {
      const int32_t step[2] = {tokens[prompt + i], tokens[prompt + steps + i]};
      const auto rows = s.decode_parallel(seqs, step);
      for (int k = 0; k < 2; ++k) got[k].insert(got[k].end(), rows.begin() + ptrdiff_t(k * n_vocab), rows.begin() + ptrdiff_t((k + 1) * n_vocab));
    }
    for (int k = 0; k < 2; ++k) {
      std::vector<int32_t> alone(tokens.begin(), tokens.begin() + ptrdiff_t(prompt));
      alone.insert(alone.end(), tokens.begin() + ptrdiff_t(prompt + k * steps), tokens.begin() + ptrdiff_t(prompt + (k + 1) * steps));
      const auto all = logits(stories(), params(full), alone, false);
      const std::vector<float> tail(all.end() - ptrdiff_t(steps * n_vocab), all.end());
      EXPECT_LT(worst_nmse(got[k], tail, n_vocab), 1e-10) << "sequence " << k;
    }
  }
}

TEST(SlidingWindow, RingSameGreedyTextAndThreadCountChangesNothing) {
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Opts ring;
    ring.window = 24, ring.fa = fa, ring.n_batch = 16;
    Opts full = ring;
    full.full = true;
    EXPECT_EQ(greedy(stories(), params(ring), 400), greedy(stories(), params(full), 400));
    Opts one = ring;
    one.n_threads = 1;
    EXPECT_EQ(logits(stories(), params(one), long_tokens(), true), logits(stories(), params(ring), long_tokens(), true));
  }
}

TEST(SlidingWindow, WindowAtLeastTheContextIsNoWindow) {
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Opts w;
    w.window = 1024, w.fa = fa;
    Opts none = w;
    none.window = -1;
    EXPECT_EQ(logits(stories(), params(w), long_tokens(), false), logits(stories(), params(none), long_tokens(), false));
  }
}

// Window layers hold W + n_batch - 1 positions whatever the context; global ones grow.
TEST(SlidingWindow, RingMemoryStopsGrowing) {
  const auto layer_bytes = [](int32_t n_ctx) {
    Opts o;
    o.window = 64, o.pattern = 2, o.n_batch = 64, o.n_ctx = n_ctx;
    Session s(stories(), params(o));
    std::vector<double> bytes;
    double sum = 0;
    for (int32_t l = 0; l < 5; ++l) bytes.push_back(s.kv_cache_layer_bytes(l)), sum += bytes.back();
    EXPECT_EQ(sum, s.kv_cache_bytes());
    return bytes;
  };
  const auto small = layer_bytes(512), large = layer_bytes(4096);
  const double row = 32 * 4 * 2;  // keys and values of one position, f32
  for (int l : {0, 2, 4}) {  // sliding
    EXPECT_EQ(small[l], (64 + 63) * row);
    EXPECT_EQ(large[l], small[l]);
  }
  for (int l : {1, 3}) {  // global
    EXPECT_EQ(small[l], 512 * row);
    EXPECT_EQ(large[l], 4096 * row);
  }
}

// Context shift on a ring layer rebuilds it from what it holds: the same logits as the
// full-size cache after the shift; refused when the window would need overwritten rows.
TEST(SlidingWindow, ContextShiftOnARing) {
  const auto& tokens = long_tokens();
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 250), next(tokens.begin() + 250, tokens.begin() + 300);
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Opts ring;
    ring.window = 32, ring.fa = fa, ring.n_ctx = 256, ring.n_batch = 16;
    Opts full = ring;
    full.full = true;
    const auto run = [&](const Opts& o) {
      Session s(stories(), params(o));
      s.decode(first);
      s.shift_context(1, 100);
      EXPECT_EQ(s.n_past(), 150);
      std::vector<float> out;
      for (int32_t t : next) {
        auto l = s.decode(std::span(&t, 1));
        out.insert(out.end(), l.begin(), l.end());
      }
      return out;
    };
    EXPECT_LT(worst_nmse(run(ring), run(full), stories().config().n_vocab), 1e-10);

    Session s(stories(), params(ring));
    s.decode(first);  // the ring (47 slots) holds positions 203..249
    try {
      s.shift_context(230, 20);  // position 230's window reaches back to 199
      ADD_FAILURE() << "a shift the ring cannot serve";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--swa-full"), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.n_past(), 250);
    Session f(stories(), params(full));
    f.decode(first);
    f.shift_context(230, 20);
    EXPECT_EQ(f.n_past(), 230);
  }
}

// Truncating within what the ring holds keeps the cache; further back starts over.
TEST(SlidingWindow, TruncateARing) {
  const auto& tokens = long_tokens();
  Opts o;
  o.window = 32, o.n_batch = 16, o.n_ctx = 512;
  Session s(stories(), params(o));
  s.decode(std::vector<int32_t>(tokens.begin(), tokens.begin() + 300));
  s.truncate(290);
  EXPECT_EQ(s.n_past(), 290);
  auto got = s.decode(std::span(&tokens[290], 1));
  const std::vector<float> got_copy(got.begin(), got.end());
  Session fresh(stories(), params(o));
  fresh.decode(std::vector<int32_t>(tokens.begin(), tokens.begin() + 290));
  auto want = fresh.decode(std::span(&tokens[290], 1));
  // Batches cut elsewhere sum the masked products in another order: rounding only.
  EXPECT_LT(worst_nmse(got_copy, std::vector<float>(want.begin(), want.end()), stories().config().n_vocab), 1e-10);
  s.truncate(100);  // the ring no longer holds 69..99
  EXPECT_EQ(s.n_past(), 0);
}

// Session files: ring and full-size caches of the same windows load each other's states;
// a session with other windows refuses them.
TEST(SlidingWindow, SessionFiles) {
  const auto& tokens = long_tokens();
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 300);
  const std::vector<int32_t> next{tokens[300]};
  const size_t n_vocab = stories().config().n_vocab;
  for (FlashAttention fa : {FlashAttention::off, FlashAttention::on}) {
    Opts ring;
    ring.window = 32, ring.fa = fa, ring.n_ctx = 512, ring.n_batch = 16;
    Opts full = ring;
    full.full = true;
    const std::string path = test::temp_dir() + "/ring.kiln";
    Session a(stories(), params(ring));
    a.decode(prompt);
    save_session_file(path, a, prompt, "");
    auto w = a.decode(next);
    const std::vector<float> want(w.begin(), w.end());

    Session b(stories(), params(ring));
    load_session_file(path, b);
    auto g = b.decode(next);
    EXPECT_EQ(std::vector<float>(g.begin(), g.end()), want);

    Session c(stories(), params(full));
    load_session_file(path, c);
    auto h = c.decode(next);
    EXPECT_LT(worst_nmse(std::vector<float>(h.begin(), h.end()), want, n_vocab), 1e-10);

    Opts other = ring;
    other.window = -1;
    Session d(stories(), params(other));
    try {
      load_session_file(path, d);
      ADD_FAILURE() << "a cache saved with windows was loaded without them";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sliding windows"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
