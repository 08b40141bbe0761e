// kiln serve end to end: the real binary on stories260K, on a port it picks (--port 0),
// talked to with httplib::Client. Each server is stopped by its owner's destructor
// (SIGTERM, then SIGKILL after a timeout) even when an assertion fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "server/routes.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using kiln::test::kiln_binary;
using kiln::test::shared_path;

std::string model() { return shared_path("models/stories260K.gguf"); }

class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kiln_binary(), "serve", model(), "--host", "127.0.0.1", "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDERR_FILENO);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    err_fd_ = fds[0];
    // Drained all along: a full pipe would block the server's access log.
    reader_ = std::thread([this] {
      char buf[4096];
      ssize_t n;
      while ((n = read(err_fd_, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        err_.append(buf, size_t(n));
      }
    });
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    const std::regex ready("listening on http://127\\.0\\.0\\.1:([0-9]+)\n");
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string e = err();
      if (std::regex_search(e, m, ready)) {
        port_ = std::stoi(m[1]);
        return;
      }
      if (waitpid(pid_, &status_, WNOHANG) == pid_) break;
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "kiln serve did not get ready; stderr:\n" << err();
  }
  ~ServerProcess() { stop(); }

  // SIGTERM, then up to 20 s for the exit; SIGKILL after that. The exit status as waitpid gives it.
  int stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      while (waitpid(pid_, &status_, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          ADD_FAILURE() << "kiln serve did not exit within 20 s of SIGTERM";
          kill(pid_, SIGKILL);
          waitpid(pid_, &status_, 0);
          break;
        }
        std::this_thread::sleep_for(20ms);
      }
      pid_ = -1;
    }
    if (reader_.joinable()) reader_.join();
    if (err_fd_ >= 0) close(err_fd_), err_fd_ = -1;
    return status_;
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(5);
    c->set_read_timeout(60);
    c->set_write_timeout(10);
    return c;
  }
  int port() const { return port_; }
  std::string err() const {
    std::lock_guard<std::mutex> lock(mu_);
    return err_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  int port_ = 0;
  int err_fd_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string err_;
};

// One server for the tests that do not need special flags.
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
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  bool done = false;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos << ": " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "event after [DONE]: " << event;
    if (event == "data: [DONE]") done = true;
    else out.push_back(json::parse(event.substr(6)));
    pos = end + 2;
  }
  EXPECT_TRUE(done) << "no data: [DONE]";
  return out;
}

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
}

// Every line one JSON object; the last has done = true.
std::vector<json> ndjson_lines(const std::string& body) {
  std::vector<json> out;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    out.push_back(json::parse(line, nullptr, false));
    EXPECT_TRUE(out.back().is_object()) << line;
  }
  EXPECT_FALSE(out.empty());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].value("done", false), i + 1 == out.size()) << out[i];
  return out;
}

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

TEST(ServerOptions, ApiKeyIsRequiredWhereSet) {
  ServerProcess s({"--api-key", "secret"});
  auto c = s.client();
  auto none = c->Get("/v1/models");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_TRUE(json::parse(none->body)["error"].is_object());
  auto wrong = c->Get("/v1/models", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = c->Get("/v1/models", {{"Authorization", "Bearer secret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  EXPECT_EQ(c->Get("/health")->status, 200);  // open, for load balancers
}

TEST(ServerOptions, BodyOverMaxBodyIs413) {
  ServerProcess s({"--max-body", "1000"});
  auto c = s.client();
  const std::string big = json{{"prompt", std::string(2000, 'a')}}.dump();
  auto r = c->Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  auto small = c->Post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200);
}

TEST(ServerOptions, SigtermExitsZeroAndAccessLogHasTheRequests) {
  ServerProcess s;
  auto c = s.client();
  ASSERT_EQ(c->Get("/health")->status, 200);
  ASSERT_EQ(c->Get("/v1/nothing")->status, 404);
  const int status = s.stop();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(s.err().find("GET /health 200"), std::string::npos) << s.err();
  EXPECT_NE(s.err().find("GET /v1/nothing 404"), std::string::npos) << s.err();
}

}  // namespace

namespace {

double metric_value(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + name.size() + 2));
}

TEST(ServerOptions, StreamingClientThatLeavesCancelsItsRequest) {
  ServerProcess s({"-t", "1"});
  auto c = s.client();
  // Long enough (2000 tokens, past end of text) to be running when the client leaves.
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
  size_t received = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
    received += n;
    return false;  // hang up after the first bytes
  };
  (void)c->send(req);
  EXPECT_GT(received, 0u);
  c.reset();
  auto m = s.client();
  double cancelled = 0;
  for (int i = 0; i < 100 && cancelled < 1; ++i) {
    std::this_thread::sleep_for(50ms);
    auto r = m->Get("/metrics");
    ASSERT_TRUE(r);
    cancelled = metric_value(r->body, "kiln:requests_cancelled_total");
  }
  EXPECT_EQ(cancelled, 1) << "the request was not cancelled when its client left";
  EXPECT_EQ(m->Get("/health")->status, 200);
}

