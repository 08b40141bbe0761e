// The command line as one CLI11 app: main.cpp parses and runs it, the CLI fuzz target
// (tests/fuzz/fuzz_cli.cpp) only parses it.
#include <algorithm>

#include "cli/common.h"

namespace kiln::cli {

void build_app(CLI::App& app, Action& action) {
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln 0.1.0");
  register_run(app, action);
  register_chat(app, action);
  register_bench(app, action);
  register_info(app, action);
  register_tokenize(app, action);
  register_perplexity(app, action);
  register_quantize(app, action);
  register_imatrix(app, action);
  register_template(app, action);
  register_serve(app, action);
  register_embed(app, action);
  register_memory(app, action);
}

std::vector<std::string> app_args(int argc, const char* const* argv) {
  // llama.cpp's users type -cnv, -ctk, -ctv, -fa, -np, -md; CLI11 only knows one-letter short options.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args) {
    if (a == "-cnv") a = "--chat";
    else if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
    else if (a == "-fa") a = "--flash-attn";
    else if (a == "-np") a = "--parallel";
    else if (a == "-md") a = "--model-draft";
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  return args;
}

}  // namespace kiln::cli
