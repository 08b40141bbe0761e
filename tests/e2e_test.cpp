// The real kiln binary on the shared models: golden texts, streams, exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
std::string kiln_cmd() { return shell_quote(kiln_binary()); }
std::string golden(const std::string& name) { return trim(read_file(shared_path("models/expected/" + name))); }

CommandResult kiln_run(const std::string& args, const std::string& input = "") {
  return run_command(kiln_cmd() + " " + args, input);
}

}  // namespace

class Golden : public ::testing::TestWithParam<int> {};

TEST_P(Golden, OnceUponATimeGreedy100) {
  const int threads = GetParam();
  auto r = kiln_run("run " + shell_quote(model()) + " 'Once upon a time' -n 100 --temp 0 -t " + std::to_string(threads));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), golden("stories260K.once-upon-a-time.greedy100.txt"));
  EXPECT_NE(r.err.find("generation: 100 tokens"), std::string::npos) << r.err;  // stats go to stderr
}

TEST_P(Golden, BosOnlyGreedy200) {
  const int threads = GetParam();
  auto r = kiln_run("run " + shell_quote(model()) + " '' -n 200 --temp 0 --quiet -t " + std::to_string(threads));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), golden("stories260K.bos.greedy200.txt"));
  EXPECT_TRUE(r.err.empty()) << "--quiet must silence stderr: " << r.err;
}

INSTANTIATE_TEST_SUITE_P(Threads, Golden, ::testing::Values(1, 2));

// --no-repack leaves the weights in the file mapping (load info says which) and changes
// nothing in the answer: float weights keep their layout either way.
TEST(E2E, NoRepackKeepsTheFileMappingAndTheAnswer) {
  const std::string cmd = "run " + shell_quote(model()) + " 'Once upon a time' -n 100 --temp 0 -t 2";
  auto repacked = kiln_run(cmd);
  auto mapped = kiln_run(cmd + " --no-repack");
  ASSERT_EQ(repacked.exit_code, 0) << repacked.err;
  ASSERT_EQ(mapped.exit_code, 0) << mapped.err;
  EXPECT_NE(repacked.err.find("weights repacked"), std::string::npos) << repacked.err;
  EXPECT_NE(mapped.err.find("weights mapped from the file"), std::string::npos) << mapped.err;
  EXPECT_EQ(trim(mapped.out), golden("stories260K.once-upon-a-time.greedy100.txt"));
  EXPECT_EQ(trim(repacked.out), trim(mapped.out));
}

TEST(E2E, PromptSourcesAgree) {
  const std::string want = golden("stories260K.once-upon-a-time.greedy100.txt");
  const std::string common = " -n 100 --temp 0 --quiet";
  auto by_flag = kiln_run("run -m " + shell_quote(model()) + " -p 'Once upon a time'" + common);
  EXPECT_EQ(trim(by_flag.out), want) << by_flag.err;
  const std::string file = temp_dir() + "/prompt.txt";
  write_file(file, "Once upon a time");
  auto by_file = kiln_run("run " + shell_quote(model()) + " -f " + shell_quote(file) + common);
  EXPECT_EQ(trim(by_file.out), want) << by_file.err;
  auto by_stdin = kiln_run("run " + shell_quote(model()) + " -" + common, "Once upon a time");
  EXPECT_EQ(trim(by_stdin.out), want) << by_stdin.err;
}

// --tokenizer swaps in a SentencePiece tokenizer.model or llama2.c's tokenizer.bin: the
// same vocabulary gives the same golden text.
TEST(E2E, ExternalTokenizerModel) {
  for (const char* file : {"models/tok512.model", "models/tok512.bin"}) {
    auto r = kiln_run("run " + shell_quote(model()) + " 'Once upon a time' -n 100 --temp 0 --quiet --tokenizer " +
                      shell_quote(shared_path(file)));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(trim(r.out), golden("stories260K.once-upon-a-time.greedy100.txt")) << file;
  }
  // A tokenizer with more tokens than the model has embeddings is refused.
  auto big = kiln_run("run " + shell_quote(model()) + " hi --tokenizer " +
                      shell_quote(shared_path("tokenizers/llama2-spm/tokenizer.model")));
  EXPECT_EQ(big.exit_code, 1);
  EXPECT_NE(big.err.find("32000"), std::string::npos) << big.err;
}

