// kiln perplexity --kl-divergence-base / --kl-divergence on the real binary: a model
// against itself, a Q8_0 copy against its F32 original (checked against the figures
// llama-perplexity printed for the same two files), and broken or mismatched base files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "test_util.h"

using namespace kiln::test;

namespace {

std::string model() { return shared_path("models/stories260K.gguf"); }
std::string story() { return std::string(KILN_SOURCE_DIR) + "/tests/data/story.txt"; }

CommandResult kiln_run(const std::string& args) { return run_command(shell_quote(kiln_binary()) + " " + args); }

// The number after `label` in kiln's (llama-perplexity-like) statistics block.
double stat(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no '" << label << "' in:\n" << out;
    return NAN;
  }
  return std::stod(out.substr(at + label.size()));
}

// The base file of the F32 model for one context size, made once per test process.
std::string base_file(int n_ctx) {
  const std::string path = temp_dir() + "/base" + std::to_string(n_ctx) + ".kld";
  if (!std::filesystem::exists(path)) {
    auto r = kiln_run("perplexity " + shell_quote(model()) + " -f " + shell_quote(story()) + " -c " +
                      std::to_string(n_ctx) + " --kl-divergence-base " + shell_quote(path));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(trim(r.out).rfind("PPL = ", 0), 0u) << r.out;
  }
  return path;
}

std::string q8_file() {
  const std::string path = temp_dir() + "/stories260K-q8_0.gguf";
  if (!std::filesystem::exists(path)) {
    auto r = kiln_run("quantize " + shell_quote(model()) + " " + shell_quote(path) + " Q8_0");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  return path;
}

CommandResult kld_run(const std::string& model_path, const std::string& base, const std::string& extra = "") {
  return kiln_run("perplexity " + shell_quote(model_path) + " --kl-divergence-base " + shell_quote(base) +
                  " --kl-divergence " + extra);
}

}  // namespace

// The documented layout: 28-byte header, the tokens, then per scored token 16 bytes and
// two per vocabulary entry. story.txt is 955 tokens: 14 chunks of 64, 31 scored in each.
TEST(KlDivergence, BaseFileHasTheDocumentedSize) {
  const uint64_t n_ctx = 64, n_chunk = 14, rows = n_chunk * (n_ctx - 1 - n_ctx / 2), n_vocab = 512;
  EXPECT_EQ(std::filesystem::file_size(base_file(64)), 28 + 4 * n_ctx * n_chunk + rows * (16 + 2 * n_vocab));
}

