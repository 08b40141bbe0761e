// Chat: turns rendered by a chat template, and only what the KV cache lacks evaluated.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using nlohmann::ordered_json;

using test::stories;

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

SessionParams one_thread(int32_t n_ctx) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 1;
  return p;
}

struct Rig {
  explicit Rig(const char* tmpl, int32_t n_ctx = 512)
      : session(stories(), one_thread(n_ctx)),
        sampler(greedy(), stories().config().n_vocab),
        generator(session, stories().tokenizer(), sampler),
        chat(generator, stories().tokenizer(), ChatTemplate(tmpl)) {}
  Session session;
  Sampler sampler;
  Generator generator;
  Chat chat;
};

const auto ignore = [](std::string_view) {};

std::vector<int32_t> encode_special(const std::string& text) {
  return stories().tokenizer().encode(text, false, true);
}

// Turn 2 evaluates exactly the tokens of the text the template adds after turn 1 (plus the
// last answer token, sampled but not yet run), and answers as a fresh session would that
// is given the whole conversation at once.
TEST(Chat, SecondTurnEvaluatesOnlyItsNewTokens) {
  const char* chatml = builtin_chat_template("chatml");
  Rig rig(chatml);
  const ChatTemplate tmpl(chatml);
  const Tokenizer& tok = stories().tokenizer();

  const ChatTurn t1 = rig.chat.send("Once upon a time", 12, ignore);
  const std::string prompt1 =
      tmpl.render(ordered_json::parse(R"([{"role":"user","content":"Once upon a time"}])"), true, "<s>", "</s>");
  std::vector<int32_t> want1 = {tok.bos()};
  for (int32_t t : encode_special(prompt1)) want1.push_back(t);
  EXPECT_EQ(t1.n_reused, 0);
  EXPECT_EQ(t1.stats.n_prompt, (int32_t)want1.size());
  ASSERT_EQ(t1.stats.stop, StopReason::length) << "stories260K cannot write <|im_end|>: the reply ends by length";
  const std::vector<int32_t> history1 = rig.generator.history();
  ASSERT_EQ(history1.size(), want1.size() + 12);
  EXPECT_TRUE(std::equal(want1.begin(), want1.end(), history1.begin()));

  const ChatTurn t2 = rig.chat.send("The dog", 12, ignore);
  ordered_json conv = ordered_json::array();
  conv.push_back({{"role", "user"}, {"content", "Once upon a time"}});
  conv.push_back({{"role", "assistant"}, {"content", t1.reply}});
  conv.push_back({{"role", "user"}, {"content", "The dog"}});
  const std::string prompt2 = tmpl.render(conv, true, "<s>", "</s>");
  ASSERT_EQ(prompt2.rfind(prompt1 + t1.reply, 0), 0u) << "the template must extend the first turn's text";
  const std::vector<int32_t> delta = encode_special(prompt2.substr(prompt1.size() + t1.reply.size()));
  EXPECT_EQ(t2.n_reused, (int32_t)history1.size());
  EXPECT_EQ(t2.stats.n_prompt, (int32_t)delta.size() + 1);
  EXPECT_LT(t2.stats.n_prompt, t2.n_reused);

  // The same tokens in one go through a fresh session give the same greedy answer.
  std::vector<int32_t> all(rig.generator.history().begin(), rig.generator.history().end() - 12);
  Session fresh(stories(), one_thread(512));
  Sampler sampler(greedy(), stories().config().n_vocab);
  Generator generator(fresh, tok, sampler);
  std::string reply;
  generator.generate(all, 12, [&](std::string_view s) { reply.append(s); });
  EXPECT_EQ(reply, t2.reply);
  EXPECT_EQ(rig.chat.messages().size(), 4u);
}

TEST(Chat, PlainTemplateContinuesTheText) {
  Rig rig(Chat::plain_template());
  const ChatTurn t1 = rig.chat.send("Once upon a time", 8, ignore);
  EXPECT_EQ(t1.stats.n_prompt, 5);  // <s> Once upon a time
  const ChatTurn t2 = rig.chat.send("The cat sat", 8, ignore);
  EXPECT_EQ(t2.n_reused, 13);
  EXPECT_EQ(rig.chat.rendered(), "Once upon a time" + t1.reply + "\nThe cat sat" + t2.reply);
}

TEST(Chat, NewSystemPromptReevaluatesFromTheStart) {
  Rig rig(builtin_chat_template("chatml"));
  rig.chat.send("Once upon a time", 4, ignore);
  rig.chat.set_system("You tell stories.");
  const ChatTurn t2 = rig.chat.send("The dog", 4, ignore);
  EXPECT_EQ(t2.n_reused, 1) << "only BOS precedes the system message";
  EXPECT_EQ(rig.chat.messages()[0]["role"], "system");
  EXPECT_EQ((int32_t)rig.chat.n_tokens(), t2.n_reused + t2.stats.n_prompt + t2.stats.n_generated);
}

