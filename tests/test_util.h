#pragma once
// Helpers shared by tests: where ../shared and the kiln binary are, running a command.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace kiln::test {

#ifdef __has_feature
#define KILN_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define KILN_TEST_HAS_FEATURE(x) 0
#endif
// Built with TSan: a test whose paths differ only in thread count may run just its
// threaded ones there (on one thread there is nothing for TSan to find).
inline constexpr bool kThreadSanitized =
#if defined(__SANITIZE_THREAD__) || KILN_TEST_HAS_FEATURE(thread_sanitizer)
    true;
#else
    false;
#endif
// Built with ASan or TSan (scripts/sanitize): the address space is reserved by the
// sanitizer, and instrumented loads make timings meaningless.
inline constexpr bool kSanitized = kThreadSanitized ||
#if defined(__SANITIZE_ADDRESS__) || KILN_TEST_HAS_FEATURE(address_sanitizer)
                                   true;
#else
                                   false;
#endif

std::string shared_dir();                  // absolute path of ../shared
std::string shared_path(const std::string& rel);  // shared_dir() + "/" + rel
std::string kiln_binary();                 // the built kiln executable
std::string temp_dir();                    // a fresh directory for this test process

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `command` through /bin/sh with `input` on stdin.
CommandResult run_command(const std::string& command, const std::string& input = "");

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
// Non-overlapping occurrences of `what` in `text`.
size_t count_occurrences(const std::string& text, const std::string& what);
std::string trim(const std::string& s);
std::string shell_quote(const std::string& s);

// Expects a failed kiln run: exit `code`, nothing on stdout, and one error line (the last
// on stderr, after any load info) that contains `fragment`.
void expect_one_line_error(const CommandResult& r, int code, const std::string& fragment);

// Pearson's statistic of observed counts against expected ones, pooling categories
// expected below 5 into one; `df` gets its degrees of freedom.
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected, int& df);
// Two samples of equal size over the same categories (a, b counts per category): the
// statistic of their homogeneity test, df = categories - 1 (after pooling).
double chi_square_two_samples(const std::vector<std::pair<double, double>>& counts, int& df);
// The chi-square quantile at 1 - 1e-4 (Wilson-Hilferty): a correct sampler fails a test
// against it once in 10,000 seeds, and the seeds of the tests are fixed.
double chi_square_critical(int df);

// A weight row times an activation row in float64, and the error bound the 8-bit
// activation kernels keep (kernels/packed.h): each x_i moves by at most half a step of its
// activation block's scale, amax / 127 per act_block (32: plus the fp16 rounding of that
// scale, 127/2048 of a step), plus 1e-5 of the sum of |w_i x_i| for float rounding.
struct DotExpectation {
  double value = 0, bound = 0, magnitude = 0;
};
DotExpectation expected_dot(const float* w, const float* x, size_t k, size_t act_block);

}  // namespace kiln::test
