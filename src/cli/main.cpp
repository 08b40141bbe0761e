// kiln: one binary, subcommands like llama.cpp's tools and ollama. Errors are caught
// here, printed once, and turned into the exit code: 0 ok, 1 runtime error, 2 usage error.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "kiln/error.h"

namespace {

// Weights that stay in the file mapping (all of them with --no-repack, the embedding
// table always) are read from the file's pages. If another program truncates the file
// meanwhile (a copy over it, a download rewriting it), the next read of a vanished page
// raises SIGBUS: end with one error line instead of a crash report. A file replaced by a
// rename keeps serving the old contents: the mapping holds the old inode.
void on_sigbus(int) {
  static const char kMessage[] =
      "kiln: error: a mapped file (the model) was truncated or overwritten while in use\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  _exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cli;
  // A reader that goes away (`kiln run ... | head -c 10`) is seen as EPIPE by
  // write_stdout, which ends generation quietly, rather than as a signal mid-write.
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);

  CLI::App app{"kiln: local LLM inference on the CPU", "kiln"};
  Action action;
  build_app(app, action);
  std::vector<std::string> args = app_args(argc, argv);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return action ? action() : 2;
  } catch (const OutputClosed&) {
    return 0;
  } catch (const kiln::UsageError& e) {
    std::fflush(stdout);
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  }
}
