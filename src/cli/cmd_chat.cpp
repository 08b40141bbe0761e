// kiln chat MODEL: an interactive loop. The KV cache lives across turns, so each turn only
// runs its new tokens. Ctrl-C stops the current answer; /bye or Ctrl-D leaves.
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "chat/plain_format.h"
#include "cli/common.h"
#include "kiln/error.h"
#include "kiln/generator.h"

namespace kiln::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted.store(true); }

struct ChatOptions {
  LogOptions log;
  ModelOptions model;
  GenerationOptions gen;
  std::string system;
};

void print_help() {
  std::fprintf(stderr,
               "commands:\n"
               "  /bye      leave (or Ctrl-D)\n"
               "  /clear    forget the conversation\n"
               "  /help     this list\n"
               "Ctrl-C stops the current answer.\n");
}

int chat(ChatOptions& o) {
  setup_logging(o.log);
  auto model = load_model(resolve_model_path(o.model.model), !o.model.no_repack);
  const Tokenizer& tok = model->tokenizer();
  Session session(*model, session_params(o.model));
  Sampler sampler(o.gen.sampling, model->config().n_vocab);
  Generator generator(session, tok, sampler);
  generator.set_ignore_eos(o.gen.ignore_eos);
  PlainChatFormat format(tok);

  // No SA_RESTART: Ctrl-C at the prompt interrupts the read instead of waiting for Enter.
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  const bool interactive = isatty(fileno(stdin));
  if (interactive) std::fprintf(stderr, "kiln chat: type a message, /help for commands, /bye to leave.\n");
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, ">>> ");
    g_interrupted.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupted.load() && !std::cin.eof()) {  // Ctrl-C at the prompt: keep going
        std::cin.clear();
        std::fprintf(stderr, "\n(use Ctrl-D or /bye to leave)\n");
        continue;
      }
      if (interactive) std::fprintf(stderr, "\n");
      break;
    }
    if (line == "/bye") break;
    if (line == "/help" || line == "/?") { print_help(); continue; }
    if (line == "/clear") {
      generator.reset();
      format.reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (!line.empty() && line[0] == '/') {
      std::fprintf(stderr, "unknown command %s (try /help)\n", line.c_str());
      continue;
    }
    if (line.empty()) continue;

    std::vector<int32_t> turn;
    try {
      turn = format.user_turn(line);
      const GenerationStats st = generator.generate(turn, o.gen.n_predict, [](std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }, &g_interrupted);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      format.commit_turn();
      if (st.stop == StopReason::cancelled) std::fprintf(stderr, "(stopped)\n");
      if (st.stop == StopReason::context_full)
        std::fprintf(stderr, "(the context of %d tokens is full: /clear to start over, or raise -c)\n", session.n_ctx());
      spdlog::debug("turn: {} new tokens processed ({} in the conversation), {} generated in {:.1f} ms",
                    st.n_prompt, generator.history().size(), st.n_generated, st.generate_ms);
    } catch (const Error& e) {
      // A failed turn leaves the conversation as it was; the user can go on.
      std::fprintf(stderr, "kiln: error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace

void register_chat(CLI::App& app, Action& action) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive chat with a model");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  add_runtime_options(*cmd, o->model);
  add_sampling_options(*cmd, o->gen);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return chat(*o); }; });
}

}  // namespace kiln::cli
