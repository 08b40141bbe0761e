// kiln serve's embeddings: POST /v1/embeddings (OpenAI's shape, as llama-server answers it)
// and ollama's POST /api/embed, through the real binary on a tiny random-weight BERT from
// kiln's generator (BGE's WordPiece vocabulary) and on stories260K with --embeddings. The
// vectors are `kiln embed`'s for the same file and texts; an encoder serves embeddings only
// and its completion routes answer 501; bad input is a 400 naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kiln/embedding.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "model_gen/generate_model.h"
#include "server_process.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using kiln::test::ServerProcess;
using namespace std::chrono_literals;

// bert-tiny as tests/embedding_test.cpp writes it (pooling cls), once per test process.
const std::string& bert_tiny() {
  static const std::string path = [] {
    const auto vocab = kiln::gguf::File::open(kiln::test::shared_path("vocab/ggml-vocab-bert-bge.gguf"));
    const std::vector<uint8_t> bytes = kiln::gen::build_model(kiln::gen::peaky_options("bert-tiny", 7), *vocab).to_bytes();
    const std::string p = kiln::test::temp_dir() + "/bert-tiny.gguf";
    kiln::test::write_file(p, std::string(bytes.begin(), bytes.end()));
    return p;
  }();
  return path;
}

const std::vector<std::string> kTexts = {"The quick brown fox jumps over the lazy dog.", "Embeddings are vectors",
                                         "hello world", "A third, longer text about tokens and pooling."};

