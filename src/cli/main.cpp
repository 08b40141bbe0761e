// kiln: one binary, subcommands like llama.cpp's tools and ollama. Errors are caught
// here, printed once, and turned into the exit code: 0 ok, 1 runtime error, 2 usage error.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include <iostream>

#include "cli/common.h"
#include "kiln/error.h"

int main(int argc, char** argv) {
  using namespace kiln::cli;
  CLI::App app{"kiln: local LLM inference on the CPU", "kiln"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln 0.1.0");
  Action action;
  register_run(app, action);
  register_chat(app, action);
  register_bench(app, action);
  register_info(app, action);
  register_tokenize(app, action);
  register_perplexity(app, action);
  register_quantize(app, action);
  register_template(app, action);

  // llama.cpp's users type -cnv, -ctk, -ctv, -fa, -np; CLI11 only knows one-letter short options.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args) {
    if (a == "-cnv") a = "--chat";
    else if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
    else if (a == "-fa") a = "--flash-attn";
    else if (a == "-np") a = "--parallel";
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return action ? action() : 2;
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
