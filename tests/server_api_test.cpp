// The OpenAI/ollama request parsing of kiln serve without a server: what each field
// becomes in the CompletionRequest, and the chat rendering against kiln chat's.
#include <gtest/gtest.h>

#include "kiln/chat.h"
#include "server/embedding_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"
#include "stories_fixture.h"

namespace {

using kiln::server::ApiError;
using kiln::server::json;

const kiln::Tokenizer& tok() { return kiln::test::stories().tokenizer(); }

kiln::server::ParsedRequest completion(const json& body, const kiln::server::Defaults& d = {}) {
  return kiln::server::parse_completion(body, tok(), d);
}

TEST(ServerApi, FieldsBecomeTheRequest) {
  const auto p = completion({{"prompt", "Once upon a time"},
                             {"max_tokens", 7},
                             {"temperature", 0.5},
                             {"top_p", 0.9},
                             {"top_k", 12},
                             {"min_p", 0.1},
                             {"seed", 42},
                             {"presence_penalty", 0.5},
                             {"frequency_penalty", -0.5},
                             {"stop", {"a", "", "b"}},
                             {"logit_bias", {{"5", -1.5}, {"6", false}}},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(p.request.prompt, tok().encode("Once upon a time", true));
  EXPECT_EQ(p.request.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.request.sampling.top_p, 0.9f);
  EXPECT_EQ(p.request.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(p.request.sampling.min_p, 0.1f);
  EXPECT_EQ(p.request.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(p.request.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.request.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(p.request.stop, (std::vector<std::string>{"a", "b"}));  // an empty stop would end before any text
  ASSERT_EQ(p.request.logit_bias.size(), 2u);
  EXPECT_EQ(p.request.logit_bias[0], (std::pair<int32_t, float>{5, -1.5f}));
  EXPECT_EQ(p.request.logit_bias[1].first, 6);
  EXPECT_TRUE(std::isinf(p.request.logit_bias[1].second) && p.request.logit_bias[1].second < 0);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
}

TEST(ServerApi, DefaultsComeFromTheCommandLine) {
  kiln::server::Defaults d;
  d.sampling.temperature = 0.25f;
  d.sampling.top_k = 3;
  d.max_tokens = 9;
  const auto p = completion({{"prompt", {1, 2, 3}}, {"top_k", nullptr}}, d);
  EXPECT_EQ(p.request.prompt, (std::vector<int32_t>{1, 2, 3}));  // ids as given, no BOS added
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 0.25f);
  EXPECT_EQ(p.request.sampling.top_k, 3);
  EXPECT_EQ(p.request.max_tokens, 9);
  EXPECT_EQ(completion({{"prompt", "x"}, {"seed", -1}}).request.sampling.seed, kiln::SamplerParams::kRandomSeed);
  EXPECT_FALSE(completion({{"prompt", "x"}}).stream);
}

TEST(ServerApi, RefusalsNameTheField) {
  const auto param_of = [](const json& body) {
    try {
      completion(body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of({{"prompt", "x"}, {"repeat_penalty", 0}}), "repeat_penalty");  // kiln::validate's range
  EXPECT_EQ(param_of({{"prompt", "x"}, {"logit_bias", {{"1", 101}}}}), "logit_bias[1]");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"logit_bias", json::array({json::array({1})})}}), "logit_bias[0]");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"stream_options", 1}}), "stream_options");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"max_completion_tokens", 1e10}}), "max_completion_tokens");
  EXPECT_EQ(param_of({{"prompt", {0, -1}}}), "prompt[1]");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"stop", {"a", 1}}}), "stop[1]");
}

TEST(ServerApi, ChatRendersAsKilnChatDoes) {
  kiln::server::ChatFormatter chat(kiln::ChatTemplate(kiln::builtin_chat_template("chatml")), tok());
  const json body = {{"messages", {{{"role", "developer"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}}};
  const auto p = kiln::server::parse_chat(body, tok(), chat, {});
  // The same text kiln chat renders (developer is the system role), markers as control tokens.
  const std::string expected =
      kiln::ChatTemplate(kiln::builtin_chat_template("chatml"))
          .render(nlohmann::ordered_json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}),
                  true, "<s>", "</s>");
  std::vector<int32_t> tokens = {tok().bos()};
  const std::vector<int32_t> text = tok().encode(expected, false, true);
  tokens.insert(tokens.end(), text.begin(), text.end());
  EXPECT_EQ(p.request.prompt, tokens);
}

