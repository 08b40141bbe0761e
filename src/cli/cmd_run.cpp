// kiln run [MODEL] [PROMPT]: streams the answer to stdout; everything else goes to stderr.
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/common.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/generator.h"

namespace kiln::cli {
namespace {

struct RunOptions {
  LogOptions log;
  ModelOptions model;
  GenerationOptions gen;
  std::vector<std::string> positional;
  std::string prompt;
  std::string prompt_file;
  std::string tokenizer_file;
  bool prompt_given = false;
  bool chat = false;
  std::string system;
  ChatTemplateOptions chat_template;
};

int run(RunOptions& o) {
  setup_logging(o.log);
  // [MODEL] [PROMPT]: a lone argument is the model if it names one, else the prompt.
  std::vector<std::string> args = o.positional;
  if (o.model.model.empty() && !args.empty() && (args.size() == 2 || looks_like_model(args[0]))) {
    o.model.model = args[0];
    args.erase(args.begin());
  }
  if (args.size() > 1) throw UsageError("too many arguments: expected [MODEL] [PROMPT]");
  int sources = (!args.empty()) + o.prompt_given + !o.prompt_file.empty();
  if (sources > 1) throw UsageError("give the prompt once: as an argument, with -p, or with -f");
  std::string prompt = o.prompt;
  if (!args.empty()) prompt = args[0];
  if (!o.prompt_file.empty()) prompt = read_text_file(o.prompt_file);
  if (prompt == "-") prompt = read_text_file("-");

  auto model = load_model(resolve_model_path(o.model.model), !o.model.no_repack);
  if (!o.tokenizer_file.empty()) model->replace_tokenizer(Tokenizer::from_spm_file(o.tokenizer_file));
  const Tokenizer& tok = model->tokenizer();
  if (!o.chat && (!o.system.empty() || !o.chat_template.name.empty() || !o.chat_template.file.empty()))
    throw UsageError("--system and --chat-template apply with --chat (-cnv)");

  Session session(*model, session_params(o.model, *model));
  Sampler sampler(o.gen.sampling, model->config().n_vocab);
  Generator generator(session, tok, sampler);
  generator.set_ignore_eos(o.gen.ignore_eos);
  generator.set_kv_eviction(kv_eviction(o.gen, session.n_ctx()));

  bool ends_with_newline = true;
  const auto print = [&](std::string_view text) {
    write_stdout(text);
    ends_with_newline = text.back() == '\n';
  };
  GenerationStats st;
  if (o.chat) {
    std::string origin;
    Chat chat(generator, tok, select_chat_template(*model, o.chat_template, &origin));
    chat.set_system(o.system);
    spdlog::debug("chat template: {}; context {}, threads {}, seed {}", origin, session.n_ctx(), session.n_threads(),
                  sampler.seed());
    st = chat.send(prompt, o.gen.n_predict, print).stats;
  } else {
    const std::vector<int32_t> tokens = tok.encode(prompt, tok.vocab().add_bos);
    if (tokens.empty()) throw UsageError("the prompt is empty and this model adds no BOS token: nothing to start from");
    spdlog::debug("prompt: {} tokens, context {}, threads {}, seed {}", tokens.size(), session.n_ctx(),
                  session.n_threads(), sampler.seed());
    st = generator.generate(tokens, o.gen.n_predict, print);
  }
  if (!ends_with_newline) write_stdout("\n");
  if (st.stop == StopReason::context_full)
    spdlog::warn("kiln: stopped: the context ({} tokens) is full; raise it with -c (or --context-shift)", session.n_ctx());
  if (st.n_discarded > 0)
    spdlog::info("{}: {} older tokens dropped to go on past the context of {}",
                 generator.kv_evictor().policy() == KvEviction::shift ? "context shift" : "kv eviction", st.n_discarded,
                 std::min(session.n_ctx(), generator.kv_evictor().budget()));
  spdlog::info("prompt: {} tokens in {:.1f} ms ({:.1f} tok/s) | generation: {} tokens in {:.1f} ms ({:.1f} tok/s) | stop: {}",
               st.n_prompt, st.prompt_ms, st.n_prompt * 1000.0 / std::max(st.prompt_ms, 1e-9), st.n_generated,
               st.generate_ms, st.n_generated * 1000.0 / std::max(st.generate_ms, 1e-9), stop_reason_name(st.stop));
  return 0;
}

}  // namespace

void register_run(CLI::App& app, Action& action) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  cmd->add_option("args", o->positional, "[MODEL] [PROMPT]  (PROMPT '-' reads stdin; default model models/stories260K.gguf)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->each([o](const std::string&) { o->prompt_given = true; });
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file ('-' for stdin)");
  cmd->add_option("--tokenizer", o->tokenizer_file, "Use this SentencePiece tokenizer.model instead of the GGUF's");
  cmd->add_flag("--chat,--conversation", o->chat,
                "Treat the prompt as a user message in the model's chat template (also -cnv)");
  cmd->add_option("--system", o->system, "System prompt (with --chat)");
  add_chat_template_options(*cmd, o->chat_template);
  add_runtime_options(*cmd, o->model);
  add_sampling_options(*cmd, o->gen);
  add_context_shift_options(*cmd, o->gen, /*on_by_default=*/false);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace kiln::cli
