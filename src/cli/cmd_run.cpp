// kiln run [MODEL] [PROMPT]: streams the answer to stdout; everything else goes to stderr.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

#include "cli/common.h"
#include "cli/speculation.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/generator.h"
#include "kiln/parallel.h"

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
  int32_t n_parallel = 0;  // --parallel N; 0: one sequence through the Generator
  SpeculativeOptions spec;
};

// --parallel N: N samples of the prompt, printed one after the other under a header
// line each; the KV memory they took with the prompt's blocks shared, and what N
// unshared copies would have taken, on stderr.
int run_parallel(RunOptions& o, const Model& model, Session& session, const std::vector<int32_t>& tokens) {
  ParallelParams pp;
  pp.n_seq = o.n_parallel;
  pp.n_predict = o.gen.n_predict;
  pp.sampling = o.gen.sampling;
  pp.ignore_eos = o.gen.ignore_eos;
  const ParallelResult r = generate_parallel(session, model.tokenizer(), tokens, pp);
  for (size_t i = 0; i < r.seqs.size(); ++i) {
    const ParallelSequence& s = r.seqs[i];
    std::printf("%s--- sequence %zu (seed %llu) ---\n%s", i ? "\n" : "", i, (unsigned long long)s.seed, s.text.c_str());
    if (s.text.empty() || s.text.back() != '\n') std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  const KvMemory& m = r.peak;
  const double mib = 1024.0 * 1024.0;
  if (session.kv_layout() == KvLayout::paged)
    spdlog::info("kv cache: {:.2f} MiB in {} blocks of {} tokens with the prompt shared; {} unshared copies would take "
                 "{:.2f} MiB in {} blocks ({:.2f}x)",
                 m.bytes_used / mib, m.blocks_used, o.model.kv_block, r.seqs.size(), m.bytes_unshared / mib,
                 m.blocks_unshared, m.bytes_unshared / std::max(m.bytes_used, 1.0));
  int32_t full = 0;
  for (const ParallelSequence& s : r.seqs) full += s.stop == StopReason::context_full;
  if (full > 0) spdlog::warn("kiln: {} sequence(s) stopped: the context ({} tokens) is full; raise it with -c", full, session.n_ctx());
  spdlog::info("prompt: {} tokens in {:.1f} ms ({:.1f} tok/s) | generation: {} tokens in {} sequences in {:.1f} ms "
               "({:.1f} tok/s)",
               r.n_prompt, r.prompt_ms, r.n_prompt * 1000.0 / std::max(r.prompt_ms, 1e-9), r.n_generated, r.seqs.size(),
               r.generate_ms, r.n_generated * 1000.0 / std::max(r.generate_ms, 1e-9));
  return 0;
}

int run(RunOptions& o) {
  setup_logging(o.log);
  // [MODEL] [PROMPT]: a lone argument is the model if it names one, else the prompt.
  validate(o.gen.sampling);
  std::vector<std::string> args = o.positional;
  if (o.model.model.empty() && !args.empty() && (args.size() == 2 || looks_like_model(args[0]))) {
    o.model.model = args[0];
    args.erase(args.begin());
    std::error_code ec;
    // Never the default model with the path as its prompt.
    if (args.empty() && !std::filesystem::exists(o.model.model, ec))
      throw Error(o.model.model + ": cannot open: no such model file (for a prompt that looks like a path, use -p)");
  }
  if (args.size() > 1) throw UsageError("too many arguments: expected [MODEL] [PROMPT]");
  int sources = (!args.empty()) + o.prompt_given + !o.prompt_file.empty();
  if (sources > 1) throw UsageError("give the prompt once: as an argument, with -p, or with -f");
  std::string prompt = o.prompt;
  if (!args.empty()) prompt = args[0];
  if (!o.prompt_file.empty()) prompt = read_text_file(o.prompt_file);
  if (prompt == "-") prompt = read_text_file("-");

  if (o.n_parallel > 1 && !o.model.kv_layout.empty() && kv_layout(o.model.kv_layout) != KvLayout::paged)
    throw UsageError("--parallel needs --kv-layout paged (the sequences share the prompt's blocks)");
  if (o.n_parallel > 1) o.model.kv_layout = "paged";
  if (o.n_parallel > 0 && spec_type(o.spec) != SpecType::none)
    throw UsageError("--parallel and speculative decoding (-md, --spec-type) do not go together");
  kv_eviction(o.gen, 1 << 30);  // flags checked against each other before loading; budget below
  const std::string model_path = resolve_model_path(o.model.model);
  auto model = load_model(model_path, o.model.repack, o.tokenizer_file);
  const Tokenizer& tok = model->tokenizer();
  if (!o.chat && (!o.system.empty() || !o.chat_template.name.empty() || !o.chat_template.file.empty()))
    throw UsageError("--system and --chat-template apply with --chat (-cnv)");

  Session session(*model, session_params(o.model, *model));
  Sampler sampler(o.gen.sampling, model->config().n_vocab);
  Generator generator(session, tok, sampler);
  generator.set_ignore_eos(o.gen.ignore_eos);
  generator.set_kv_eviction(kv_eviction(o.gen, session.n_ctx()));
  const std::unique_ptr<Model> draft_model = load_draft_model(o.spec, *model, model_path, o.model.repack);
  const Speculation speculation = make_speculation(o.spec, draft_model.get(), session, o.model, o.gen.sampling);
  speculation.attach(generator);

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
    // N answers to the one user message: its rendered prompt, sampled N times.
    if (o.n_parallel > 0) return run_parallel(o, *model, session, chat.prompt_tokens(prompt));
    st = chat.send(prompt, o.gen.n_predict, print).stats;
  } else {
    const std::vector<int32_t> tokens = tok.encode(prompt, tok.vocab().add_bos);
    if (tokens.empty()) throw UsageError("the prompt is empty and this model adds no BOS token: nothing to start from");
    spdlog::debug("prompt: {} tokens, context {}, threads {}, seed {}", tokens.size(), session.n_ctx(),
                  session.n_threads(), sampler.seed());
    if (o.n_parallel > 0) return run_parallel(o, *model, session, tokens);
    st = generator.generate(tokens, o.gen.n_predict, print);
  }
  if (!ends_with_newline) write_stdout("\n");
  if (st.stop == StopReason::context_full)
    spdlog::warn("kiln: stopped: the context ({} tokens) is full; raise it with -c (or --context-shift)", session.n_ctx());
  if (st.n_discarded > 0)
    spdlog::info("{}: {} older tokens dropped to go on past the context of {}",
                 generator.kv_evictor().policy() == KvEviction::shift ? "context shift" : "kv eviction", st.n_discarded,
                 std::min(session.n_ctx(), generator.kv_evictor().budget()));
  spdlog::info("prompt: {} tokens in {:.1f} ms ({:.1f} tok/s) | generation: {} tokens in {:.1f} ms ({:.1f} tok/s) | stop: {} "
               "| seed {}",
               st.n_prompt, st.prompt_ms, st.n_prompt * 1000.0 / std::max(st.prompt_ms, 1e-9), st.n_generated,
               st.generate_ms, st.n_generated * 1000.0 / std::max(st.generate_ms, 1e-9), stop_reason_name(st.stop),
               sampler.seed());
  if (speculation.drafter) spdlog::info("{}", speculation_summary(st.spec, st.n_generated, st.generate_ms));
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
  cmd->add_option("--tokenizer", o->tokenizer_file, "Use this tokenizer instead of the GGUF's (tokenizer.json, SentencePiece .model or llama2.c tokenizer.bin); required for a llama2.c checkpoint");
  cmd->add_flag("--chat,--conversation", o->chat,
                "Treat the prompt as a user message in the model's chat template (also -cnv)");
  cmd->add_option("--system", o->system, "System prompt (with --chat)");
  add_chat_template_options(*cmd, o->chat_template);
  add_runtime_options(*cmd, o->model);
  add_kv_layout_options(*cmd, o->model);
  cmd->add_option("--parallel", o->n_parallel,
                  "Generate N samples of the prompt at once (also -np), sequence i with seed + i: the prompt is decoded "
                  "once and its KV blocks shared (paged layout), one batch of N tokens per step")
      ->check(CLI::PositiveNumber);
  add_sampling_options(*cmd, o->gen);
  add_speculative_options(*cmd, o->spec);
  add_context_shift_options(*cmd, o->gen, /*on_by_default=*/false);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace kiln::cli
