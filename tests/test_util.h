#pragma once
// Helpers shared by tests: where ../shared and the kiln binary are, running a command.
#include <string>

namespace kiln::test {

// Built with ASan or TSan (scripts/sanitize): the address space is reserved by the
// sanitizer, and instrumented loads make timings meaningless.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
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
std::string trim(const std::string& s);
std::string shell_quote(const std::string& s);

// Expects a failed kiln run: exit `code`, nothing on stdout, and one error line (the last
// on stderr, after any load info) that contains `fragment`.
void expect_one_line_error(const CommandResult& r, int code, const std::string& fragment);

}  // namespace kiln::test
