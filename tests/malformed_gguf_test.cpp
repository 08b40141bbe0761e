// The malformed-GGUF corpus (tests/malformed_gguf.cpp): every case, loaded through the API
// and through the kiln binary, ends in one line naming the problem (exit code 1), and no
// allocation on the way is larger than the file: nothing a count, length or dimension in
// the file claims is allocated before it has been checked against the file's real size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "alloc_hook.h"
#include "kiln/model.h"
#include "kiln/session.h"
#include "malformed_gguf.h"
#include "test_util.h"

using namespace kiln;
using kiln::test::MalformedCase;

namespace kiln::test {
// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const MalformedCase& c, std::ostream* os) { *os << c.name; }
}  // namespace kiln::test

namespace {

const gguf::File& vocab() {
  static std::unique_ptr<gguf::File> f = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  return *f;
}

const std::vector<MalformedCase>& cases() {
  static const std::vector<MalformedCase> c = test::malformed_gguf_cases(vocab());
  return c;
}

std::string save(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = test::temp_dir() + "/" + name + ".gguf";
  test::write_file(path, std::string(bytes.begin(), bytes.end()));
  return path;
}

// Error messages and the path itself are allocated whatever the file says; a tiny file
// may not bound those.
constexpr size_t kMessageBytes = 4096;

std::string param_name(const ::testing::TestParamInfo<MalformedCase>& info) {
  std::string s = info.param.name;
  for (char& ch : s)
    if (!std::isalnum((unsigned char)ch)) ch = '_';
  return s;
}

}  // namespace

class MalformedGguf : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedGguf, LoadThrowsOneLineNamingTheProblemWithoutLargeAllocations) {
  const MalformedCase& c = GetParam();
  const std::string path = save(c.name, c.bytes);
  std::string message;
  {
    test::AllocationWindow w;
    try {
      Model::load(path);
    } catch (const Error& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("not a kiln::Error: ") + e.what();
    }
    w.stop();
  }
  ASSERT_FALSE(message.empty()) << c.name << " loaded";
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& f : c.expect) EXPECT_NE(message.find(f), std::string::npos) << "no '" << f << "' in: " << message;
  EXPECT_LE(test::AllocationWindow::largest(), std::max(c.bytes.size(), kMessageBytes))
      << "an allocation larger than the " << c.bytes.size() << "-byte file";
}

TEST_P(MalformedGguf, CliExitsWith1AndOneErrorLine) {
  const MalformedCase& c = GetParam();
  const std::string path = save(c.name, c.bytes);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(path) + " hi -n 1");
  for (const std::string& f : c.expect) test::expect_one_line_error(r, 1, f);
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedGguf, ::testing::ValuesIn(cases()), param_name);

// Each case breaks one thing in the base model, so the base itself must load and run:
// otherwise a case could fail for a reason other than its own.
TEST(MalformedGgufCorpus, BaseModelLoadsAndGenerates) {
  const std::string path = save("base", test::base_model(vocab()).bytes());
  auto m = Model::load(path);
  EXPECT_EQ(m->config().n_vocab, 512u);
  SessionParams p;
  p.n_ctx = 16;
  Session s(*m, p);
  const int32_t prompt[3] = {1, 400, 401};
  EXPECT_EQ(s.decode(prompt).size(), 512u);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(path) +
                                   " 'Once upon' -n 4 --temp 0 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(MalformedGgufCorpus, MoeBaseModelLoadsAndGenerates) {
  const std::string path = save("moe-base", test::moe_model(vocab()).bytes());
  auto m = Model::load(path);
  EXPECT_EQ(m->config().n_experts, 4u);
  EXPECT_EQ(m->config().n_experts_used, 2u);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(path) +
                                   " 'Once upon' -n 4 --temp 0 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(MalformedGgufCorpus, Mamba2BaseModelLoadsAndGenerates) {
  const std::string path = save("mamba2-base", test::mamba2_model(vocab()).bytes());
  auto m = Model::load(path);
  EXPECT_EQ(m->config().ssm_n_heads, 4u);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(path) +
                                   " 'Once upon' -n 4 --temp 0 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(MalformedGgufCorpus, GraniteHybridBaseModelLoadsAndGenerates) {
  const std::string path = save("granitehybrid-base", test::granite_hybrid_model(vocab()).bytes());
  auto m = Model::load(path);
  EXPECT_TRUE(m->config().is_ssm(0));
  EXPECT_FALSE(m->config().is_ssm(1));
  EXPECT_EQ(m->config().shared_expert_ffn_dim, 8u);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " run " + test::shell_quote(path) +
                                   " 'Once upon' -n 4 --temp 0 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(MalformedGgufCorpus, AtLeastThirtyDistinctCases) {
  std::set<std::string> names, contents;
  for (const MalformedCase& c : cases()) {
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
    EXPECT_TRUE(contents.insert(std::string(c.bytes.begin(), c.bytes.end())).second) << c.name << " repeats a case";
    EXPECT_FALSE(c.expect.empty()) << c.name;
  }
  EXPECT_GE(cases().size(), 30u);
}
