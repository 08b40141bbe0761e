// kiln chat MODEL: an interactive conversation in the model's chat template. The KV cache
// lives across turns, so each turn only evaluates its new tokens; --session FILE keeps the
// conversation and its cache across runs. Ctrl-C stops an answer, Ctrl-D or /bye leaves.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/chat_commands.h"
#include "cli/common.h"
#include "cli/line_editor.h"
#include "cli/speculation.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/session_file.h"

namespace kiln::cli {
namespace {

struct ChatOptions {
  LogOptions log;
  ModelOptions model;
  GenerationOptions gen;
  ChatTemplateOptions chat_template;
  std::string system;
  std::string session_file;
  SpeculativeOptions spec;
  ChatMemoryOptions memory;
};

// What this chat's memories are tagged with: the session file when there is one (a
// resumed conversation keeps its tag), else the time and process.
std::string conversation_id(const ChatOptions& o) {
  if (!o.session_file.empty()) return std::filesystem::absolute(o.session_file).string();
  return "chat-" + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                      std::chrono::system_clock::now().time_since_epoch()).count()) +
         "-" + std::to_string(::getpid());
}

int chat(ChatOptions& o) {
  setup_logging(o.log);
  validate(o.gen.sampling);
  spec_type(o.spec);
  if (o.memory.k < 0) throw UsageError("--memory-k must be >= 0, got " + std::to_string(o.memory.k));
  if (o.memory.file.empty() && !o.memory.embed_model.empty()) throw UsageError("--embed-model needs --memory FILE.db");
  // The memory first: a file refused there costs no model load.
  std::unique_ptr<ChatMemory> memory;
  if (!o.memory.file.empty()) memory = std::make_unique<ChatMemory>(o.memory, conversation_id(o), o.model.n_threads);
  const std::string model_path = resolve_model_path(o.model.model);
  auto model = load_model(model_path, o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  Session session(*model, session_params(o.model, *model));
  Sampler sampler(o.gen.sampling, model->config().n_vocab);
  spdlog::info("seed {}", sampler.seed());
  Generator generator(session, tok, sampler);
  generator.set_ignore_eos(o.gen.ignore_eos);
  generator.set_kv_eviction(kv_eviction(o.gen, session.n_ctx()));
  const std::unique_ptr<Model> draft_model = load_draft_model(o.spec, *model, model_path, o.model.repack);
  const Speculation speculation = make_speculation(o.spec, draft_model.get(), session, o.model, o.gen.sampling);
  speculation.attach(generator);
  std::string template_origin;
  Chat chat(generator, tok, select_chat_template(*model, o.chat_template, &template_origin));
  chat.set_system(o.system);
  if (memory) memory->base_system = o.system;

  ChatState state{model_path, *model, session, sampler, generator, chat, o.gen, template_origin, o.log.verbose, ChatTurn{},
                  memory.get()};
  if (!o.session_file.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(o.session_file, ec)) {
      if (!load_chat(state, o.session_file, /*restore_parameters=*/false)) {
        // Saving over it after the first turn would destroy what may be someone's other chat.
        std::fprintf(stderr, "(starting a new conversation; %s is left as it is, /save FILE keeps this one)\n",
                     o.session_file.c_str());
        o.session_file.clear();
      }
    } else {
      spdlog::info("kiln: {} does not exist yet: a new conversation, saved there after each turn", o.session_file);
    }
  }

  install_sigint_handler();
  LineEditor editor("kiln", default_history_path());
  const bool interactive = isatty(STDIN_FILENO);
  if (interactive)
    std::fprintf(stderr, "kiln chat, template: %s\nType a message; /help for commands, \"\"\" for several lines, Ctrl-D to leave.\n",
                 template_origin.c_str());

  while (true) {
    interrupt_flag().store(false);
    const std::optional<std::string> input = editor.read(">>> ");
    if (!input) break;
    if (input->empty()) continue;
    if ((*input)[0] == '/') {
      if (run_command(state, *input) == CommandResult::quit) break;
      continue;
    }
    try {
      interrupt_flag().store(false);
      if (memory) {
        // Room for the reply: what -n asks for, or an eighth of the context.
        const size_t n_ctx = size_t(session.n_ctx());
        const size_t reserve = o.gen.n_predict > 0 ? size_t(o.gen.n_predict) : std::max<size_t>(1, n_ctx / 8);
        report_recall(state, memory->recall_into(chat, *input, n_ctx, reserve));
      }
      bool ends_with_newline = true;
      const ChatTurn turn = chat.send(*input, o.gen.n_predict, [&](std::string_view text) {
        write_stdout(text);
        ends_with_newline = text.back() == '\n';
      }, &interrupt_flag());
      if (!ends_with_newline) write_stdout("\n");
      state.last = turn;
      report_turn(state, turn);
      if (!o.session_file.empty()) save_chat(state, o.session_file, /*quiet=*/!state.verbose);
      if (memory) memory->remember_turn(*input);
    } catch (const Error& e) {
      // The turn failed as a whole: the conversation is as it was before it.
      std::fflush(stdout);
      std::fprintf(stderr, "kiln: error: %s\n", e.what());
    }
  }
  if (interactive) std::fputc('\n', stderr);
  return 0;
}

}  // namespace

void register_chat(CLI::App& app, Action& action) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive chat with a model");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("--system", o->system, "System prompt");
  cmd->add_option("--session", o->session_file,
                  "Resume the conversation saved in this file (with its KV cache; sampling settings come from this command line) and save it there after each turn");
  cmd->add_option("--memory", o->memory.file,
                  "Remember what you say across chats in this SQLite file; each turn recalls the most relevant memories into the system prompt");
  cmd->add_option("--memory-k", o->memory.k, "Memories recalled per turn (default 3)");
  cmd->add_option("--embed-model", o->memory.embed_model,
                  "Embedding model (GGUF) for the memory: recall fuses keyword (BM25) and embedding similarity");
  add_chat_template_options(*cmd, o->chat_template);
  add_runtime_options(*cmd, o->model);
  add_kv_layout_options(*cmd, o->model);
  add_sampling_options(*cmd, o->gen);
  add_speculative_options(*cmd, o->spec);
  add_context_shift_options(*cmd, o->gen, /*on_by_default=*/true);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return chat(*o); }; });
}

}  // namespace kiln::cli
