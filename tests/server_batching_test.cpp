// kiln serve under load: 16 concurrent requests each give the text they give alone (F32
// and quantized weights), a burst past the queue is answered 200 or 503 for every request
// (nothing dropped or hung), and /health says 503 until the model is there.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/batch_engine.h"
#include "kiln/chat_template.h"
#include "kiln/session.h"
#include "server/http_server.h"
#include "server_process.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using kiln::test::ServerProcess;

const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
    "Tom had a red ball", "The sun was hot", "There was a girl named Sue", "A cat sat",
    "The old man", "Mia liked to sing", "In the forest", "A boy found a box",
    "The rain fell", "Sam and his mom", "The fish swam", "Her kite flew high"};

json completion(httplib::Client& c, const std::string& prompt, int max_tokens, bool ignore_eos = false) {
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (ignore_eos) body["ignore_eos"] = true;
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"http_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body, nullptr, false);
  j["http_status"] = r->status;
  j["retry_after"] = r->get_header_value("Retry-After");
  return j;
}

// Runs f(i) for i in [0, n) on n threads released together.
template <typename F>
void all_at_once(size_t n, F f) {
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      f(i);
    });
  go = true;
  for (std::thread& t : threads) t.join();
}

class ConcurrentRequests : public ::testing::TestWithParam<std::string> {};

// The same 16 prompts one after the other, then all at once on -np 16 (prompts fed in
// chunks beside the others' decoding): byte-identical texts.
TEST_P(ConcurrentRequests, SixteenAtOnceGiveTheTextsTheyGiveAlone) {
  ServerProcess server({"-np", "16", "-c", "2048"}, kiln::test::stories_path(GetParam()));
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  std::vector<std::string> alone;
  for (const std::string& p : kPrompts) {
    const json j = completion(*c, p, 48);
    ASSERT_EQ(j["http_status"], 200) << j.dump();
    alone.push_back(j["choices"][0]["text"]);
  }
  std::vector<json> together(kPrompts.size());
  all_at_once(kPrompts.size(), [&](size_t i) { together[i] = completion(*server.client(), kPrompts[i], 48); });
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_EQ(together[i]["http_status"], 200) << together[i].dump();
    EXPECT_EQ(together[i]["choices"][0]["text"], alone[i]) << kPrompts[i];
  }
  // Each request counted once.
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(kiln::test::metric_value(m->body, "kiln:requests_total"), double(2 * kPrompts.size()));
  // A clean exit (under scripts/sanitize tsan the server is a TSan build: a report fails here).
  EXPECT_EQ(server.stop(), 0) << server.err();
}

INSTANTIATE_TEST_SUITE_P(Weights, ConcurrentRequests, ::testing::Values("F32", "Q8_0", "Q4_0"),
                         [](const auto& info) { return info.param; });

// -np 2 with room for 2 waiting, 12 requests of 300 tokens at once: each is answered, 200
// with its whole greedy text or 503 with Retry-After at once; at least the 2 the queue
// holds succeed (how many more depends on how fast the engine admits requests between
// arrivals), and the server counted every refusal.
TEST(ServerLoad, BurstPastTheQueueIsAnswered200Or503NothingDropped) {
  ServerProcess server({"-np", "2", "--max-queue", "2", "-t", "1"});
  ASSERT_GT(server.port(), 0);
  const std::string prompt = "Once upon a time";
  const json alone = completion(*server.client(), prompt, 300, true);
  ASSERT_EQ(alone["http_status"], 200) << alone.dump();
  std::vector<json> answers(12);
  all_at_once(answers.size(), [&](size_t i) {
    auto c = server.client();
    c->set_read_timeout(60, 0);
    answers[i] = completion(*c, prompt, 300, true);
  });
  int ok = 0, refused = 0;
  for (const json& a : answers) {
    ASSERT_FALSE(a.contains("http_error")) << a.dump();
    if (a["http_status"] == 200) {
      ++ok;
      EXPECT_EQ(a["choices"][0]["text"], alone["choices"][0]["text"]);
      EXPECT_EQ(a["usage"]["completion_tokens"], 300);
    } else {
      ASSERT_EQ(a["http_status"], 503) << a.dump();
      EXPECT_FALSE(a["retry_after"].get<std::string>().empty());
      EXPECT_TRUE(a["error"]["message"].is_string());
      ++refused;
    }
  }
  EXPECT_GE(ok, 2);
  EXPECT_EQ(ok + refused, 12);
  std::printf("200: %d, 503: %d\n", ok, refused);
  auto m = server.client()->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(kiln::test::metric_value(m->body, "kiln:requests_rejected_total"), double(refused));
  EXPECT_EQ(server.stop(), 0) << server.err();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The HTTP server in this process, as kiln serve runs it: listening before the model is
// loaded (health 503, completions 503), then ready once the backend is set.
TEST(ServerLoad, HealthIs503UntilTheModelIsLoaded) {
  kiln::server::ServerOptions o;
  o.port = 0;
  o.access_log = false;
  kiln::server::HttpServer http(o);
  const int port = http.bind();
  http.start();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(json::parse(h->body)["error"]["message"], "loading model");
  auto early = c.Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 1})", "application/json");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(kiln::test::metric_value(m->body, "kiln:ready"), 0.0);

  const kiln::Model& model = kiln::test::stories();
  kiln::SessionParams sp;
  sp.n_ctx = 256;
  sp.kv_layout = kiln::KvLayout::paged;
  kiln::Session session(model, sp);
  kiln::server::ChatFormatter chat(
      kiln::ChatTemplate(slurp(kiln::test::shared_path("templates/Qwen-Qwen2.5-7B-Instruct.jinja"))), model.tokenizer());
  kiln::BatchEngine engine(session, model.tokenizer(), {.n_parallel = 2});
  kiln::server::Backend backend{&engine, model.tokenizer(), chat, {.name = "stories260K"}, session.n_ctx(), {}, nullptr, ""};
  http.set_backend(&backend);
  h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = c.Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 3);
  http.stop();
  http.wait();
  http.set_backend(nullptr);
}

}  // namespace
