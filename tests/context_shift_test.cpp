// Context shift: the kept keys are turned back by RoPE instead of recomputed, generation
// goes on past the context, and chat makes room for new turns by itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <algorithm>

#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/generator.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::stories;

SessionParams params(int32_t n_ctx, TensorType cache = TensorType::F32) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  p.kv_type_k = p.kv_type_v = cache;
  return p;
}

std::vector<uint8_t> state(const Session& s) {
  std::vector<uint8_t> out;
  s.write_kv_state([&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); });
  return out;
}

// Layer 0's keys depend only on the token and its position, so after a shift they must
// equal the keys of a session that saw the kept tokens at their new positions in the
// first place; its values are the same bytes, moved.
void expect_layer0_like_fresh(TensorType cache, double tolerance) {
  const std::vector<int32_t> tokens = stories().tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog.", true);
  ASSERT_GT(tokens.size(), 20u);
  const int32_t n_keep = 1, n_discard = 7;
  Session shifted(stories(), params(64, cache));
  shifted.decode(tokens);
  shifted.shift_context(n_keep, n_discard);
  ASSERT_EQ(shifted.n_past(), int32_t(tokens.size()) - n_discard);

  std::vector<int32_t> kept(tokens.begin(), tokens.begin() + n_keep);
  kept.insert(kept.end(), tokens.begin() + n_keep + n_discard, tokens.end());
  Session fresh(stories(), params(64, cache));
  fresh.decode(kept);

  const std::vector<uint8_t> a = state(shifted), b = state(fresh);
  ASSERT_EQ(a.size(), b.size());
  const KvStateDesc desc = fresh.kv_state_desc(fresh.n_past());
  const size_t kv_dim = desc.kv_dim, n = size_t(fresh.n_past());
  const size_t elem = cache == TensorType::F32 ? 4 : 2;
  const size_t key_bytes = n * kv_dim * elem;  // layer 0's keys come first
  // Error relative to the row's largest value: a rotation mixes each small coordinate
  // with a large one, so the small one inherits the large one's rounding.
  double worst = 0;
  const auto value = [&](const std::vector<uint8_t>& v, size_t i) {
    if (cache == TensorType::F32) {
      float x;
      std::memcpy(&x, &v[4 * i], 4);
      return double(x);
    }
    uint16_t h;
    std::memcpy(&h, &v[2 * i], 2);
    return double(fp16_to_f32(h));
  };
  for (size_t row = 0; row < n; ++row) {
    double scale = 0, err = 0;
    for (size_t i = row * kv_dim; i < (row + 1) * kv_dim; ++i) {
      scale = std::max(scale, std::fabs(value(b, i)));
      err = std::max(err, std::fabs(value(a, i) - value(b, i)));
    }
    worst = std::max(worst, err / scale);
  }
  EXPECT_LT(worst, tolerance) << "keys turned back by RoPE differ from keys computed at those positions";
  EXPECT_GT(worst, 0.0) << "the shifted rows were not rotated at all?";
  EXPECT_TRUE(std::equal(a.begin() + key_bytes, a.begin() + key_bytes + n * kv_dim * elem, b.begin() + key_bytes))
      << "layer 0's values moved wrongly";
}

TEST(ContextShift, KeysAreTurnedBackExactlyF32) { expect_layer0_like_fresh(TensorType::F32, 1e-5); }
TEST(ContextShift, KeysAreTurnedBackF16) { expect_layer0_like_fresh(TensorType::F16, 2e-3); }  // 2 f16 roundings

TEST(ContextShift, RefusesImpossibleShifts) {
  Session s(stories(), params(64));
  const std::vector<int32_t> t = stories().tokenizer().encode("Once upon a time", true);
  s.decode(t);
  EXPECT_THROW(s.shift_context(2, int32_t(t.size())), Error);
  EXPECT_THROW(s.shift_context(-1, 1), Error);
  s.shift_context(1, 0);
  EXPECT_EQ(s.n_past(), int32_t(t.size()));
}