TEST(Chat, AFailedTurnLeavesTheConversationAsItWas) {
  Rig rig(builtin_chat_template("chatml"), 160);
  rig.chat.send("Once upon a time", 8, ignore);
  const std::vector<int32_t> before = rig.generator.history();
  const ordered_json messages = rig.chat.messages();
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "Once upon a time ";
  EXPECT_THROW(rig.chat.send(long_text, 8, ignore), Error);
  EXPECT_EQ(rig.generator.history(), before);
  EXPECT_EQ(rig.chat.messages(), messages);
  const ChatTurn t = rig.chat.send("The dog", 4, ignore);
  EXPECT_EQ(t.n_reused, (int32_t)before.size());

  // A template that refuses the conversation: its message, nothing changed.
  Rig strict("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
             "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  strict.chat.set_system("Be brief.");
  try {
    strict.chat.send("Hello", 4, ignore);
    FAIL() << "the template raised";
  } catch (const TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "System role not supported");
  }
  EXPECT_TRUE(strict.generator.history().empty());
  strict.chat.set_system("");
  EXPECT_EQ(strict.chat.send("Hello", 4, ignore).stats.n_generated, 4);
}

TEST(Chat, CancelledReplyIsKept) {
  Rig rig(builtin_chat_template("chatml"));
  std::atomic<bool> cancel{false};
  int pieces = 0;
  const ChatTurn t = rig.chat.send("Once upon a time", 100, [&](std::string_view) {
    if (++pieces == 3) cancel = true;
  }, &cancel);
  EXPECT_EQ(t.stats.stop, StopReason::cancelled);
  EXPECT_LT(t.stats.n_generated, 10);
  EXPECT_EQ(rig.chat.messages().back()["content"], t.reply);
  const size_t before = rig.chat.n_tokens();
  const ChatTurn t2 = rig.chat.send("The dog", 4, ignore);
  EXPECT_EQ(t2.n_reused, (int32_t)before) << "the partial answer stays in the cache";
}

TEST(Chat, StateRestoresOntoTheSameTokens) {
  Rig a(builtin_chat_template("chatml"));
  a.chat.set_system("You tell stories.");
  a.chat.send("Once upon a time", 6, ignore);
  Rig b(builtin_chat_template("chatml"));
  // What a session file does: the tokens, the cache, then the chat's state.
  b.session.decode(std::vector<int32_t>(a.generator.history().begin(), a.generator.history().end() - 1));
  b.generator.set_history(a.generator.history());
  b.chat.restore(a.chat.state());
  EXPECT_EQ(b.chat.messages(), a.chat.messages());
  const ChatTurn ta = a.chat.send("The dog", 6, ignore);
  const ChatTurn tb = b.chat.send("The dog", 6, ignore);
  EXPECT_EQ(tb.n_reused, ta.n_reused);
  EXPECT_EQ(tb.stats.n_prompt, ta.stats.n_prompt);
  EXPECT_EQ(tb.reply, ta.reply);

  ordered_json bad = a.chat.state();
  bad["segments"].push_back({3, "x"});
  EXPECT_THROW(b.chat.restore(bad), Error);
  EXPECT_THROW(b.chat.restore(ordered_json::parse(R"({"system": 3})")), Error);
  // A segment size is range-checked before it is converted (1e92 does not fit an integer).
  for (const char* size : {"1e92", "-1e92", "2.5", "18446744073709551615"}) {
    ordered_json huge = a.chat.state();
    huge["segments"][0][0] = ordered_json::parse(size);
    try {
      b.chat.restore(huge);
      ADD_FAILURE() << size << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a segment's size must be an integer"), std::string::npos) << e.what();
    }
  }
}

// stories260K with its metadata naming `eot` as the end-of-turn token.
std::unique_ptr<Model> stories_with_eot(int32_t eot) {
  auto file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  w.set("tokenizer.ggml.eot_token_id", gguf::Value::of_u32((uint32_t)eot));
  for (const auto& t : file->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string path = test::temp_dir() + "/stories-eot.gguf";
  w.write(path);
  return Model::load(path);
}

// The model's end-of-turn token ends the reply, is not part of its text, and the next turn
// re-evaluates it only because the template writes its own marker there instead.
TEST(Chat, EndOfTurnTokenEndsTheReply) {
  const char* chatml = builtin_chat_template("chatml");
  Rig plain(chatml);
  plain.chat.send("Once upon a time", 8, ignore);
  const std::vector<int32_t>& h = plain.generator.history();
  const std::vector<int32_t> reply(h.end() - 8, h.end());
  // The first reply token that did not occur before it becomes the end-of-turn token.
  size_t stop_at = 1;
  while (stop_at < reply.size() && std::find(reply.begin(), reply.begin() + stop_at, reply[stop_at]) !=
                                       reply.begin() + stop_at)
    ++stop_at;
  ASSERT_LT(stop_at, reply.size());

  auto model = stories_with_eot(reply[stop_at]);
  Session session(*model, one_thread(512));
  Sampler sampler(greedy(), model->config().n_vocab);
  Generator generator(session, model->tokenizer(), sampler);
  Chat chat(generator, model->tokenizer(), ChatTemplate(chatml));
  const ChatTurn t1 = chat.send("Once upon a time", 8, ignore);
  EXPECT_EQ(t1.stats.stop, StopReason::end_of_generation);
  EXPECT_EQ(t1.stats.n_generated, (int32_t)stop_at + 1);
  EXPECT_EQ(t1.reply, model->tokenizer().decode(std::vector<int32_t>(reply.begin(), reply.begin() + stop_at)));
  EXPECT_EQ(chat.messages().back()["content"], t1.reply);
  const size_t n_history = generator.history().size();
  EXPECT_EQ(generator.history().back(), reply[stop_at]);

  const ChatTurn t2 = chat.send("The dog", 4, ignore);
  EXPECT_EQ(t2.n_reused, (int32_t)n_history - 1) << "all but the end-of-turn token stay cached";
}

}  // namespace
}  // namespace kiln
