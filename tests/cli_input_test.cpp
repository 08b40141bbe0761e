// What a new user types that used to go wrong quietly: `-s -1`, a mistyped model path, a
// setting out of its range, a KV cache type the model's heads cannot take, help texts
// that disagreed with the code. The real kiln binary on the shared model.
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
CommandResult kiln_run(const std::string& args, const std::string& input = "") {
  return run_command(shell_quote(kiln_binary()) + " " + args, input);
}

// The number after "seed " on stderr; 0 when there is none.
uint64_t printed_seed(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex(R"(seed (\d+))"))) return 0;
  return std::stoull(m[1]);
}

// A usage error: exit 2, nothing on stdout, and the first line of stderr says it all
// (CLI11 adds a line pointing to --help after its own messages).
void expect_usage_error(const CommandResult& r, const std::string& fragment, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << what << "\n" << r.out;
  const std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_NE(first.find(fragment), std::string::npos) << what << "\n" << r.err;
}

}  // namespace

// llama.cpp's "-s -1" is a random seed. CLI11 used to wrap it to 2^64 - 1, a fixed seed,
// so every run gave the same text. Now each run draws one and prints it, and passing the
// printed seed back gives that run's text again.
TEST(CliSeed, MinusOneIsRandomPrintedAndReproducible) {
  const std::string base = "run " + shell_quote(model()) + " 'Once upon a time' -n 40 --temp 1 -t 1";
  for (const std::string flag : {"-s", "--seed"}) {
    auto a = kiln_run(base + " " + flag + " -1"), b = kiln_run(base + " " + flag + " -1");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const uint64_t sa = printed_seed(a.err), sb = printed_seed(b.err);
    EXPECT_NE(sa, 0u) << a.err;
    EXPECT_NE(sa, sb) << "two random seeds in a row were equal: " << a.err;
    EXPECT_NE(sa, 0xFFFFFFFFull);
    auto again = kiln_run(base + " -s " + std::to_string(sa));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(again.out, a.out) << "the printed seed does not reproduce the text";
    EXPECT_EQ(printed_seed(again.err), sa);
  }
  // chat takes the same flag and prints its seed at the start.
  auto chat = kiln_run("chat " + shell_quote(model()) + " -n 4 --temp 1 -s -1", "Once\n");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  const uint64_t sc = printed_seed(chat.err);
  EXPECT_NE(sc, 0u) << chat.err;
  EXPECT_NE(sc, 0xFFFFFFFFull);
  EXPECT_NE(sc, ~0ull);
  expect_usage_error(kiln_run(base + " -s -2"), "--seed", "-s -2");
  expect_usage_error(kiln_run(base + " -s x"), "--seed", "-s x");
}

// A model path that does not exist is an error naming it, never the default model with
// the path as its prompt (a lone `kiln run models/typo.gguf` used to do that for .bin
// files and paths with a directory).
TEST(CliModelPath, MissingModelIsOneErrorLine) {
  const std::string dir = temp_dir();
  for (const std::string path : {dir + "/missing.gguf", dir + "/missing.bin", dir + "/missing", std::string("missing.bin"),
                                 std::string("models/typo.gguf")}) {
    expect_one_line_error(kiln_run("run " + shell_quote(path) + " -n 4"), 1, path + ": cannot open: no such model file");
    expect_one_line_error(kiln_run("run " + shell_quote(path) + " 'Once upon a time' -n 4"), 1,
                          path + ": cannot open: no such model file");
    expect_one_line_error(kiln_run("chat " + shell_quote(path), "hi\n"), 1, path + ": cannot open: no such model file");
    expect_one_line_error(kiln_run("bench " + shell_quote(path) + " -p 4 -n 4 -r 1"), 1, path + ": cannot open: no such model file");
    expect_one_line_error(kiln_run("info " + shell_quote(path)), 1, path + ": cannot open: no such model file");
    expect_one_line_error(kiln_run("tokenize " + shell_quote(path) + " hi"), 1, path + ": cannot open: no such model file");
    const std::string text = dir + "/text.txt";
    write_file(text, "Once upon a time there was a cat.\n");
    expect_one_line_error(kiln_run("perplexity " + shell_quote(path) + " -f " + shell_quote(text)), 1,
                          path + ": cannot open: no such model file");
  }
  // A prompt is still a prompt.
  auto prompt = kiln_run("run 'Once upon a time' -n 2 --temp 0 -t 1 -m " + shell_quote(model()));
  EXPECT_EQ(prompt.exit_code, 0) << prompt.err;
  auto sentence = kiln_run("run " + shell_quote(model()) + " 'it cost 1/2 a coin' -n 2 --temp 0 -t 1");
  EXPECT_EQ(sentence.exit_code, 0) << sentence.err;
}

