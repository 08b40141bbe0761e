// Command-line parsing: the input is argv (arguments separated by NUL bytes) for the
// whole kiln app, every subcommand and option registered as main.cpp does. Only parsing
// runs (the chosen command is not executed); help and errors are rendered into a string.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cli/common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> storage{"kiln"};
  std::string cur;
  for (size_t i = 0; i < size && storage.size() < 64; ++i) {
    if (data[i] == 0) {
      storage.push_back(cur);
      cur.clear();
    } else {
      cur += char(data[i]);
    }
  }
  if (!cur.empty()) storage.push_back(cur);
  std::vector<const char*> argv;
  for (const std::string& s : storage) argv.push_back(s.c_str());

  CLI::App app{"kiln: local LLM inference on the CPU", "kiln"};
  kiln::cli::Action action;
  kiln::cli::build_app(app, action);
  std::vector<std::string> args = kiln::cli::app_args(int(argv.size()), argv.data());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    (void)app.exit(e, out, err);
  } catch (const kiln::Error&) {
  }
  return 0;
}