// 600 greedy tokens in a context of 128: the generator keeps going, every logit stays
// finite and the text stays English (almost every word is one the model used in the
// first, unshifted part).
TEST(ContextShift, GenerationGoesOnPastTheContext) {
  test::GreedyRig rig(params(128, TensorType::F16));
  Session& session = rig.session;
  Generator& generator = rig.generator;
  generator.set_ignore_eos(true);
  generator.set_context_shift(true);
  std::string text;
  const GenerationStats st = generator.generate(stories().tokenizer().encode("Once upon a time", true), 600,
                                                [&](std::string_view t) { text += t; });
  EXPECT_EQ(st.n_generated, 600);
  EXPECT_EQ(st.stop, StopReason::length);
  EXPECT_GT(st.n_discarded, 400);
  EXPECT_LE(session.n_past(), 128);
  for (float v : session.decode(std::vector<int32_t>{generator.history().back()})) ASSERT_TRUE(std::isfinite(v));

  // Coherent text: the model itself, reading the whole history with a context that holds
  // all of it, finds the part written after the first shift as predictable as its own
  // greedy text (perplexity ~1.5); cache damage (wrong rotation, misplaced values) gives
  // text it finds surprising.
  // (The history holds only what is left after the shifts: the text is all of it.)
  const std::vector<int32_t> all = stories().tokenizer().encode("Once upon a time" + text, true);
  ASSERT_GT(all.size(), 500u);
  Session judge(stories(), params(1024));
  const auto logits = judge.decode(all, true);
  const size_t n_vocab = stories().config().n_vocab;
  double nll = 0;
  size_t scored = 0;
  for (size_t pos = 128; pos + 1 < all.size(); ++pos, ++scored) {
    const float* row = &logits[pos * n_vocab];
    const double mx = *std::max_element(row, row + n_vocab);
    double sum = 0;
    for (size_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - mx);
    nll += std::log(sum) + mx - row[all[pos + 1]];
  }
  const double ppl = std::exp(nll / double(scored));
  std::printf("[ shift ] perplexity of the text after the first shift: %.3f\n", ppl);
  EXPECT_LT(ppl, 3.0) << text;
  EXPECT_EQ(text.find("nan"), std::string::npos);

  // Without the shift the same run stops at the full context.
  Session plain_session(stories(), params(128, TensorType::F16));
  Generator plain(plain_session, stories().tokenizer(), rig.sampler);
  plain.set_ignore_eos(true);
  const GenerationStats stopped = plain.generate(stories().tokenizer().encode("Once upon a time", true), 600,
                                                 [](std::string_view) {});
  EXPECT_EQ(stopped.stop, StopReason::context_full);
  EXPECT_EQ(stopped.n_discarded, 0);
}

// A chat longer than its context: each new turn makes room for itself, the reply streams,
// and later turns append to the shifted cache instead of re-evaluating the conversation.
TEST(ContextShift, ChatKeepsGoingPastTheContext) {
  test::GreedyRig rig(params(96, TensorType::F16));
  Session& session = rig.session;
  Generator& generator = rig.generator;
  generator.set_context_shift(true);
  Chat chat(generator, stories().tokenizer(), ChatTemplate(Chat::plain_template()));
  bool shifted_once = false;
  for (int turn = 0; turn < 8; ++turn) {
    std::string reply;
    const ChatTurn t = chat.send(turn % 2 ? "The dog ran to the park" : "Once upon a time", 30,
                                 [&](std::string_view s) { reply += s; });
    EXPECT_EQ(t.stats.n_generated, 30) << "turn " << turn;
    EXPECT_FALSE(reply.empty());
    if (chat.shifted()) {
      shifted_once = true;
      // Appended: the template's text for the turn ("\n" + message) and the last reply token.
      if (t.stats.n_discarded == 0) {
        const std::string msg = turn % 2 ? "The dog ran to the park" : "Once upon a time";
        EXPECT_EQ(t.stats.n_prompt, int32_t(stories().tokenizer().encode("\n" + msg, false, true).size()) + 1)
            << "a shifted chat appends its turn, turn " << turn;
      }
    }
    EXPECT_LE(session.n_past(), 96);
  }
  EXPECT_TRUE(shifted_once);
  EXPECT_EQ(chat.messages().size(), 16u);
  chat.clear();
  EXPECT_FALSE(chat.shifted());
}

TEST(ContextShift, ChatCliShiftsByDefault) {
  std::string input;
  for (int i = 0; i < 6; ++i) input += "Once upon a time\n";
  const std::string cmd = test::shell_quote(test::kiln_binary()) + " chat " +
                          test::shell_quote(test::shared_path("models/stories260K.gguf")) + " -c 64 -n 20 --temp 0";
  auto r = test::run_command(cmd, input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("older tokens were dropped"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("does not fit"), std::string::npos) << r.err;
  size_t lines = 0;
  for (char ch : r.out) lines += ch == '\n';
  EXPECT_EQ(lines, 6u) << r.out;

  auto off = test::run_command(cmd + " --no-context-shift", input);
  EXPECT_EQ(off.exit_code, 0) << off.err;
  EXPECT_EQ(off.err.find("older tokens were dropped"), std::string::npos) << off.err;
  EXPECT_NE(off.err.find("does not fit"), std::string::npos) << off.err;
}

}  // namespace
}  // namespace kiln
