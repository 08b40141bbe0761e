// Drives LineEditor without a model, for line_editor_test: prints each input as
// [input:<text>] (newlines as \n); the input "work" prints dots until Ctrl-C, like a reply
// being generated, then [stopped]. Ends with [eof] and status 0.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "cli/line_editor.h"

int main() {
  using kiln::cli::interrupt_flag;
  kiln::cli::install_sigint_handler();
  kiln::cli::LineEditor editor("kiln-test", kiln::cli::default_history_path());
  while (auto input = editor.read(">>> ")) {
    std::string shown;
    for (char c : *input) shown += c == '\n' ? std::string("\\n") : std::string(1, c);
    std::printf("[input:%s]\n", shown.c_str());
    std::fflush(stdout);
    if (*input != "work") continue;
    interrupt_flag().store(false);
    std::printf("[working]");
    // At most 10 s, so that a lost Ctrl-C fails the test instead of hanging it.
    int ticks = 0;
    for (; ticks < 500 && !interrupt_flag().load(); ++ticks) {
      std::putchar('.');
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf(ticks < 500 ? "[stopped]\n" : "[timeout]\n");
    std::fflush(stdout);
  }
  std::printf("[eof]\n");
  return 0;
}
