// kiln serve through real clients other than our own: the official `openai` npm package
// (tests/clients/openai_client.mjs) and the page at / in headless Chromium
// (tests/clients/web_page.mjs, playwright-core). The scripts check what their client sees;
// this side compares the texts they got with kiln run's and with the server's own answers.
// Node, the packages (`npm ci` in tests/clients) and Chromium are test-only tools that
// .ci/run installs: without them the tests skip on a developer's machine and fail in CI.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/gguf.h"
#include "model_gen/generate_model.h"
#include "server_process.h"
#include "test_util.h"

namespace {

using json = nlohmann::json;
using kiln::test::ServerProcess;

const std::string kClients = std::string(KILN_SOURCE_DIR) + "/tests/clients";

// Empty when everything the client needs is there, otherwise what is missing.
std::string missing_tools(bool needs_chromium) {
  if (kiln::test::run_command("node --version >/dev/null 2>&1").exit_code != 0) return "node";
  if (!std::filesystem::exists(kClients + "/node_modules/openai") ||
      !std::filesystem::exists(kClients + "/node_modules/playwright-core"))
    return "tests/clients/node_modules (npm ci in tests/clients)";
  if (needs_chromium && !std::filesystem::exists("/usr/bin/chromium")) return "/usr/bin/chromium";
  return "";
}

#define REQUIRE_TOOLS(needs_chromium)                                                      \
  do {                                                                                     \
    const std::string missing = missing_tools(needs_chromium);                             \
    if (!missing.empty()) {                                                                \
      if (std::getenv("CI")) FAIL() << "CI must install " << missing << " (.ci/run)";      \
      GTEST_SKIP() << missing << " is not installed (.ci/run installs it)";                \
    }                                                                                      \
  } while (0)

// The script's last stdout line is its JSON report.
json run_script(const std::string& script, const std::string& args) {
  const auto r = kiln::test::run_command("cd " + kClients + " && timeout 120 node " + script + " " + args);
  EXPECT_EQ(r.exit_code, 0) << script << " failed:\n" << r.out << r.err;
  const size_t last = r.out.find_last_of('\n', r.out.size() >= 2 ? r.out.size() - 2 : 0);
  const std::string line = r.out.substr(last == std::string::npos ? 0 : last + 1);
  return json::parse(line, nullptr, /*allow_exceptions=*/false);
}

TEST(OpenAiPackage, CompletionsChatStreamsErrorsAndAbortAsTheClientSeesThem) {
  REQUIRE_TOOLS(false);
  ServerProcess server({"--api-key", "client-test-key", "-np", "4"});
  ASSERT_GT(server.port(), 0);
  const json report = run_script("openai_client.mjs",
                                 "http://127.0.0.1:" + std::to_string(server.port()) + "/v1 client-test-key");
  ASSERT_TRUE(report.is_object()) << "no report from the script";
  EXPECT_EQ(report["model"], "stories260K");
  // The package's greedy completion is kiln run's text.
  const auto run = kiln::test::run_command(kiln::test::kiln_binary() + " run " + kiln::test::stories_model() +
                                           " 'Once upon a time' -n 24 --temp 0 2>/dev/null");
  ASSERT_EQ(run.exit_code, 0);
  const std::string text = report["completion"];
  EXPECT_EQ(text + (text.empty() || text.back() != '\n' ? "\n" : ""), run.out);
  EXPECT_FALSE(report["chat"].get<std::string>().empty());
}

TEST(WebPage, ChromiumShowsTheStreamedRepliesOfAConversation) {
  REQUIRE_TOOLS(true);
  ServerProcess server({"-np", "2"});
  ASSERT_GT(server.port(), 0);
  const json report = run_script("web_page.mjs", "http://127.0.0.1:" + std::to_string(server.port()));
  ASSERT_TRUE(report.is_object()) << "no report from the script";
  ASSERT_EQ(report["replies"].size(), 2u);
  ASSERT_EQ(report["requests"].size(), 2u);
  // What the page showed is what the server answers to the same request, whole.
  auto cli = server.client();
  for (size_t i = 0; i < 2; ++i) {
    json body = report["requests"][i];
    body["stream"] = false;
    auto r = cli->Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(report["replies"][i], json::parse(r->body)["choices"][0]["message"]["content"]) << "turn " << i;
  }
}

TEST(OpenAiPackage, EmbeddingsAsTheClientDecodesThem) {
  REQUIRE_TOOLS(false);
  // bert-tiny (tests/embedding_test.cpp's), an encoder: the server only embeds.
  const auto vocab = kiln::gguf::File::open(kiln::test::shared_path("vocab/ggml-vocab-bert-bge.gguf"));
  const std::vector<uint8_t> bytes = kiln::gen::build_model(kiln::gen::peaky_options("bert-tiny", 7), *vocab).to_bytes();
  const std::string model = kiln::test::temp_dir() + "/bert-tiny.gguf";
  kiln::test::write_file(model, std::string(bytes.begin(), bytes.end()));
  const json texts = {"The quick brown fox", "jumps over the lazy dog", "embeddings"};
  ServerProcess server(std::vector<std::string>{}, model);
  ASSERT_GT(server.port(), 0);
  const json report = run_script("embeddings_client.mjs", "http://127.0.0.1:" + std::to_string(server.port()) + "/v1 " +
                                                              kiln::test::shell_quote(texts.dump()));
  ASSERT_TRUE(report.is_object()) << "no report from the script";
  // The vectors the package decoded are kiln embed's (printed with 7 decimals).
  std::string cmd = kiln::test::kiln_binary() + " embed " + kiln::test::shell_quote(model);
  for (const auto& t : texts) {
    cmd += ' ';
    cmd += kiln::test::shell_quote(t.get<std::string>());
  }
  const auto r = kiln::test::run_command(cmd + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0);
  const json expected = json::parse(r.out)["data"];
  ASSERT_EQ(report["embeddings"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<float> got = report["embeddings"][i], want = expected[i]["embedding"];
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) ASSERT_NEAR(got[k], want[k], 2e-7) << "text " << i << " value " << k;
  }
}

}  // namespace
