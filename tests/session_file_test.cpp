// Session files: a restored KV cache must continue a conversation exactly as the original
// session would (bitwise-equal logits), and every damaged, foreign or hostile file must be
// refused with one line naming it while the session it was loaded into stays as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "kiln/model.h"
#include "kiln/session.h"
#include "kiln/session_file.h"
#include "model_gen/generate_model.h"
#include "quantize/quantize_model.h"
#include "util/hash64.h"
#include "stories_fixture.h"
#include "test_util.h"

using namespace kiln;

namespace {

std::string stories_path() { return test::shared_path("models/stories260K.gguf"); }

const Model& stories() {
  static const std::unique_ptr<Model> m = Model::load(stories_path());
  return *m;
}

// stories260K quantized to Q8_0: the same model in another weight file.
const std::string& stories_q8_path() {
  static const std::string path = [] {
    const std::string out = test::temp_dir() + "/stories260K-q8_0.gguf";
    quantize::quantize_model(stories_path(), out, *quantize::find_preset("Q8_0"), 1);
    return out;
  }();
  return path;
}

std::string random_model(uint64_t seed) {
  const auto vocab = gguf::File::open(stories_path());
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("tiny");
  o.type = TensorType::F32;
  o.seed = seed;
  const std::string path = test::temp_dir() + "/random-" + std::to_string(seed) + ".gguf";
  gen::build_model(o, *vocab).write(path);
  return path;
}

SessionParams params(int32_t n_ctx) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  return p;
}

std::vector<int32_t> prompt_tokens() { return stories().tokenizer().encode("Once upon a time, there was a little girl", true); }

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

std::string path_in_temp(const std::string& name) { return test::temp_dir() + "/" + name; }

// A saved conversation: the prompt in the cache plus the sampled next token, not decoded.
struct Saved {
  std::string path;
  std::vector<int32_t> tokens;
  std::string app_data;
};

const Saved& saved_prompt() {
  static const Saved s = [] {
    Session session(stories(), params(128));
    Saved out;
    out.tokens = prompt_tokens();
    out.tokens.push_back(argmax(session.decode(out.tokens)));
    // NUL bytes and UTF-8 both survive: the blob is opaque bytes.
    out.app_data = std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"h\xc3\xa9llo\"}]}\0tail", 55);
    out.path = path_in_temp("prompt.kses");
    save_session_file(out.path, session, out.tokens, out.app_data);
    return out;
  }();
  return s;
}

std::string write_variant(const std::string& name, const std::string& bytes) {
  const std::string path = path_in_temp(name);
  test::write_file(path, bytes);
  return path;
}

