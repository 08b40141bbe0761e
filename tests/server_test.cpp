// kiln serve end to end, one server for all: each endpoint's shape, SSE and NDJSON framing,
// greedy text equal to kiln run's, every bad input's 400 naming its field.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "server_process.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using kiln::test::kiln_binary;
using kiln::test::ndjson_lines;
using kiln::test::ServerProcess;
using kiln::test::sse_events;

std::string model() { return kiln::test::stories_model(); }

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_GT(server_->port(), 0);
    cli_ = server_->client();
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return cli_->Post(path.c_str(), body, "application/json");
  }
  json post_json(const std::string& path, const json& body, int expect_status = 200) {
    auto r = post(path, body.dump());
    if (!r) {
      ADD_FAILURE() << path << ": no response";
      return json();
    }
    EXPECT_EQ(r->status, expect_status) << path << " " << r->body;
    return json::parse(r->body);
  }
  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> cli_;
};
ServerProcess* ServerTest::server_ = nullptr;

// The JSON objects of an SSE body; checks the framing (every event `data: ...\n\n`, the
// last one `data: [DONE]`).
TEST_F(ServerTest, HealthAndModels) {
  auto h = cli_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = cli_->Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "stories260K");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST_F(ServerTest, TokenizeAndDetokenize) {
  const json t = post_json("/tokenize", {{"content", "Once upon a time"}});
  ASSERT_TRUE(t["tokens"].is_array());
  ASSERT_FALSE(t["tokens"].empty());
  for (const json& id : t["tokens"]) EXPECT_TRUE(id.is_number_integer());
  // llama-server's default: no BOS.
  const std::string ids = kiln::test::run_command(kiln_binary() + " tokenize " + model() + " 'Once upon a time' --ids --no-bos").out;
  EXPECT_EQ(json::parse(ids), t["tokens"]) << "as kiln tokenize --ids --no-bos";
  const json d = post_json("/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(kiln::test::trim(d["content"].get<std::string>()), "Once upon a time");
}

TEST_F(ServerTest, GreedyCompletionMatchesKilnRun) {
  const auto run = kiln::test::run_command(kiln_binary() + " run " + model() + " 'Once upon a time' -n 24 --temp 0 2>/dev/null");
  ASSERT_EQ(run.exit_code, 0);
  const json j = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories260K");
  ASSERT_EQ(j["choices"].size(), 1u);
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text + (text.empty() || text.back() != '\n' ? "\n" : ""), run.out);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 24);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST_F(ServerTest, StreamedCompletionIsTheSameTextInSseChunks) {
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  const json whole = post_json("/v1/completions", body);
  json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  auto r = post("/v1/completions", sbody.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  const std::vector<json> events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    ASSERT_EQ(events[i]["choices"].size(), 1u);
    text += events[i]["choices"][0]["text"].get<std::string>();
    const bool last_choice = i + 2 == events.size();
    EXPECT_EQ(events[i]["choices"][0]["finish_reason"].is_null(), !last_choice) << events[i];
  }
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  const json& usage = events.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 16);
}

TEST_F(ServerTest, StopStringEndsTheText) {
  const json j = post_json("/v1/completions",
                           {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"little"}}});
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text.find("little"), std::string::npos) << text;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const json whole = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}});
  const std::string full = whole["choices"][0]["text"];
  ASSERT_NE(full.find("little"), std::string::npos) << "the test needs a stop string the greedy text contains";
  EXPECT_EQ(text, full.substr(0, full.find("little")));
}

TEST_F(ServerTest, LogitBiasSeedAndMaxCompletionTokens) {
  // A +100 bias makes greedy pick that token every time.
  const json b = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0},
                                               {"logit_bias", {{"400", 100}}}});
  const json d = post_json("/detokenize", {{"tokens", {400, 400, 400}}});
  EXPECT_EQ(b["choices"][0]["text"], d["content"]);
  // The same seed draws the same text; max_completion_tokens wins over max_tokens.
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 50}, {"max_completion_tokens", 10}, {"temperature", 1.0},
                    {"seed", 1234}};
  const json a1 = post_json("/v1/completions", req), a2 = post_json("/v1/completions", req);
  EXPECT_EQ(a1["choices"][0]["text"], a2["choices"][0]["text"]);
  EXPECT_EQ(a1["usage"]["completion_tokens"], 10);
}

