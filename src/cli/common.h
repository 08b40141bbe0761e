#pragma once
// Options and helpers shared by the subcommands. Each subcommand lives in its own file and
// registers itself with register_<name>(app); main.cpp only dispatches.
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kiln/chat_template.h"
#include "kiln/eviction_policy.h"
#include "kiln/model.h"
#include "kiln/sampler.h"
#include "kiln/session.h"

namespace kiln::cli {

struct LogOptions {
  bool quiet = false;
  bool verbose = false;
};

// RoPE scaling flags as typed (llama.cpp's names); rope_params() checks them.
struct RopeOptions {
  std::string scaling;  // empty: the model's
  std::optional<float> scale, freq_scale, freq_base, yarn_attn_factor;
  std::optional<int64_t> yarn_orig_ctx;
  float yarn_ext_factor = -1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
};

// --no-repack and --repack-experts as typed.
struct RepackFlags {
  bool no_repack = false;
  bool repack_experts = false;
  LoadParams load_params() const;
};

struct ModelOptions {
  std::string model;  // path to the GGUF
  int32_t n_ctx = 0;
  int32_t n_batch = 512;
  int32_t n_threads = 0;
  RepackFlags repack;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  std::string flash_attn = "auto";
  int32_t swa_window = -1, swa_pattern = -1;  // -1: the model's
  bool swa_full = false;
  std::string kv_layout;  // contiguous, paged; empty: contiguous unless --parallel asks for paged
  int32_t kv_block = 16;
  RopeOptions rope;
};

// A KV cache type by its llama.cpp name (f32, f16, bf16, q8_0, q4_0); UsageError otherwise.
TensorType cache_type(const std::string& name);

// -m/--model is also accepted positionally by each command.
void add_log_options(CLI::App& app, LogOptions& opts);
void add_runtime_options(CLI::App& app, ModelOptions& opts);  // also --no-repack and the RoPE flags
void add_rope_options(CLI::App& app, RopeOptions& opts);
// --kv-layout contiguous|paged and --kv-block N (run, chat, perplexity).
void add_kv_layout_options(CLI::App& app, ModelOptions& opts);
KvLayout kv_layout(const std::string& name);  // "" is contiguous
void add_repack_flags(CLI::App& app, RepackFlags& flags);
// --kv-evict none|shift|sink|h2o, --sink-tokens, --kv-budget as typed; kv_eviction() checks them.
struct KvEvictionOptions {
  std::string policy;  // empty: what --context-shift says
  int32_t sink_tokens = 4;
  int32_t budget = 0;  // 0: the context size
  CLI::Option* sink_flag = nullptr;
  CLI::Option* budget_flag = nullptr;
};
void add_kv_eviction_options(CLI::App& app, KvEvictionOptions& opts);
struct GenerationOptions {
  SamplerParams sampling;
  int32_t n_predict = -1;
  bool ignore_eos = false;
  bool context_shift = false;
  int32_t n_keep = 0;
  CLI::Option* shift_flag = nullptr;  // --context-shift or --no-context-shift
  KvEvictionOptions evict;
};
// Also -n and -s (-1: random); the sampler's ranges are kiln::validate's, checked by each command.
void add_sampling_options(CLI::App& app, GenerationOptions& opts);
// A seed as typed: -1 is the random seed; otherwise CLI::ValidationError naming `name`.
uint64_t parse_seed(const std::string& text, const std::string& name);
// -t's bound: 4 x the hardware threads, at most 512 (beyond that only slower, or a
// thread-creation failure); a Validator saying so for every command's -t.
int32_t max_threads();
CLI::Validator thread_count_check();
// --context-shift (or, where it is the default, --no-context-shift), --keep and the
// eviction options: --context-shift is --kv-evict shift, --no-context-shift --kv-evict none.
void add_context_shift_options(CLI::App& app, GenerationOptions& opts, bool on_by_default);
// The policy for a session with this context size; UsageError (one line naming the flag)
// for flags that contradict each other or a budget that cannot work.
KvEvictionParams kv_eviction(const KvEvictionOptions& opts, bool context_shift, bool shift_flag_given, int32_t n_keep,
                             int32_t n_ctx);
KvEvictionParams kv_eviction(const GenerationOptions& opts, int32_t n_ctx);

// Which chat template a conversation uses: --chat-template NAME (built in),
// --chat-template-file FILE, else the model's tokenizer.chat_template, else plain text
// continuation (completion models ship none).
struct ChatTemplateOptions {
  std::string name;
  std::string file;
};
void add_chat_template_options(CLI::App& app, ChatTemplateOptions& opts);
// Throws kiln::Error naming the source, with the built-in names to fall back on, when the
// template does not parse. `*description` (optional) says where it came from.
ChatTemplate select_chat_template(const Model& model, const ChatTemplateOptions& opts,
                                  std::string* description = nullptr);
std::string builtin_template_names();

// Applies --quiet/--verbose to the stderr logger.
void setup_logging(const LogOptions& opts);

// The model path, or the default (models/stories260K.gguf next to the cwd or the binary);
// a given path that does not exist is an Error naming it.
std::string resolve_model_path(const std::string& given);
// True if `arg` looks like a model file rather than a prompt: an existing file, or one word
// ending in .gguf/.bin or holding a '/' (then a missing file is an error, not a prompt).
bool looks_like_model(const std::string& arg);

// `tokenizer_file` (--tokenizer), when given, replaces the GGUF's tokenizer; a llama2.c
// checkpoint, which has none, needs it.
std::unique_ptr<Model> load_model(const std::string& path, const RepackFlags& repack = {}, const std::string& tokenizer_file = "");
// Also logs the RoPE scaling in effect when there is some.
SessionParams session_params(const ModelOptions& opts, const Model& model);
// Throws UsageError naming the flag for a value that cannot work.
RopeParams rope_params(const RopeOptions& opts);

// Thrown when stdout's reader went away (EPIPE: `kiln run ... | head -c 10`): not an
// error to report, so not a std::exception that error handlers along the way would catch
// and print; main() ends quietly with exit code 0.
struct OutputClosed {};
// Writes and flushes generated text: OutputClosed when the reader is gone, kiln::Error
// naming stdout for any other failure (a full disk behind a redirection).
void write_stdout(std::string_view text);

// Reads a whole file (a prompt via -f); "-" means stdin.
std::string read_text_file(const std::string& path);

// The command to run after parsing; set by register_* on the chosen subcommand.
using Action = std::function<int()>;

// Every subcommand registered on `app`; parsing sets `action` to the chosen one.
void build_app(CLI::App& app, Action& action);
// argv[1..] as app.parse(std::vector) takes them, llama.cpp's multi-letter short options
// renamed.
std::vector<std::string> app_args(int argc, const char* const* argv);

void register_run(CLI::App& app, Action& action);
void register_chat(CLI::App& app, Action& action);
void register_bench(CLI::App& app, Action& action);
void register_info(CLI::App& app, Action& action);
void register_tokenize(CLI::App& app, Action& action);
void register_perplexity(CLI::App& app, Action& action);
void register_quantize(CLI::App& app, Action& action);
void register_imatrix(CLI::App& app, Action& action);
void register_template(CLI::App& app, Action& action);
void register_serve(CLI::App& app, Action& action);
void register_embed(CLI::App& app, Action& action);
void register_memory(CLI::App& app, Action& action);

}  // namespace kiln::cli