template <typename T>
void poke(std::string& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

// Recomputes both checksums so that only the field a test changed is wrong: what a
// crafted (not merely damaged) file looks like.
void reseal(std::string& b) {
  poke<uint64_t>(b, 72, Hash64::of(b.data() + 96, b.size() - 96));
  poke<uint64_t>(b, 88, Hash64::of(b.data(), 88));
}

// A session holding a few tokens, to check that refusals leave it alone.
struct Victim {
  Session session{stories(), params(32)};
  std::vector<int32_t> history{1, 403, 407};
  Victim() { session.decode(history); }

  void expect_refused(const std::string& path, const std::string& fragment) {
    try {
      load_session_file(path, session);
      ADD_FAILURE() << "no error for " << path << " (expected '" << fragment << "')";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    EXPECT_EQ(session.n_past(), int32_t(history.size()));
  }

  // The cache itself is untouched too: the next token gives what a fresh run gives.
  void expect_cache_intact() {
    Session fresh(stories(), params(32));
    fresh.decode(history);  // in the same batches: a batch of 4 may round differently
    const std::vector<int32_t> next{500};
    const auto want = copy(fresh.decode(next));
    expect_same_bits(copy(session.decode(next)), want);
  }
};

}  // namespace

TEST(Hash64, MatchesReferenceXxh64) {
  // From the reference libxxhash 0.8.1, XXH64(data, len, 0).
  EXPECT_EQ(Hash64::of("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(Hash64::of("a", 1), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(Hash64::of("abc", 3), 0x44bc2cf5ad770999ull);
  std::string hundred(100, 0), thousand(1000, 0);
  for (int i = 0; i < 100; ++i) hundred[i] = char(i);
  for (int i = 0; i < 1000; ++i) thousand[i] = char(i * 7 % 256);
  EXPECT_EQ(Hash64::of(hundred.data(), hundred.size()), 0x6ac1e58032166597ull);
  EXPECT_EQ(Hash64::of(thousand.data(), thousand.size()), 0x25275608a9cfc168ull);
  // Any split into updates gives the one-piece digest.
  for (size_t step : {1, 3, 7, 31, 32, 33, 100}) {
    Hash64 h;
    for (size_t at = 0; at < thousand.size(); at += step) h.update(thousand.data() + at, std::min(step, thousand.size() - at));
    EXPECT_EQ(h.digest(), 0x25275608a9cfc168ull) << step;
  }
}

TEST(ModelIdentity, StableAcrossLoadsAndPacking) {
  const auto a = Model::load(stories_path());
  LoadParams no_repack;
  no_repack.repack = false;
  const auto b = Model::load(stories_path(), no_repack);
  EXPECT_EQ(a->identity(), stories().identity());
  EXPECT_EQ(b->identity(), stories().identity());
  EXPECT_EQ(a->identity_hex().size(), 16u);
  EXPECT_EQ(a->identity_hex().find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(ModelIdentity, DiffersBetweenWeightFiles) {
  const auto q8 = Model::load(stories_q8_path());
  EXPECT_NE(q8->identity(), stories().identity());
  EXPECT_EQ(Model::load(stories_q8_path())->identity(), q8->identity());
  // Same shapes, types and vocabulary; only the random weights differ.
  const uint64_t seed1 = Model::load(random_model(1))->identity(), seed2 = Model::load(random_model(2))->identity();
  EXPECT_NE(seed1, seed2);
  EXPECT_NE(seed1, stories().identity());
}

TEST(ModelIdentity, FollowsTheTokenizer) {
  auto m = Model::load(stories_path());
  m->replace_tokenizer(Tokenizer::from_spm_file(test::shared_path("models/tok512.model")));
  // Same pieces as the GGUF's vocabulary: same identity; the point is that it is
  // recomputed, which a differing vocabulary would show.
  const auto& a = m->tokenizer().vocab().tokens;
  const auto& b = stories().tokenizer().vocab().tokens;
  EXPECT_EQ(m->identity() == stories().identity(), a == b);
}

TEST(SessionKvState, InMemoryRoundTripAndRefusals) {
  Session a(stories(), params(64));
  const std::vector<int32_t> tokens = prompt_tokens();
  a.decode(tokens);
  std::vector<uint8_t> state;
  a.write_kv_state([&](const void* p, size_t n) { state.insert(state.end(), (const uint8_t*)p, (const uint8_t*)p + n); });
  const KvStateDesc desc = a.kv_state_desc(a.n_past());
  ASSERT_EQ(state.size(), desc.bytes());
  EXPECT_EQ(desc.kv_type, 1u | 1u << 3) << "the default cache: f16 keys, f16 values transposed";
  EXPECT_EQ(desc.n_layers, stories().config().n_layers);

  Session b(stories(), params(int32_t(tokens.size()) + 1));  // the state and one more token
  const std::vector<int32_t> one{1};
  b.decode(one);
  EXPECT_THROW(b.read_kv_state(desc, std::span(state).first(state.size() - 1)), Error);
  KvStateDesc other = desc;
  other.kv_type = 1;
  EXPECT_THROW(b.read_kv_state(other, state), Error);
  Session small(stories(), params(int32_t(tokens.size()) - 1));
  EXPECT_THROW(small.read_kv_state(desc, state), Error);
  EXPECT_EQ(b.n_past(), 1);
  // A source failing half-way leaves a cache that matches nothing: the session is reset.
  EXPECT_THROW(b.read_kv_state(desc, [](void*, size_t) { throw Error("disk gone"); }), Error);
  EXPECT_EQ(b.n_past(), 0);

  b.read_kv_state(desc, state);
  ASSERT_EQ(b.n_past(), a.n_past());
  Session c(stories(), params(64));
  c.decode(tokens);
  const std::vector<int32_t> next{403};
  expect_same_bits(copy(b.decode(next)), copy(c.decode(next)));
}

TEST(SessionFile, RoundTripGivesIdenticalLogits) {
  const Saved& saved = saved_prompt();
  const std::vector<int32_t> cached(saved.tokens.begin(), saved.tokens.end() - 1);
  const std::vector<int32_t> pending{saved.tokens.back()};

  Session original(stories(), params(128));
  original.decode(cached);
  const auto want = copy(original.decode(pending));

  for (int32_t n_ctx : {128, 512}) {
    SCOPED_TRACE(n_ctx);
    Session restored(stories(), params(n_ctx));
    const LoadedSession loaded = load_session_file(saved.path, restored);
    EXPECT_EQ(loaded.tokens, saved.tokens);
    EXPECT_EQ(loaded.app_data, saved.app_data);
    EXPECT_EQ(loaded.info.version, 1u);
    EXPECT_EQ(loaded.info.model_identity, stories().identity());
    EXPECT_EQ(loaded.info.n_ctx, 128);
    EXPECT_EQ(loaded.info.n_tokens, int32_t(saved.tokens.size()));
    EXPECT_EQ(loaded.info.n_cached, int32_t(cached.size()));
    ASSERT_EQ(restored.n_past(), int32_t(cached.size()));
    expect_same_bits(copy(restored.decode(pending)), want);

    // And the conversation goes on identically, token after token.
    Session again(stories(), params(128));
    again.decode(cached);
    std::vector<float> a = copy(again.decode(pending)), b = want;
    for (int i = 0; i < 8; ++i) {
      const std::vector<int32_t> next{argmax(a)};
      a = copy(again.decode(next));
      b = copy(restored.decode(next));
      expect_same_bits(a, b);
    }
  }
}

TEST(SessionFile, InfoReadsTheHeaderOnly) {
  const Saved& saved = saved_prompt();
  const SessionFileInfo info = read_session_file_info(saved.path);
  EXPECT_EQ(info.version, 1u);
  EXPECT_EQ(info.model_identity, stories().identity());
  EXPECT_EQ(info.n_ctx, 128);
  EXPECT_EQ(info.n_tokens, int32_t(saved.tokens.size()));
  EXPECT_EQ(info.n_cached, int32_t(saved.tokens.size()) - 1);
}

TEST(SessionFile, EmptySessionAndOverwrite) {
  const std::string path = path_in_temp("empty.kses");
  Session empty(stories(), params(16));
  save_session_file(path, empty, {}, "");
  Session target(stories(), params(16));
  const std::vector<int32_t> some{1, 403};
  target.decode(some);
  const LoadedSession loaded = load_session_file(path, target);
  EXPECT_TRUE(loaded.tokens.empty());
  EXPECT_TRUE(loaded.app_data.empty());
  EXPECT_EQ(target.n_past(), 0);

  // Saving again replaces the file whole and leaves no temporary behind.
  save_session_file(path, target, some, "x");
  EXPECT_EQ(load_session_file(path, empty).tokens, some);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SessionFile, SaveErrorsNameTheFile) {
  Session s(stories(), params(16));
  const std::vector<int32_t> tokens{1, 403, 407};
  s.decode(tokens);
  const std::string missing_dir = path_in_temp("no-such-dir/a.kses");
  try {
    save_session_file(missing_dir, s, tokens, "");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(missing_dir + ": cannot write", 0), 0u) << e.what();
  }
  // The cache holds 3 positions: 2 tokens cannot describe it.
  const std::string path = path_in_temp("short.kses");
  EXPECT_THROW(save_session_file(path, s, std::span(tokens).first(2), ""), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SessionFile, CorruptedPayloadIsRefused) {
  const std::string good = test::read_file(saved_prompt().path);
  Victim v;
  // A byte in the tokens, the app data, the first and the last KV bytes.
  for (size_t at : {size_t(96 + 5), size_t(96 + 4 * saved_prompt().tokens.size() + 3), size_t(96 + 200), good.size() - 1}) {
    std::string bad = good;
    bad[at] ^= 0x20;
    v.expect_refused(write_variant("flip.kses", bad), "corrupted (checksum mismatch)");
  }
  std::string header = good;
  header[28] ^= 1;  // n_tokens
  v.expect_refused(write_variant("header.kses", header), "corrupted (header checksum mismatch)");
  v.expect_cache_intact();
}

TEST(SessionFile, TruncatedOrExtendedIsRefused) {
  const std::string good = test::read_file(saved_prompt().path);
  Victim v;
  v.expect_refused(write_variant("cut0.kses", ""), "not a kiln session file");
  for (size_t cut : {size_t(1), size_t(4), size_t(8), size_t(11), size_t(12), size_t(50), size_t(95), size_t(96),
                     size_t(97), size_t(200), good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE(cut);
    v.expect_refused(write_variant("cut.kses", good.substr(0, cut)), "truncated");
  }
  v.expect_refused(write_variant("long.kses", good + "x"), "unexpected bytes after the data");
  v.expect_refused(path_in_temp("does-not-exist.kses"), "cannot open");
  v.expect_cache_intact();
}

TEST(SessionFile, WrongMagicAndVersionsAreRefused) {
  const std::string good = test::read_file(saved_prompt().path);
  Victim v;
  std::string magic = good;
  magic[0] = 'G';
  v.expect_refused(write_variant("magic.kses", magic), "not a kiln session file");
  v.expect_refused(stories_path(), "not a kiln session file");
  std::string future = good;
  poke<uint32_t>(future, 8, 2);
  v.expect_refused(write_variant("future.kses", future), "session file version 2 is newer than this kiln reads (1)");
  std::string zero = good;
  poke<uint32_t>(zero, 8, 0);
  v.expect_refused(write_variant("zero.kses", zero), "unknown session file version 0");
  v.expect_cache_intact();
}

TEST(SessionFile, DifferentModelIsRefused) {
  const auto q8 = Model::load(stories_q8_path());
  Session s(*q8, params(64));
  const std::vector<int32_t> tokens = prompt_tokens();
  s.decode(tokens);
  const std::string path = path_in_temp("q8.kses");
  save_session_file(path, s, tokens, "");
  Victim v;
  v.expect_refused(path, "saved with a different model (its identity is " + q8->identity_hex());
  // The file itself is fine: its own model takes it.
  Session back(*q8, params(64));
  EXPECT_EQ(load_session_file(path, back).tokens, tokens);
  v.expect_cache_intact();
}

TEST(SessionFile, TooSmallContextIsRefused) {
  const Saved& saved = saved_prompt();
  Victim v;
  Session small(stories(), params(int32_t(saved.tokens.size()) - 1));
  const std::vector<int32_t> one{1};
  small.decode(one);
  try {
    load_session_file(saved.path, small);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a context of at least " + std::to_string(saved.tokens.size()) + " tokens"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(small.n_past(), 1);
  // Exactly as many as the tokens is enough.
  Session exact(stories(), params(int32_t(saved.tokens.size())));
  EXPECT_NO_THROW(load_session_file(saved.path, exact));
}

// Files whose checksums are right but whose fields lie: what someone crafting a file can
// do. None may crash, allocate what the header claims, or reach the session.
TEST(SessionFile, CraftedHeadersAreRefused) {
  const std::string good = test::read_file(saved_prompt().path);
  Victim v;
  const auto crafted = [&](auto edit) {
    std::string b = good;
    edit(b);
    reseal(b);
    return write_variant("crafted.kses", b);
  };
  v.expect_refused(crafted([](std::string& b) { poke<uint64_t>(b, 56, uint64_t(1) << 62); }), "sizes disagree");
  v.expect_refused(crafted([](std::string& b) {  // consistent, and far larger than the file
    uint64_t app, payload;
    std::memcpy(&app, b.data() + 56, 8);
    std::memcpy(&payload, b.data() + 64, 8);
    poke<uint64_t>(b, 56, uint64_t(1) << 40);
    poke<uint64_t>(b, 64, payload - app + (uint64_t(1) << 40));
  }), "truncated");
  v.expect_refused(crafted([](std::string& b) { poke<uint64_t>(b, 64, ~uint64_t(0)); }), "sizes disagree");
  v.expect_refused(crafted([](std::string& b) { poke<uint32_t>(b, 32, 0xffffffffu); }), "inconsistent token counts");
  v.expect_refused(crafted([](std::string& b) { poke<uint32_t>(b, 28, 0xfffffff0u); }), "inconsistent token counts");
  v.expect_refused(crafted([](std::string& b) { poke<uint32_t>(b, 36, 7); }), "its KV cache (type 7");
  v.expect_refused(crafted([](std::string& b) { poke<uint32_t>(b, 40, 6); }), "6 layers");
  v.expect_refused(crafted([](std::string& b) { poke<uint64_t>(b, 48, 8); }), "its KV cache");
  v.expect_refused(crafted([](std::string& b) { poke<uint64_t>(b, 16, 0x1234); }), "saved with a different model");
  v.expect_refused(crafted([](std::string& b) { poke<int32_t>(b, 96 + 4, 100000); }), "outside the vocabulary");
  v.expect_refused(crafted([](std::string& b) { poke<int32_t>(b, 96, -1); }), "outside the vocabulary");
  v.expect_cache_intact();
}

// The size the chat cares about: a long conversation must save and resume in far less
// time than re-running it. Prints the times; the bound only catches a pathological path.
TEST(SessionFile, TwoThousandTokensSaveAndLoadFast) {
  const int32_t n = 2000;
  Session s(stories(), params(2048));
  std::vector<int32_t> tokens(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  s.decode(std::span(tokens).first(n - 1));
  const std::string path = path_in_temp("long.kses");
  const auto t1 = clock::now();
  save_session_file(path, s, tokens, std::string(10000, 'm'));
  const auto t1_end = clock::now();
  Session restored(stories(), params(2048));
  const auto t2 = clock::now();
  const LoadedSession loaded = load_session_file(path, restored);
  const auto t3 = clock::now();
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("[ timing ] %d tokens: decode %.1f ms, save %.2f ms, load %.2f ms, file %.2f MiB\n", n - 1, ms(t1 - t0),
              ms(t1_end - t1), ms(t3 - t2), double(std::filesystem::file_size(path)) / (1 << 20));
  EXPECT_LT(ms(t3 - t2), 1000.0);
  ASSERT_EQ(restored.n_past(), n - 1);
  EXPECT_EQ(loaded.tokens, tokens);
  const std::vector<int32_t> last{tokens.back()};
  expect_same_bits(copy(restored.decode(last)), copy(s.decode(last)));
}

// A file written before session files could carry a recurrent state (tests/data/session)
// loads, and its cache continues as the saved tokens run afresh do (other kernels may
// have written it: close, not bitwise).
TEST(SessionFile, PreMambaFileStillLoads) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/data/session/pre-mamba.kiln";
  const SessionFileInfo info = read_session_file_info(path);
  Session s(stories(), params(info.n_ctx));
  const LoadedSession loaded = load_session_file(path, s);
  ASSERT_GT(loaded.info.n_cached, 8);
  EXPECT_EQ(s.n_past(), loaded.info.n_cached);
  const int32_t next = loaded.tokens[size_t(loaded.info.n_cached) - 1];
  const std::vector<float> got = [&] { auto l = s.decode(std::span(&next, 1)); return std::vector<float>(l.begin(), l.end()); }();
  Session fresh(stories(), params(info.n_ctx));
  fresh.decode(std::span(loaded.tokens.data(), size_t(loaded.info.n_cached)));
  const auto want = fresh.decode(std::span(&next, 1));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, double(std::fabs(got[i] - want[i]))), scale = std::max(scale, double(std::fabs(want[i])));
  EXPECT_LT(worst, 1e-2 * scale);
}