TEST_F(ServerTest, ChatCompletionWholeAndStreamed) {
  const json body = {{"messages", {{{"role", "system"}, {"content", "Stories."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 8},
                     {"temperature", 0}};
  const json j = post_json("/v1/chat/completions", body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  json sbody = body;
  sbody["stream"] = true;
  auto r = post("/v1/chat/completions", sbody.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<json> events = sse_events(r->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const json& e : events) text += e["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, BadInputIs400NamingTheField) {
  struct Case {
    const char* path;
    std::string body;
    const char* fragment;  // in the error message
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"x\",", "not valid JSON"},
      {"/v1/completions", "[1, 2]", "JSON object"},
      {"/v1/completions", "{\"prompt\": [1E1111111111]}", "not valid JSON"},  // beyond a double (fuzz finding)
      {"/v1/completions", "{\"max_tokens\": 4}", "prompt"},
      {"/v1/completions", "{\"prompt\": 7}", "prompt"},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -1}", "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature"},
      {"/v1/completions", "{\"prompt\": \"x\", \"top_p\": 7}", "top_p"},
      {"/v1/completions", "{\"prompt\": \"x\", \"top_k\": 1.5}", "top_k"},
      {"/v1/completions", "{\"prompt\": \"x\", \"seed\": 1e300}", "seed"},
      {"/v1/completions", "{\"prompt\": \"x\", \"stop\": 3}", "stop"},
      {"/v1/completions", "{\"prompt\": \"x\", \"n\": 2}", "n"},
      {"/v1/completions", "{\"prompt\": \"x\", \"stream\": \"yes\"}", "stream"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}", "logit_bias"},
      {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"99999\": 1}}", "logit_bias"},
      {"/v1/completions", "{\"prompt\": [1, 99999]}", "prompt[1]"},
      {"/v1/completions", "{\"prompt\": \"\xff\xfe\"}", "UTF-8"},
      {"/v1/chat/completions", "{}", "messages"},
      {"/v1/chat/completions", "{\"messages\": []}", "messages"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages[0].role"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content"},
      {"/tokenize", "{}", "content"},
      {"/detokenize", "{\"tokens\": [\"a\"]}", "tokens[0]"},
  };
  for (const Case& c : cases) {
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r) << c.path << " " << c.body;
    EXPECT_EQ(r->status, 400) << c.path << " " << c.body << " -> " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j["error"].is_object()) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.fragment), std::string::npos)
        << c.body << " -> " << j["error"]["message"];
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["code"], 400);
  }
  // The server is still there.
  EXPECT_EQ(cli_->Get("/health")->status, 200);
}

TEST_F(ServerTest, PromptLongerThanTheContextIs400) {
  std::vector<int> ids(5000, 300);  // the context is 2048 (stories260K's training length)
  auto r = post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}}.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("context"), std::string::npos) << r->body;
}

TEST_F(ServerTest, UnknownRouteIs404) {
  auto r = cli_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body)["error"].is_object());
}

TEST_F(ServerTest, MetricsAreParseablePrometheusText) {
  post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}});
  auto r = cli_->Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("# TYPE kiln:requests_total counter\nkiln:requests_total "), std::string::npos) << r->body;
  const std::regex sample("^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{[^}]*\\})? [-0-9.e+]+$");
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] != '#') {
      EXPECT_TRUE(std::regex_match(line, sample)) << line;
    }
  EXPECT_GE(kiln::test::metric_value(r->body, "kiln:tokens_predicted_total"), 4);
  EXPECT_GE(kiln::test::metric_value(r->body, "kiln:requests_total"), 1);
  EXPECT_GT(kiln::test::metric_value(r->body, "kiln:kv_cache_bytes_allocated"), 0);
  EXPECT_EQ(kiln::test::metric_value(r->body, "kiln:ready"), 1);
  // The finished request stays cached for prompts that start the same way: its blocks and
  // positions show.
  EXPECT_GE(kiln::test::metric_value(r->body, "kiln:cached_prefixes"), 1);
  EXPECT_GE(kiln::test::metric_value(r->body, "kiln:cached_prefix_tokens"), 4);
  EXPECT_GE(kiln::test::metric_value(r->body, "kiln:kv_blocks_used"), 1);
}

