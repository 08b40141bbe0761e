#include "test_util.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kiln::test {

std::string shared_dir() {
  if (const char* env = std::getenv("KILN_SHARED_DIR")) return env;
  return KILN_SHARED_DIR;
}
std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }
std::string kiln_binary() { return KILN_BINARY; }

// One folder per test process, removed when the process exits (set KILN_KEEP_TEST_FILES
// to keep it for a post-mortem): a whole suite writes gigabytes of model files, which
// filled the disk when every run left them behind.
std::string temp_dir() {
  static std::string dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    return pattern;
  }();
  static const bool cleanup_registered = [] {
    if (!std::getenv("KILN_KEEP_TEST_FILES"))
      std::atexit([] {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      });
    return true;
  }();
  (void)cleanup_registered;
  return dir;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), (std::streamsize)bytes.size());
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CommandResult run_command(const std::string& command, const std::string& input) {
  const std::string dir = temp_dir();
  static int counter = 0;
  const std::string base = dir + "/cmd" + std::to_string(++counter);
  write_file(base + ".in", input);
  const std::string full = "( " + command + " ) <" + base + ".in >" + base + ".out 2>" + base + ".err";
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  return r;
}

void expect_one_line_error(const CommandResult& r, int code, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const std::string err = trim(r.err);
  const std::string last_line = err.substr(err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
  EXPECT_EQ(last_line.rfind("kiln: error: ", 0), 0u) << err;
  EXPECT_EQ(err.find("error"), err.rfind("error")) << "more than one error line: " << err;
  EXPECT_NE(last_line.find(fragment), std::string::npos) << err;
}

double chi_square(const std::vector<double>& observed, const std::vector<double>& expected, int& df) {
  double stat = 0, pooled_o = 0, pooled_e = 0;
  int cells = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] < 5) {
      pooled_o += observed[i];
      pooled_e += expected[i];
      continue;
    }
    stat += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  df = cells - 1;
  return stat;
}

double chi_square_two_samples(const std::vector<std::pair<double, double>>& counts, int& df) {
  // Equal sample sizes: a cell's expected count is the mean of its two counts.
  std::vector<double> observed, expected;
  for (const auto& [a, b] : counts) {
    observed.push_back(a);
    expected.push_back((a + b) / 2);
    observed.push_back(b);
    expected.push_back((a + b) / 2);
  }
  const double stat = chi_square(observed, expected, df);
  df = std::max(1, df / 2);  // (rows - 1) x (columns - 1) with two columns
  return stat;
}

double chi_square_critical(int df) {
  const double z = 3.719;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

DotExpectation expected_dot(const float* w, const float* x, size_t k, size_t act_block) {
  DotExpectation e;
  const double step_error = act_block == 32 ? 0.5 + 127.0 / 2048.0 : 0.5;
  for (size_t b = 0; b < k; b += act_block) {
    double amax = 0;
    for (size_t i = b; i < b + act_block; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    for (size_t i = b; i < b + act_block; ++i) {
      e.value += double(w[i]) * x[i];
      e.magnitude += std::fabs(double(w[i]) * x[i]);
      e.bound += std::fabs(double(w[i])) * amax / 127.0 * step_error;
    }
  }
  e.bound += 1e-5 * e.magnitude + 1e-30;
  return e;
}

}  // namespace kiln::test
