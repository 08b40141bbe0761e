// kiln serve's flags and lifetime: API key, body limit, full queue, a client that leaves,
// SIGTERM with and without running streams, --quiet; and the exception-to-status mapping.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "server/routes.h"
#include "server_process.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using kiln::test::kiln_binary;
using kiln::test::ndjson_lines;
using kiln::test::post_long_stream;
using kiln::test::ServerProcess;
using kiln::test::sse_events;

using kiln::test::metric_value;

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

TEST(ServerOptions, StreamingClientThatLeavesCancelsItsRequest) {
  ServerProcess s({"-t", "1"});
  auto c = s.client();
  size_t received = 0;
  post_long_stream(*c, [&](const char*, size_t n) {
    received += n;
    return false;  // hang up after the first bytes
  });
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
    post_long_stream(*s.client(), [&](const char*, size_t) {
      streaming = true;
      return true;
    });
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
    post_long_stream(*s.client(), [&](const char* data, size_t n) {
      body.append(data, n);
      streaming = true;
      return true;
    });
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

// Debian's httplib listens with a backlog of 5; a burst of clients overflowed it and each
// dropped SYN cost its client a 1-s retransmission. kiln serve listens again with 1024:
// ss shows a listening socket's backlog as its Send-Q.
TEST(ServerOptions, ListenBacklogTakesABurstOfClients) {
  if (kiln::test::run_command("ss -V >/dev/null 2>&1").exit_code != 0) {
    if (std::getenv("CI")) FAIL() << "CI must install ss (iproute2, .ci/run)";
    GTEST_SKIP() << "ss (iproute2) is not installed";
  }
  ServerProcess s({"--quiet"});
  ASSERT_GT(s.port(), 0);
  const auto r = kiln::test::run_command("ss -Hltn 'sport = :" + std::to_string(s.port()) + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream fields(r.out);
  std::string state;
  long recv_q = -1, send_q = -1;
  fields >> state >> recv_q >> send_q;
  EXPECT_EQ(state, "LISTEN") << r.out;
  EXPECT_GE(send_q, 1024) << r.out;
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