TEST(E2E, SeededSamplingIsReproducible) {
  const std::string args = "run " + shell_quote(model()) + " 'Once upon a time' -n 60 --temp 1.0 --seed 42 --quiet";
  auto a = kiln_run(args), b = kiln_run(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  auto c = kiln_run("run " + shell_quote(model()) + " 'Once upon a time' -n 60 --temp 1.0 --seed 43 --quiet");
  EXPECT_NE(a.out, c.out);
}

TEST(E2E, TokenizeIdsOnVocabFile) {
  const std::string vocab = shared_path("vocab/ggml-vocab-llama-spm.gguf");
  auto r = kiln_run("tokenize " + shell_quote(vocab) + " 'ied 4 ½ months' --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Expected ids from ../shared/vocab/ggml-vocab-llama-spm.gguf.out (first line), plus BOS.
  EXPECT_EQ(trim(r.out), "[1, 474, 287, 29871, 29946, 29871, 30226, 7378]");
  auto nb = kiln_run("tokenize " + shell_quote(vocab) + " 'ied 4 ½ months' --ids --no-bos");
  EXPECT_EQ(trim(nb.out), "[474, 287, 29871, 29946, 29871, 30226, 7378]");
}

TEST(E2E, InfoDescribesTheModel) {
  auto r = kiln_run("info " + shell_quote(model()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("architecture: llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers:       5, dim 64, ffn 172, heads 8, kv heads 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("512 tokens"), std::string::npos) << r.out;
}

TEST(E2E, HelpForEverySubcommand) {
  for (const char* sub : {"run", "chat", "bench", "info", "tokenize", "perplexity"}) {
    auto r = kiln_run(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub << ": " << r.out;
  }
}

TEST(E2E, UsageErrorsExitWith2) {
  EXPECT_EQ(kiln_run("").exit_code, 2);
  EXPECT_EQ(kiln_run("frobnicate").exit_code, 2);
  EXPECT_EQ(kiln_run("run " + shell_quote(model()) + " hi --temp notanumber").exit_code, 2);
  EXPECT_EQ(kiln_run("run " + shell_quote(model()) + " hi --no-such-flag").exit_code, 2);
  EXPECT_EQ(kiln_run("bench " + shell_quote(model()) + " -o xml").exit_code, 2);
  EXPECT_EQ(kiln_run("run " + shell_quote(model()) + " hi -p hello").exit_code, 2);
}

TEST(E2E, BadInputsGiveOneLineAndExit1) {
  expect_one_line_error(kiln_run("run /nonexistent/model.gguf hi"), 1, "/nonexistent/model.gguf: cannot open");
  const std::string truncated = temp_dir() + "/truncated.gguf";
  write_file(truncated, read_file(model()).substr(0, 5000));
  expect_one_line_error(kiln_run("run " + shell_quote(truncated) + " hi"), 1, "truncated.gguf:");
  const std::string not_gguf = temp_dir() + "/text.gguf";
  write_file(not_gguf, std::string(100, 'x'));
  expect_one_line_error(kiln_run("run " + shell_quote(not_gguf) + " hi"), 1, "bad magic");
  // A vocabulary-only file is not a model: the missing tensor is named.
  expect_one_line_error(kiln_run("run " + shell_quote(shared_path("vocab/ggml-vocab-llama-spm.gguf")) + " hi"), 1,
                        "missing tensor 'token_embd.weight'");
  expect_one_line_error(kiln_run("run " + shell_quote(model()) + " \"$(printf 'bad \\377 byte')\""), 1, "UTF-8");
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "Once upon a time ";
  expect_one_line_error(kiln_run("run " + shell_quote(model()) + " '" + long_prompt + "' -c 32"), 1, "context size 32");
  expect_one_line_error(kiln_run("run " + shell_quote(model()) + " hi -c 2000000000"), 1, "lower -c");
}

TEST(E2E, ContextFullStopsCleanly) {
  auto r = kiln_run("run " + shell_quote(model()) + " 'Once upon a time' -n 500 --temp 0 -c 40");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
  EXPECT_FALSE(trim(r.out).empty());
}

TEST(E2E, ChatKeepsTheCacheAcrossTurns) {
  auto r = kiln_run("chat " + shell_quote(model()) + " -n 20 --temp 0 --verbose",
                    "Once upon a time\nThe cat sat\n/bye\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Turn 1 runs BOS + its tokens; turn 2 only the previous answer's last token and its own.
  std::vector<int> processed;
  for (size_t at = 0; (at = r.err.find("[prompt: ", at)) != std::string::npos; at += 9)
    processed.push_back(std::stoi(r.err.substr(at + 9)));
  ASSERT_EQ(processed.size(), 2u) << r.err;
  EXPECT_EQ(processed[0], 5);  // <s> Once upon a time
  EXPECT_LT(processed[1], 10) << "the second turn must not recompute the first";
  EXPECT_FALSE(trim(r.out).empty());
}

TEST(E2E, ChatSurvivesAFailedTurn) {
  std::string long_line;
  for (int i = 0; i < 30; ++i) long_line += "Once upon a time ";
  auto r = kiln_run("chat " + shell_quote(model()) + " -c 64 -n 10 --temp 0", "Hello\n" + long_line + "\nThe dog\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("does not fit"), std::string::npos) << r.err;
  // Two answered turns (one line each), the failed one in between printed nothing.
  size_t lines = 0;
  for (char ch : r.out) lines += ch == '\n';
  EXPECT_EQ(lines, 2u) << r.out;
}

TEST(E2E, BenchJsonUsesLlamaBenchFields) {
  auto r = kiln_run("bench " + shell_quote(model()) + " -p 32 -n 8 -r 2 -t 1 -o json --no-kv-cache");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* field : {"\"model_type\"", "\"model_size\"", "\"model_n_params\"", "\"n_threads\"", "\"n_prompt\"",
                            "\"n_gen\"", "\"avg_ts\"", "\"stddev_ts\"", "\"samples_ts\""})
    EXPECT_NE(r.out.find(field), std::string::npos) << field;
  auto csv = kiln_run("bench " + shell_quote(model()) + " -p 32 -n 0 -r 2 -t 1,2 -o csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  std::istringstream lines(csv.out);
  std::string header, row;
  std::getline(lines, header);
  EXPECT_EQ(header.rfind("build_commit,build_number,", 0), 0u) << header;
  EXPECT_NE(header.find(",n_threads,"), std::string::npos) << header;
  EXPECT_NE(header.find(",avg_ts,stddev_ts"), std::string::npos) << header;
  int rows = 0;
  while (std::getline(lines, row)) rows += !row.empty();
  EXPECT_EQ(rows, 2) << csv.out;  // pp32 at 1 and at 2 threads
  auto md = kiln_run("bench " + shell_quote(model()) + " -p 32 -n 8 -r 2 -t 1");
  EXPECT_NE(md.out.find("| pp32 |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| tg8 |"), std::string::npos) << md.out;
}

TEST(E2E, PerplexityPrintsAFinalLine) {
  const std::string text = temp_dir() + "/ppl.txt";
  write_file(text, read_file(shared_path("models/expected/stories260K.bos.greedy200.txt")) +
                       read_file(shared_path("models/expected/stories260K.once-upon-a-time.greedy100.txt")));
  auto r = kiln_run("perplexity " + shell_quote(model()) + " -f " + shell_quote(text) + " -c 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string out = trim(r.out);
  ASSERT_EQ(out.rfind("PPL = ", 0), 0u) << out;
  const double ppl = std::stod(out.substr(6));
  // The model wrote this text greedily itself, so it must find it very predictable.
  EXPECT_GT(ppl, 1.0);
  EXPECT_LT(ppl, 3.0);
}

// Scored like llama-perplexity: same chunks, same scored halves, so the numbers agree with
// the ones llama.cpp printed for the same file (tests/data/README.md) up to float noise.
TEST(E2E, PerplexityMatchesLlamaCpp) {
  const std::string data = std::string(KILN_SOURCE_DIR) + "/tests/data/";
  std::istringstream refs(read_file(data + "story.llama-perplexity.txt"));
  int n_ctx;
  double want_ppl, want_err;
  int checked = 0;
  while (refs >> n_ctx >> want_ppl >> want_err) {
    auto r = kiln_run("perplexity " + shell_quote(model()) + " -f " + shell_quote(data + "story.txt") + " -c " +
                      std::to_string(n_ctx));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    double ppl = 0, err = 0;
    ASSERT_EQ(std::sscanf(trim(r.out).c_str(), "PPL = %lf +/- %lf", &ppl, &err), 2) << r.out;
    EXPECT_NEAR(ppl, want_ppl, want_ppl * 2e-4) << "n_ctx " << n_ctx;
    EXPECT_NEAR(err, want_err, want_err * 2e-3) << "n_ctx " << n_ctx;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Ctrl-C (SIGINT) during an answer stops that answer only; the chat takes the next line.
TEST(E2E, ChatCtrlCStopsTheAnswerNotTheProgram) {
  const std::string dir = temp_dir() + "/ctrlc";
  ASSERT_EQ(run_command("rm -rf " + shell_quote(dir) + " && mkdir -p " + shell_quote(dir) + " && mkfifo " +
                        shell_quote(dir + "/in")).exit_code, 0);
  // grow N: wait (at most ~10 s) until the answer stream is N bytes longer than at the start.
  const std::string script =
      "cd " + shell_quote(dir) + " || exit 9\n" +
      kiln_cmd() + " chat " + shell_quote(model()) +
      " -c 4096 --temp 0 --ignore-eos <in >out 2>err &\n"
      "pid=$!\n"
      "exec 3>in\n"
      "grow() { start=$(wc -c <out); i=0; while [ $(( $(wc -c <out) - start )) -lt $1 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; }\n"
      "echo 'Once upon a time' >&3; grow 100; kill -INT $pid\n"
      "grep -q stopped err || sleep 0.5\n"
      "echo 'The dog' >&3; grow 100; kill -INT $pid; sleep 0.3\n"
      "echo /bye >&3; exec 3>&-\n"
      "wait $pid; echo $?\n";
  write_file(dir + "/script.sh", script);
  auto r = run_command("sh " + shell_quote(dir + "/script.sh"));
  const std::string err = read_file(dir + "/err");
  EXPECT_EQ(trim(r.out), "0") << err << r.err;
  size_t stopped = 0;
  for (size_t at = 0; (at = err.find("(stopped)", at)) != std::string::npos; ++at) ++stopped;
  EXPECT_EQ(stopped, 2u) << err;
  EXPECT_EQ(err.find("context"), std::string::npos) << "an answer ran to the end of the context: " << err;
  EXPECT_GT(read_file(dir + "/out").size(), 200u);
}

// kiln quantize -> Q8_0 -> the same greedy text llama.cpp generated from its own Q8_0 of
// this model (tests/data/quant/README.md).
TEST(E2E, QuantizeQ8_0GeneratesLlamaCppText) {
  const std::string q8 = temp_dir() + "/stories260K-q8_0.gguf";
  auto qr = kiln_run("quantize " + shell_quote(model()) + " " + shell_quote(q8) + " Q8_0");
  ASSERT_EQ(qr.exit_code, 0) << qr.err;
  EXPECT_NE(qr.err.find("32 of 48 tensors quantized to Q8_0"), std::string::npos) << qr.err;
  auto info = kiln_run("info " + shell_quote(q8));
  EXPECT_NE(info.out.find("Q8_0 x32"), std::string::npos) << info.out;
  // With an f32 KV cache, so that only the weights' numerics are compared: llama.cpp's f16
  // cache rounds Q and P to f16 in its dot products (flash attention on the CPU), kiln's
  // keeps them in f32, and 60 tokens in the two drift apart by one word.
  auto r = kiln_run("run " + shell_quote(q8) + " 'Once upon a time' -n 100 --temp 0 --quiet -ctk f32 -ctv f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string want =
      trim(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/quant/stories260K-q8_0.once-upon-a-time.greedy100.txt"));
  EXPECT_EQ(trim(r.out), want);

  EXPECT_EQ(kiln_run("quantize " + shell_quote(model()) + " " + shell_quote(q8 + ".x") + " Q7_7").exit_code, 2);
  auto again = kiln_run("quantize " + shell_quote(q8) + " " + shell_quote(q8 + ".y") + " Q4_0");
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("quantize from an F32, F16 or BF16 model"), std::string::npos) << again.err;
}