// `kiln embed MODEL TEXTS... ARGS` as vectors (its json output: euclidean-normalised, %1.7f).
std::vector<std::vector<float>> kiln_embed(const std::string& model, const std::vector<std::string>& texts,
                                           const std::string& args = "") {
  std::string cmd = kiln::test::kiln_binary() + " embed " + kiln::test::shell_quote(model);
  for (const std::string& t : texts) {
    cmd += ' ';
    cmd += kiln::test::shell_quote(t);
  }
  const auto r = kiln::test::run_command(cmd + " " + args + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << cmd;
  std::vector<std::vector<float>> out;
  const json j = json::parse(r.out);
  for (const auto& item : j.at("data")) out.push_back(item.at("embedding").get<std::vector<float>>());
  return out;
}

json post(httplib::Client& c, const std::string& path, const json& body, int expect_status) {
  const auto res = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return json();
  EXPECT_EQ(res->status, expect_status) << path << " " << body.dump().substr(0, 200) << " -> " << res->body.substr(0, 300);
  return json::parse(res->body, nullptr, false);
}

// An OpenAI error object naming `param`.
void expect_openai_error(const json& j, const std::string& param) {
  ASSERT_TRUE(j.is_object() && j.contains("error")) << j.dump();
  EXPECT_EQ(j["error"]["param"], param) << j.dump();
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol = 2e-7f) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << "value " << i;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

std::vector<float> base64_floats(const std::string& s) {
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    if (ch == '=') break;
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char* p = std::strchr(alphabet, ch);
    EXPECT_TRUE(p && ch) << "not base64: " << ch;
    acc = (acc << 6) | uint32_t(p - alphabet);
    bits += 6;
    if (bits >= 8) bytes += char((acc >> (bits - 8)) & 0xff), bits -= 8;
  }
  std::vector<float> out(bytes.size() / 4);
  EXPECT_EQ(bytes.size() % 4, 0u);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

TEST(ServerEmbeddings, EncoderServesKilnEmbedsVectorsInOrder) {
  const std::vector<std::vector<float>> expected = kiln_embed(bert_tiny(), kTexts);
  ASSERT_EQ(expected.size(), kTexts.size());
  const auto model = kiln::Model::load(bert_tiny());
  kiln::Embedder embedder(*model);
  size_t n_tokens = 0;
  for (const std::string& t : kTexts) n_tokens += embedder.tokenize(t).size();

  ServerProcess server({"-np", "2"}, bert_tiny());
  ASSERT_GT(server.port(), 0);
  auto c = server.client();

  // A batch: one vector per text, in order, with its index; usage counts every token.
  const json batch = post(*c, "/v1/embeddings", {{"model", "bert-tiny"}, {"input", kTexts}}, 200);
  EXPECT_EQ(batch["object"], "list");
  EXPECT_EQ(batch["model"], "bert-tiny");
  ASSERT_EQ(batch["data"].size(), kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(batch["data"][i]["object"], "embedding");
    EXPECT_EQ(batch["data"][i]["index"], i);
    SCOPED_TRACE("text " + std::to_string(i));
    const std::vector<float> v = batch["data"][i]["embedding"];
    expect_close(v, expected[i]);
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
  }
  EXPECT_EQ(batch["usage"]["prompt_tokens"], n_tokens);
  EXPECT_EQ(batch["usage"]["total_tokens"], n_tokens);

  // One string; the same text as token ids (taken as they are: [CLS] ... [SEP] included).
  const json one = post(*c, "/v1/embeddings", {{"input", kTexts[1]}}, 200);
  ASSERT_EQ(one["data"].size(), 1u);
  expect_close(one["data"][0]["embedding"], expected[1]);
  EXPECT_EQ(one["usage"]["prompt_tokens"], embedder.tokenize(kTexts[1]).size());
  const json ids = post(*c, "/v1/embeddings", {{"input", embedder.tokenize(kTexts[1])}}, 200);
  EXPECT_EQ(ids["data"][0]["embedding"], one["data"][0]["embedding"]);
  const json id_lists =
      post(*c, "/v1/embeddings", {{"input", json::array({embedder.tokenize(kTexts[0]), embedder.tokenize(kTexts[1])})}}, 200);
  ASSERT_EQ(id_lists["data"].size(), 2u);
  EXPECT_EQ(id_lists["data"][0]["embedding"], batch["data"][0]["embedding"]);
  EXPECT_EQ(id_lists["data"][1]["embedding"], batch["data"][1]["embedding"]);

  // base64: little-endian float32, the same floats bit for bit.
  const json b64 = post(*c, "/v1/embeddings", {{"input", kTexts}, {"encoding_format", "base64"}}, 200);
  ASSERT_EQ(b64["data"].size(), kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i)
    EXPECT_EQ(base64_floats(b64["data"][i]["embedding"]), batch["data"][i]["embedding"].get<std::vector<float>>());

  // dimensions: the first N values, unit length again.
  const json cut = post(*c, "/v1/embeddings", {{"input", kTexts[0]}, {"dimensions", 8}}, 200);
  const std::vector<float> v8 = cut["data"][0]["embedding"];
  ASSERT_EQ(v8.size(), 8u);
  EXPECT_NEAR(norm(v8), 1.0, 1e-5);
  const std::vector<float> full = batch["data"][0]["embedding"];
  const double scale = v8[0] / full[0];
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(v8[i], full[i] * scale, 1e-6);

  // ollama: the same unit vectors; prompt_eval_count counts the tokens.
  const json ol = post(*c, "/api/embed", {{"model", "bert-tiny"}, {"input", kTexts}}, 200);
  EXPECT_EQ(ol["model"], "bert-tiny");
  ASSERT_EQ(ol["embeddings"].size(), kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i) expect_close(ol["embeddings"][i], expected[i]);
  EXPECT_EQ(ol["prompt_eval_count"], n_tokens);
  EXPECT_GT(ol["total_duration"].get<int64_t>(), 0);
  EXPECT_TRUE(ol.contains("load_duration"));
  const json ol1 = post(*c, "/api/embed", {{"input", kTexts[2]}}, 200);
  ASSERT_EQ(ol1["embeddings"].size(), 1u);
  expect_close(ol1["embeddings"][0], expected[2]);

  // What the model is: ollama's capabilities say it embeds and does not complete.
  const json show = post(*c, "/api/show", {{"model", "bert-tiny"}}, 200);
  EXPECT_EQ(show["capabilities"], json::array({"embedding"}));
  const auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServerEmbeddings, EncoderRefusesCompletionsAndBadInputNamingTheField) {
  ServerProcess server(std::vector<std::string>{}, bert_tiny());
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  // An encoder cannot generate: 501 on every completion route, the server still fine.
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const json j = post(*c, path, {{"prompt", "hi"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}, 501);
    ASSERT_TRUE(j.contains("error")) << path;
    EXPECT_EQ(j["error"]["type"], "not_supported_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("embeddings"), std::string::npos);
  }
  for (const char* path : {"/api/generate", "/api/chat"}) {
    const json j = post(*c, path, {{"model", "x"}, {"prompt", "hi"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}, 501);
    EXPECT_TRUE(j["error"].is_string()) << path;
  }

  // 400s naming the field.
  expect_openai_error(post(*c, "/v1/embeddings", json::object(), 400), "input");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", 5}}, 400), "input");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array()}}, 400), "input");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", ""}}, 400), "input");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array({"a", 7})}}, 400), "input[1]");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array({"a", ""})}}, 400), "input[1]");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array({101, 100000000})}}, 400), "input[1]");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array({json::array({101, 102}), json::array({-1})})}}, 400), "input[1][0]");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", json::array({json::array({101, 102}), json::array()})}}, 400), "input[1]");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", "a"}, {"encoding_format", "int8"}}, 400), "encoding_format");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", "a"}, {"dimensions", 0}}, 400), "dimensions");
  expect_openai_error(post(*c, "/v1/embeddings", {{"input", "a"}, {"model", 3}}, 400), "model");
  const auto malformed = c->Post("/v1/embeddings", "{\"input\": ", "application/json");
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);

  // A text longer than the context (bert-tiny: 512 positions): OpenAI's route refuses it,
  // ollama's cuts it (truncate, by default) or refuses it (truncate false).
  std::string longer;
  for (int i = 0; i < 600; ++i) longer += "word ";
  const json too_long = post(*c, "/v1/embeddings", {{"input", json::array({"short", longer})}}, 400);
  expect_openai_error(too_long, "input[1]");
  EXPECT_NE(too_long["error"]["message"].get<std::string>().find("context"), std::string::npos);
  const json cut = post(*c, "/api/embed", {{"input", longer}}, 200);
  ASSERT_EQ(cut["embeddings"].size(), 1u);
  EXPECT_NEAR(norm(cut["embeddings"][0]), 1.0, 1e-5);
  EXPECT_EQ(cut["prompt_eval_count"], 512);
  // Cut, the text still ends with [SEP]: the vector is that of its first 510 words' ids + [SEP].
  const auto model = kiln::Model::load(bert_tiny());
  kiln::Embedder embedder(*model);
  std::vector<int32_t> ids = embedder.tokenize(longer);
  ids.erase(ids.begin() + 511, ids.end() - 1);
  const json by_ids = post(*c, "/v1/embeddings", {{"input", ids}}, 200);
  expect_close(cut["embeddings"][0], by_ids["data"][0]["embedding"], 1e-6f);
  const json refused = post(*c, "/api/embed", {{"input", json::array({"short", longer})}, {"truncate", false}}, 400);
  ASSERT_TRUE(refused["error"].is_string());
  EXPECT_NE(refused["error"].get<std::string>().find("input[1]"), std::string::npos) << refused.dump();
  for (const json& bad : {json::object(), json{{"input", 1}}, json{{"input", "a"}, {"truncate", "yes"}},
                          json{{"input", json::array({"a", nullptr})}}})
    EXPECT_TRUE(post(*c, "/api/embed", bad, 400)["error"].is_string()) << bad.dump();

  // Still serving after all that.
  post(*c, "/v1/embeddings", {{"input", "still here"}}, 200);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServerEmbeddings, DecoderEmbedsWithTheFlagBesideRunningGenerations) {
  const std::string stories = kiln::test::stories_model();
  {  // Without --embeddings a decoder only generates.
    ServerProcess server;
    ASSERT_GT(server.port(), 0);
    auto c = server.client();
    const json j = post(*c, "/v1/embeddings", {{"input", "hi"}}, 501);
    EXPECT_EQ(j["error"]["type"], "not_supported_error");
    EXPECT_TRUE(post(*c, "/api/embed", {{"input", "hi"}}, 501)["error"].is_string());
  }
  // With it: the last token's hidden state (stories260K names no pooling), as kiln embed
  // --pooling last; completions still served, and an embedding does not wait for them.
  const std::vector<std::string> texts = {"Once upon a time", "The cat sat"};
  const std::vector<std::vector<float>> expected = kiln_embed(stories, texts, "--pooling last");
  ServerProcess server({"--embeddings", "-np", "2"});
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  std::atomic<bool> streaming{false}, hang_up{false};
  std::thread generation([&] {
    auto gc = server.client();
    kiln::test::post_long_stream(*gc, [&](const char*, size_t) {
      streaming = true;
      return !hang_up.load();
    });
  });
  for (int i = 0; i < 500 && !streaming; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(streaming);
  const json batch = post(*c, "/v1/embeddings", {{"input", texts}}, 200);
  ASSERT_EQ(batch["data"].size(), 2u);
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) expect_close(batch["data"][i]["embedding"], expected[i]);
  hang_up = true;
  generation.join();
  const json done = post(*c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}}, 200);
  EXPECT_EQ(done["object"], "text_completion");
  const json show = post(*c, "/api/show", {{"model", "stories260K"}}, 200);
  EXPECT_EQ(show["capabilities"], json::array({"completion", "embedding"}));

  // --pooling none gives a vector per token: not these endpoints' shape.
  ServerProcess none({"--embeddings", "--pooling", "none"});
  ASSERT_GT(none.port(), 0);
  post(*none.client(), "/v1/embeddings", {{"input", "hi"}}, 400);
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