// Every line one JSON object; the last has done = true.
TEST_F(ServerTest, OllamaGenerateStreamsNdjsonByDefault) {
  const json options = {{"num_predict", 12}, {"temperature", 0}};
  auto r = post("/api/generate", json{{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"options", options}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
  const std::vector<json> lines = ndjson_lines(r->body);
  std::string text;
  for (const json& l : lines) text += l["response"].get<std::string>();
  const json& last = lines.back();
  EXPECT_EQ(last["done_reason"], "length");
  EXPECT_EQ(last["eval_count"], 12);
  EXPECT_GT(last["prompt_eval_count"].get<int>(), 0);
  EXPECT_TRUE(last["total_duration"].is_number_integer());
  // stories260K has no chat template: the prompt goes through the plain one unchanged.
  const json c = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(text, c["choices"][0]["text"]);
  auto whole = post("/api/generate", json{{"prompt", "Once upon a time"}, {"stream", false}, {"options", options}}.dump());
  ASSERT_TRUE(whole);
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["done"], true);
  EXPECT_EQ(w["response"], text);
}

TEST_F(ServerTest, OllamaChatTagsShowVersion) {
  auto r = post("/api/chat", json{{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                                  {"options", {{"num_predict", 4}, {"temperature", 0}}}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<json> lines = ndjson_lines(r->body);
  for (const json& l : lines) EXPECT_EQ(l["message"]["role"], "assistant") << l;
  EXPECT_EQ(lines.back()["eval_count"], 4);
  auto tags = cli_->Get("/api/tags");
  ASSERT_TRUE(tags);
  const json t = json::parse(tags->body);
  ASSERT_EQ(t["models"].size(), 1u);
  EXPECT_EQ(t["models"][0]["name"], "stories260K");
  EXPECT_EQ(t["models"][0]["details"]["format"], "gguf");
  EXPECT_EQ(t["models"][0]["details"]["family"], "llama");
  const json show = post_json("/api/show", {{"model", "stories260K"}});
  EXPECT_EQ(show["model_info"]["general.architecture"], "llama");
  EXPECT_TRUE(show["template"].is_string());
  auto v = cli_->Get("/api/version");
  ASSERT_TRUE(v);
  EXPECT_TRUE(json::parse(v->body)["version"].is_string());
}

TEST_F(ServerTest, OllamaBadInputIs400WithOllamasErrorShape) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"x\", \"options\": {\"temperature\": \"a\"}}", "options.temperature"},
      {"{\"prompt\": \"x\", \"options\": {\"num_predict\": 1.5}}", "options.num_predict"},
      {"{\"prompt\": \"x\", \"options\": 3}", "options"},
      {"{\"prompt\": 3}", "prompt"},
      {"{\"prompt\": \"x\", \"stream\": 1}", "stream"},
  };
  for (const auto& [body, field] : cases) {
    auto r = post("/api/generate", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j["error"].is_string()) << r->body;
    EXPECT_NE(j["error"].get<std::string>().find(field), std::string::npos) << r->body;
  }
  auto r = post("/api/chat", "{\"messages\": [{\"role\": \"nobody\", \"content\": \"x\"}]}");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("messages[0].role"), std::string::npos) << r->body;
}

TEST_F(ServerTest, PageIsASelfContainedChat) {
  auto r = cli_->Get("/");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/html", 0), 0u);
  EXPECT_NE(r->body.find("<textarea"), std::string::npos);
  EXPECT_NE(r->body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(r->body.find("stream: true"), std::string::npos);
  // Nothing loaded from elsewhere (no CDN).
  EXPECT_EQ(r->body.find("http://"), std::string::npos);
  EXPECT_EQ(r->body.find("https://"), std::string::npos);
}

}  // namespace