TEST(ServerOptions, FullQueueIs503WithRetryAfter) {
  ServerProcess s({"-np", "1", "--max-queue", "0", "-t", "1"});
  // One request runs (2000 tokens past end of text); with no room to wait, the next is refused.
  std::atomic<bool> streaming{false};
  std::thread first([&] {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      streaming = true;
      return true;
    };
    (void)c->send(req);
  });
  for (int i = 0; i < 1000 && !streaming; ++i) std::this_thread::sleep_for(5ms);
  auto c = s.client();
  auto r = c->Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 1}}.dump(), "application/json");
  first.join();
  ASSERT_TRUE(streaming.load());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  EXPECT_TRUE(json::parse(r->body)["error"].is_object());
}

TEST(ServerOptions, SigtermEndsRunningStreamsCleanlyAndExitsZero) {
  ServerProcess s({"-t", "1"});
  std::atomic<bool> streaming{false};
  std::string body;
  std::thread client([&] {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      streaming = true;
      return true;
    };
    (void)c->send(req);
  });
  for (int i = 0; i < 1000 && !streaming; ++i) std::this_thread::sleep_for(5ms);
  const int status = s.stop();
  client.join();
  ASSERT_TRUE(streaming.load());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::vector<json> events = sse_events(body);  // ends with [DONE]
  ASSERT_FALSE(events.empty());
  EXPECT_FALSE(events.back()["choices"][0]["finish_reason"].is_null()) << events.back();
}

TEST(ServerOptions, QuietKeepsTheReadyLineOnly) {
  ServerProcess s({"--quiet"});
  auto c = s.client();
  ASSERT_EQ(c->Get("/health")->status, 200);
  ASSERT_EQ(s.stop(), 0);
  EXPECT_NE(s.err().find("listening on http://127.0.0.1:"), std::string::npos);
  EXPECT_EQ(s.err().find("/health"), std::string::npos) << s.err();
}

// The HTTP boundary's mapping of exceptions to responses, without a server.
TEST(ServerErrors, ExceptionsBecomeOneJsonErrorWithItsStatus) {
  using namespace kiln::server;
  const auto call = [](std::function<void()> thrower, bool ollama = false) {
    httplib::Request req;
    httplib::Response res;
    guarded([&](const httplib::Request&, httplib::Response&) { thrower(); }, ollama)(req, res);
    return res;
  };
  httplib::Response r = call([] { throw kiln::QueueFullError("the queue is full"); });
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r.body)["error"]["message"], "the queue is full");
  r = call([] { throw ApiError(400, "top_k must be an integer", "invalid_request_error", "top_k"); });
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "top_k");
  r = call([] { throw kiln::UsageError("bad"); });
  EXPECT_EQ(r.status, 400);
  r = call([] { throw std::runtime_error("boom"); });
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "server_error");
  r = call([] { throw ApiError(400, "options.top_k must be an integer"); }, /*ollama=*/true);
  EXPECT_EQ(json::parse(r.body)["error"], "options.top_k must be an integer");
}

}  // namespace