// Every out-of-range setting is refused on every command that takes it, naming the flag
// and its range (the sampler's ranges live in kiln::validate, shared with chat's /set).
TEST(CliRanges, OutOfRangeSettingsAreRefused) {
  struct Case {
    std::string flags, fragment;
  };
  const std::string hw = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<Case> sampling = {
      {"--top-p 7", "top_p (--top-p) must be in [0, 1] (1: off), got 7"},
      {"--top-p -0.5", "top_p (--top-p) must be in [0, 1]"},
      {"--min-p 1.5", "min_p (--min-p) must be in [0, 1] (0: off), got 1.5"},
      {"--min-p -0.1", "min_p (--min-p) must be in [0, 1]"},
      {"--top-k -1", "top_k (--top-k) must be >= 0 (0: off), got -1"},
      {"--repeat-penalty 0", "repeat_penalty (--repeat-penalty) must be > 0 (1: off), got 0"},
      {"--repeat-penalty -1", "repeat_penalty (--repeat-penalty) must be > 0"},
      {"--temp -1", "temperature (--temp) must be >= 0 (0: greedy), got -1"},
      {"--repeat-last-n -2", "penalty_last_n (--repeat-last-n) must be >= -1"},
      {"-n -2", "--n-predict"},
  };
  const std::vector<Case> runtime = {
      {"-t 1000", "--threads: must be in [0, "},
      {"-t 1000", "hardware threads, 512 at most), got 1000"},
      {"-c -5", "--ctx-size"},
  };
  const std::string m = shell_quote(model());
  for (const Case& c : sampling) {
    expect_usage_error(kiln_run("run " + m + " hi " + c.flags), c.fragment, "run " + c.flags);
    expect_usage_error(kiln_run("chat " + m + " " + c.flags, "hi\n"), c.fragment, "chat " + c.flags);
  }
  const std::string text = temp_dir() + "/text.txt";
  write_file(text, "Once upon a time there was a cat.\n");
  for (const Case& c : runtime) {
    expect_usage_error(kiln_run("run " + m + " hi " + c.flags), c.fragment, "run " + c.flags);
    expect_usage_error(kiln_run("chat " + m + " " + c.flags, "hi\n"), c.fragment, "chat " + c.flags);
    expect_usage_error(kiln_run("perplexity " + m + " -f " + shell_quote(text) + " " + c.flags), c.fragment,
                       "perplexity " + c.flags);
  }
  expect_usage_error(kiln_run("bench " + m + " -t 1,1000"), "--threads: must be in [0, ", "bench -t 1000");
  expect_usage_error(kiln_run("bench " + m + " -p -1"), "--n-prompt", "bench -p -1");
  expect_usage_error(kiln_run("bench " + m + " -n -1"), "--n-gen", "bench -n -1");

  // chat's /set: the same words, one line, and the chat goes on with its settings.
  auto chat = kiln_run("chat " + m + " -n 4 --temp 0", "/set top_p 7\n/set temp -1\n/set num_predict -2\n/show parameters\n");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.err.find("top_p (--top-p) must be in [0, 1] (1: off), got 7"), std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find("temperature (--temp) must be >= 0 (0: greedy), got -1"), std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find("top_p 0.95"), std::string::npos) << "settings changed by a refused /set: " << chat.err;
  EXPECT_NE(chat.err.find("temp 0\n"), std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find("/set num_predict must be >= -1 (-1: until end of text or full context), got -2"),
            std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find("num_predict 4"), std::string::npos) << chat.err;

  // The edges themselves are valid.
  auto edges = kiln_run("run " + m + " hi --top-p 1 --min-p 0 --top-k 0 --temp 0 -n -1 -t 1 -c 64 --quiet");
  EXPECT_EQ(edges.exit_code, 0) << edges.err;
}

// q8_0/q4_0 caches keep 32 values per block under one scale; stories260K's heads are 8
// wide, so a block spans four heads. q4_0 is refused (llama.cpp refuses it too), q8_0
// runs with a warning giving its measured cost.
TEST(CliKvCache, QuantizedBlocksAcrossHeads) {
  const std::string base = "run " + shell_quote(model()) + " 'Once upon a time' -n 4 --temp 0 -t 1";
  for (const std::string flags : {"-ctk q4_0 -fa on", "-ctv q4_0 -fa on", "-ctk q4_0 -ctv q4_0"})
    expect_one_line_error(kiln_run(base + " " + flags), 2, "q4_0: this model's head size 8 is not a multiple of");
  auto q8 = kiln_run(base + " -ctk q8_0 -ctv q8_0 -fa on");
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  EXPECT_NE(q8.err.find("warning: q8_0 KV cache with head size 8"), std::string::npos) << q8.err;
  EXPECT_NE(q8.err.find("perplexity"), std::string::npos) << q8.err;
  auto f16 = kiln_run(base);
  ASSERT_EQ(f16.exit_code, 0) << f16.err;
  EXPECT_EQ(f16.err.find("warning"), std::string::npos) << f16.err;
}

// perplexity scores chunks of 512 tokens unless told otherwise (llama-perplexity's
// default); its --help and the README used to give other figures.
TEST(CliDocs, PerplexityDefaultContextAgrees) {
  auto help = kiln_run("perplexity --help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  // From the option to the next one (CLI11 may put the description on its own line).
  const size_t at = help.out.find("-c,--ctx-size");
  ASSERT_NE(at, std::string::npos) << help.out;
  const std::string entry = help.out.substr(at, help.out.find("\n  -", at) - at);
  EXPECT_NE(entry.find("512"), std::string::npos) << entry;
  EXPECT_EQ(entry.find("4096"), std::string::npos) << entry;
  const std::string readme = read_file(std::string(KILN_SOURCE_DIR) + "/README.md");
  EXPECT_NE(readme.find("`kiln perplexity MODEL -f FILE [-c 512]`"), std::string::npos);
  // And the code does use 512.
  auto r = kiln_run("perplexity " + shell_quote(model()) + " -f " +
                    shell_quote(std::string(KILN_SOURCE_DIR) + "/tests/data/stories-sampled.txt") + " --chunks 1 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("chunks of 512,"), std::string::npos) << r.err;
}

// kiln's -fa auto differs from llama.cpp's (on whenever the backend can, so on a CPU):
// --help says so.
TEST(CliDocs, FlashAttentionAutoDifferenceIsDocumented) {
  auto help = kiln_run("run --help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("llama.cpp's auto is on whenever"), std::string::npos) << help.out;
  const std::string readme = read_file(std::string(KILN_SOURCE_DIR) + "/README.md");
  EXPECT_NE(readme.find("llama.cpp's auto turns it on whenever the backend supports it"), std::string::npos);
}