TEST(KlDivergence, ModelAgainstItselfIsZero) {
  const std::string base = base_file(64);
  auto plain = kiln_run("perplexity " + shell_quote(model()) + " -f " + shell_quote(story()) + " -c 64");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  double ppl = 0;
  ASSERT_EQ(std::sscanf(trim(plain.out).c_str(), "PPL = %lf", &ppl), 1) << plain.out;

  auto r = kld_run(model(), base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The 16-bit codes move the KLD only at second order: ~1e-8, printed as 0.
  EXPECT_GE(stat(r.out, "Mean    KLD:"), 0.0) << r.out;
  EXPECT_LT(stat(r.out, "Mean    KLD:"), 1e-6) << r.out;
  EXPECT_LT(stat(r.out, "Maximum KLD:"), 1e-5) << r.out;
  EXPECT_EQ(stat(r.out, "Same top p:"), 100.0) << r.out;
  EXPECT_NEAR(stat(r.out, "Mean PPL(Q)                   :"), ppl, 1e-4) << r.out;
  EXPECT_NEAR(stat(r.out, "Mean PPL(base)                :"), ppl, 1e-4) << r.out;
  EXPECT_NEAR(stat(r.out, "Mean PPL(Q)/PPL(base)         :"), 1.0, 1e-6) << r.out;
  // Per-chunk progress goes to stderr, one line per chunk after the table header.
  EXPECT_NE(r.err.find("KL Divergence"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n  14 "), std::string::npos) << r.err;
}

// A Q8_0 copy loses a little: a small positive KLD. llama-perplexity measured the same two
// files (tests/data/story.llama-kld.txt). kiln's AVX-512 path quantizes activations to
// 8 bits as ggml does and lands within 6% of llama.cpp's mean KLD (+3.5% at n_ctx 64 and
// -4.8% at 128 with the packed kernels; +5.8% / -2.5% before them): checked both ways to
// 15%. The scalar reference keeps activations in float and loses about half as much, so
// off AVX-512 only the upper bound applies (the AVX2 path measured like AVX-512).
// "Same top p" differs by a few near-tied tokens between kernel paths (5 of 441 at
// n_ctx 128): 2.5 points allowed, about 4 sigma.
TEST(KlDivergence, Q8_0AgainstF32MatchesLlamaCpp) {
  std::istringstream refs(read_file(std::string(KILN_SOURCE_DIR) + "/tests/data/story.llama-kld.txt"));
  int n_ctx;
  double want_kld, want_err, want_median, want_top;
  int checked = 0;
  while (refs >> n_ctx >> want_kld >> want_err >> want_median >> want_top) {
    SCOPED_TRACE("n_ctx " + std::to_string(n_ctx));
    auto r = kld_run(q8_file(), base_file(n_ctx));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double kld = stat(r.out, "Mean    KLD:");
    EXPECT_GT(kld, 1e-5) << "far above the self-comparison floor";
    EXPECT_LT(kld, 1.15 * want_kld) << r.out;
    if (r.err.find("kernels avx512") != std::string::npos) {
      EXPECT_GT(kld, 0.85 * want_kld) << r.out;
    }
    EXPECT_GT(stat(r.out, "Median  KLD:"), 0.0) << r.out;
    EXPECT_NEAR(stat(r.out, "Same top p:"), want_top, 2.5) << r.out;
    EXPECT_GT(stat(r.out, "Same top p:"), 95.0) << r.out;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(KlDivergence, BadOrMismatchedBaseFilesGiveOneLineErrors) {
  const std::string dir = temp_dir() + "/kld-bad";
  std::filesystem::create_directories(dir);
  const std::string base = base_file(64);
  // Each error names the base file (or, for -f, the text) and the run exits 1.
  const auto expect_error = [](const CommandResult& r, const std::string& file, const std::string& fragment) {
    expect_one_line_error(r, 1, fragment);
    EXPECT_NE(r.err.find(file + ":"), std::string::npos) << r.err;
  };

  expect_error(kld_run(model(), dir + "/missing.kld"), dir + "/missing.kld", "cannot open");

  write_file(dir + "/text.kld", std::string(100, 'x'));
  expect_error(kld_run(model(), dir + "/text.kld"), dir + "/text.kld", "not a kiln KL-divergence base file");

  write_file(dir + "/llama.kld", "_logits_" + std::string(100, '\0'));
  expect_error(kld_run(model(), dir + "/llama.kld"), dir + "/llama.kld", "llama.cpp logits file");

  const std::string bytes = read_file(base);
  write_file(dir + "/cut.kld", bytes.substr(0, bytes.size() - 100));
  expect_error(kld_run(model(), dir + "/cut.kld"), dir + "/cut.kld", "truncated");

  expect_error(kld_run(model(), base, "-c 128"), base, "made with a context of 64, not -c 128");

  // A well-formed file from a model with an 8-token vocabulary: 4 tokens, one scored row.
  std::string small("kilnkld\0", 8);
  for (uint32_t v : {1u, 8u, 4u, 1u, 2u}) small.append(reinterpret_cast<const char*>(&v), 4);
  for (int32_t t : {1, 2, 3, 4}) small.append(reinterpret_cast<const char*>(&t), 4);
  small += std::string(16 + 2 * 8, '\0');
  write_file(dir + "/vocab8.kld", small);
  expect_error(kld_run(model(), dir + "/vocab8.kld"), dir + "/vocab8.kld",
               "made with a vocabulary of 8 tokens, this model has 512");

  write_file(dir + "/other.txt", "Tom had a red ball. " + read_file(story()));
  expect_error(kld_run(model(), base, "-f " + shell_quote(dir + "/other.txt")), base, "made from another text");
  // The text it was made from is accepted.
  EXPECT_EQ(kld_run(model(), base, "-f " + shell_quote(story())).exit_code, 0);

  expect_error(kiln_run("perplexity " + shell_quote(model()) + " -f " + shell_quote(story()) +
                        " -c 64 --kl-divergence-base " + shell_quote(dir + "/no/such/dir/b.kld")),
               dir + "/no/such/dir/b.kld", "cannot write");

  auto usage = kiln_run("perplexity " + shell_quote(model()) + " --kl-divergence");
  EXPECT_EQ(usage.exit_code, 2) << usage.err;
  EXPECT_NE(usage.err.find("--kl-divergence-base"), std::string::npos) << usage.err;
}