TEST(ServerApi, OllamaOptions) {
  kiln::server::ChatFormatter chat(kiln::ChatTemplate(kiln::Chat::plain_template()), tok());
  const auto p = kiln::server::parse_ollama_generate(
      {{"prompt", "Once upon a time"}, {"options", {{"num_predict", -2}, {"temperature", 0}, {"top_k", 5}, {"stop", "x"}}}},
      tok(), chat, {});
  EXPECT_TRUE(p.stream);  // ollama streams unless told not to
  EXPECT_EQ(p.request.max_tokens, -1);
  EXPECT_EQ(p.request.sampling.temperature, 0.0f);
  EXPECT_EQ(p.request.sampling.top_k, 5);
  EXPECT_EQ(p.request.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(p.request.prompt, tok().encode("Once upon a time", true));  // the plain template: the text itself
  const auto load = kiln::server::parse_ollama_generate({{"model", "m"}}, tok(), chat, {});
  EXPECT_TRUE(load.request.prompt.empty());  // ollama's load-only request
  EXPECT_THROW(kiln::server::parse_ollama_generate({{"prompt", "x"}, {"options", {{"num_predict", "a"}}}}, tok(), chat, {}),
               ApiError);
}

TEST(ServerApi, EmbeddingRequests) {
  // stories260K as a decoder embedder with a context of 8 tokens: BOS first, nothing after.
  kiln::Embedder e(kiln::test::stories(), {.pooling = kiln::Pooling::last, .n_ctx = 8});
  const int32_t n_vocab = tok().n_vocab();
  const std::string longer = "Once upon a time there was a little girl named Lily who";
  const std::vector<int32_t> all = e.tokenize(longer);
  ASSERT_GT(all.size(), 8u);
  const auto param_of = [&](const json& body) {
    try {
      kiln::server::parse_openai_embedding(body, e, n_vocab);
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status(), 400);
      return err.param();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of({{"input", "Once"}}), "(accepted)");
  EXPECT_EQ(param_of({{"input", longer}}), "input");  // never cut
  EXPECT_EQ(param_of({{"input", json::array({"Once", longer})}}), "input[1]");
  EXPECT_EQ(param_of({{"input", json::array({1, n_vocab})}}), "input[1]");
  EXPECT_EQ(param_of({{"input", "Once"}, {"dimensions", 65}}), "dimensions");
  EXPECT_EQ(param_of({{"input", "Once"}, {"embd_normalize", -2}}), "embd_normalize");
  EXPECT_EQ(param_of({{"input", "Once"}, {"encoding_format", 1}}), "encoding_format");
  const auto r = kiln::server::parse_openai_embedding(
      {{"input", json::array({"Once", json::array({1, 2})})}, {"encoding_format", "base64"}, {"dimensions", 16}}, e, n_vocab);
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs[0], e.tokenize("Once"));
  EXPECT_EQ(r.inputs[1], (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 16u);

  // ollama cuts to the context by default (no suffix to keep here: the first 8 tokens).
  const auto cut = kiln::server::parse_ollama_embed({{"input", longer}}, e);
  EXPECT_EQ(cut.inputs[0], std::vector<int32_t>(all.begin(), all.begin() + 8));
  EXPECT_THROW(kiln::server::parse_ollama_embed({{"input", longer}, {"truncate", false}}, e), ApiError);

  // Little-endian float32 bytes: 1.0f is 00 00 80 3F, -2.0f 00 00 00 C0.
  EXPECT_EQ(kiln::server::base64_floats(std::vector<float>{1.0f}), "AACAPw==");
  EXPECT_EQ(kiln::server::base64_floats(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(kiln::server::base64_floats(std::vector<float>{}), "");
  std::vector<std::vector<float>> v = {{3, 4, 12}};
  kiln::server::finish_vectors(v, 2, 2);
  EXPECT_EQ(v[0], (std::vector<float>{0.6f, 0.8f}));
}

}  // namespace
