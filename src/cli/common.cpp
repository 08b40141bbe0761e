#include "cli/common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "kernels/kernels.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "runtime/rope.h"
#include "runtime/sliding_window.h"
#include "util/ms_since.h"

namespace kiln::cli {
namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s;
}

}  // namespace

TensorType cache_type(const std::string& name) {
  const std::string n = lower(name);
  if (n == "f32") return TensorType::F32;
  if (n == "f16") return TensorType::F16;
  if (n == "bf16") return TensorType::BF16;
  if (n == "q8_0") return TensorType::Q8_0;
  if (n == "q4_0") return TensorType::Q4_0;
  throw UsageError("unknown KV cache type '" + name + "' (f32, f16, bf16, q8_0, q4_0)");
}

void add_log_options(CLI::App& app, LogOptions& opts) {
  app.add_flag("-q,--quiet", opts.quiet, "Print only the requested output (no load info or timings)");
  app.add_flag("-v,--verbose", opts.verbose, "Print more detail on stderr");
}

void add_runtime_options(CLI::App& app, ModelOptions& opts) {
  app.add_option("-c,--ctx-size", opts.n_ctx, "Context size in tokens (0: the model's, capped at 4096)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-b,--batch-size", opts.n_batch, "Tokens per prefill step")->check(CLI::PositiveNumber);
  app.add_option("-t,--threads", opts.n_threads, "Threads (0: physical cores)")->check(thread_count_check());
  const auto cache_types = CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}, CLI::ignore_case);
  app.add_option("--cache-type-k", opts.cache_type_k, "KV cache type of keys (also -ctk): f32, f16, bf16, q8_0, q4_0")
      ->check(cache_types)->capture_default_str();
  app.add_option("--cache-type-v", opts.cache_type_v,
                 "KV cache type of values (also -ctv); q8_0 and q4_0 need flash attention")
      ->check(cache_types)->capture_default_str();
  app.add_option("--flash-attn", opts.flash_attn,
                 "Tiled attention with an online softmax (also -fa): on, off, auto (on only when the cache types "
                 "need it; llama.cpp's auto is on whenever its backend has flash attention, so always on a CPU: "
                 "-fa on to compare)")
      ->check(CLI::IsMember({"on", "off", "auto"}, CLI::ignore_case))->capture_default_str();
  app.add_option("--swa-window", opts.swa_window,
                 "Sliding-window attention: window of the sliding layers, every layer if the model has none (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--swa-pattern", opts.swa_pattern, "Sliding layers: all but every Nth (layer l % N == N - 1 is global)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--swa-full", opts.swa_full,
               "Keep a full-size, masked KV cache for sliding-window layers instead of a ring of window + batch slots");
  add_repack_flags(app, opts.repack);
  add_rope_options(app, opts.rope);
}

void add_kv_layout_options(CLI::App& app, ModelOptions& opts) {
  app.add_option("--kv-layout", opts.kv_layout,
                 "KV cache layout: contiguous (default; paged with --parallel) or paged (blocks on demand, "
                 "shared prefixes, copy-on-write)")
      ->check(CLI::IsMember({"contiguous", "paged"}, CLI::ignore_case));
  app.add_option("--kv-block", opts.kv_block, "Positions per block of the paged KV layout")
      ->check(CLI::Range(1, 1024))->capture_default_str();
}

KvLayout kv_layout(const std::string& name) { return lower(name) == "paged" ? KvLayout::paged : KvLayout::contiguous; }

void add_rope_options(CLI::App& app, RopeOptions& o) {
  // Optional values are set through callbacks: an unset flag must mean "the model's".
  const auto add_optional = [&app](const char* name, auto& field, const char* help) {
    using T = typename std::remove_reference_t<decltype(field)>::value_type;
    app.add_option_function<T>(name, [&field](const T& v) { field = v; }, help);
  };
  app.add_option("--rope-scaling", o.scaling, "RoPE scaling: none, linear, ntk or yarn (default: the model's)");
  add_optional("--rope-scale", o.scale, "RoPE context extension factor (default: the model's rope.scaling.factor)");
  add_optional("--rope-freq-base", o.freq_base, "RoPE base frequency (default: the model's rope.freq_base)");
  add_optional("--rope-freq-scale", o.freq_scale, "RoPE frequency scale, 1 / --rope-scale");
  add_optional("--yarn-orig-ctx", o.yarn_orig_ctx, "YaRN original context (default: the model's, else its context_length)");
  app.add_option("--yarn-ext-factor", o.yarn_ext_factor, "YaRN extrapolation mix (-1: 1 for yarn, else 0)");
  add_optional("--yarn-attn-factor", o.yarn_attn_factor, "YaRN magnitude of cos/sin (default: the model's, else 1)");
  app.add_option("--yarn-beta-fast", o.yarn_beta_fast, "YaRN: rotations above which a dimension keeps its frequency");
  app.add_option("--yarn-beta-slow", o.yarn_beta_slow, "YaRN: rotations below which a dimension is interpolated");
}

RopeParams rope_params(const RopeOptions& o) {
  RopeParams p;
  const auto check_positive = [](double v, const char* flag) {
    if (!(v > 0 && std::isfinite(v))) throw UsageError(fmt::format("{} must be a positive number, got {}", flag, v));
  };
  if (!o.scaling.empty()) {
    p.scaling = parse_rope_scaling(o.scaling);
    if (!p.scaling) throw UsageError("--rope-scaling '" + o.scaling + "' is not one of none, linear, ntk, yarn");
  }
  if (o.scale && o.freq_scale) throw UsageError("give --rope-scale or --rope-freq-scale (its inverse), not both");
  const auto positive_or_unset = [&](const std::optional<float>& v, const char* flag) {
    if (v) check_positive(*v, flag);
    return v;
  };
  p.factor = positive_or_unset(o.scale, "--rope-scale");
  if (positive_or_unset(o.freq_scale, "--rope-freq-scale")) p.factor = 1.0f / *o.freq_scale;
  p.freq_base = positive_or_unset(o.freq_base, "--rope-freq-base");
  p.yarn_attn_factor = positive_or_unset(o.yarn_attn_factor, "--yarn-attn-factor");
  if (o.yarn_orig_ctx) {
    if (*o.yarn_orig_ctx < 0 || *o.yarn_orig_ctx > INT32_MAX)
      throw UsageError(fmt::format("--yarn-orig-ctx must be a context length (0: the model's), got {}", *o.yarn_orig_ctx));
    if (*o.yarn_orig_ctx > 0) p.yarn_orig_ctx = uint32_t(*o.yarn_orig_ctx);
  }
  if (!std::isfinite(o.yarn_ext_factor)) throw UsageError("--yarn-ext-factor must be a number");
  check_positive(o.yarn_beta_fast, "--yarn-beta-fast");
  check_positive(o.yarn_beta_slow, "--yarn-beta-slow");
  p.yarn_ext_factor = o.yarn_ext_factor;
  p.yarn_beta_fast = o.yarn_beta_fast;
  p.yarn_beta_slow = o.yarn_beta_slow;
  return p;
}

LoadParams RepackFlags::load_params() const {
  LoadParams p;
  p.repack = !no_repack;
  p.repack_experts = repack_experts;
  return p;
}

void add_repack_flags(CLI::App& app, RepackFlags& flags) {
  app.add_flag("--no-repack", flags.no_repack,
               "Keep the weights in the file mapping: faster load, slower tokens (no interleaved layout, no huge pages)");
  app.add_flag("--repack-experts", flags.repack_experts,
               "MoE: repack every expert too (faster tokens; all experts resident in memory, slower load)");
}

void add_sampling_options(CLI::App& app, GenerationOptions& g) {
  SamplerParams& p = g.sampling;
  app.add_flag("--ignore-eos", g.ignore_eos, "Keep generating past end-of-text tokens");
  app.add_option("--temp,--temperature", p.temperature, "Temperature (0: greedy)");
  app.add_option("--top-k", p.top_k, "Top-k (0: off)");
  app.add_option("--top-p", p.top_p, "Top-p / nucleus (1: off)");
  app.add_option("--min-p", p.min_p, "Min-p (0: off)");
  app.add_option("--repeat-penalty", p.repeat_penalty, "Repetition penalty (1: off)");
  app.add_option("--repeat-last-n", p.penalty_last_n, "Tokens the penalties look back on (-1: context)");
  app.add_option("--presence-penalty", p.presence_penalty, "Presence penalty (0: off)");
  app.add_option("--frequency-penalty", p.frequency_penalty, "Frequency penalty (0: off)");
  // A string, not the uint64_t itself: CLI11 would wrap -1 to 2^64 - 1, a fixed seed.
  app.add_option_function<std::string>(
         "-s,--seed", [&p](const std::string& v) { p.seed = parse_seed(v, "--seed"); },
         "Random seed (-1 or absent: a random one, printed on stderr)")
      ->type_name("INT");
  app.add_option("-n,--n-predict", g.n_predict, "Tokens to generate (-1: until end of text or full context)")
      ->check(CLI::Range(-1, INT32_MAX));
}

uint64_t parse_seed(const std::string& text, const std::string& name) {
  if (text == "-1") return SamplerParams::kRandomSeed;
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw CLI::ValidationError(name, "must be -1 (random) or a number in [0, 2^64), got '" + text + "'");
  return v;
}

int32_t max_threads() {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  return int32_t(std::min(512u, 4 * hw));
}

CLI::Validator thread_count_check() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        int64_t n = 0;
        const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || ptr != v.data() + v.size()) return "'" + v + "' is not a thread count";
        const int32_t cap = max_threads();
        if (n < 0 || n > cap)
          return fmt::format("must be in [0, {}] (0: physical cores; at most 4 x the {} hardware threads, 512 at most), "
                             "got {}",
                             cap, std::max(1u, std::thread::hardware_concurrency()), n);
        return "";
      },
      "[0, 4 x hardware threads]");
}

void add_context_shift_options(CLI::App& app, GenerationOptions& g, bool on_by_default) {
  g.context_shift = on_by_default;
  if (on_by_default)
    app.add_flag("--no-context-shift{false}", g.context_shift,
                 "Stop when the context is full instead of dropping the older half of the conversation");
  else
    app.add_flag("--context-shift", g.context_shift,
                 "When the context is full, drop the older half of the text (after --keep tokens) and go on");
  g.shift_flag = app.get_option(on_by_default ? "--no-context-shift" : "--context-shift");
  app.add_option("--keep", g.n_keep, "Tokens at the start that a context shift or h2o keeps (the BOS token always)")
      ->check(CLI::NonNegativeNumber);
  add_kv_eviction_options(app, g.evict);
}

void add_kv_eviction_options(CLI::App& app, KvEvictionOptions& o) {
  app.add_option("--kv-evict", o.policy,
                 "What to forget when the KV cache is full: none, shift (= --context-shift), sink (StreamingLLM: "
                 "--sink-tokens first tokens + recent window), h2o (heavy hitters: most-attended + recent)")
      ->check(CLI::IsMember({"none", "shift", "sink", "h2o"}));
  o.sink_flag = app.add_option("--sink-tokens", o.sink_tokens, "Attention sinks kept at the start by --kv-evict sink")
                    ->check(CLI::NonNegativeNumber)->capture_default_str();
  o.budget_flag = app.add_option("--kv-budget", o.budget,
                                 "Tokens the cache holds at most with --kv-evict (0: the context size)")
                      ->check(CLI::NonNegativeNumber);
}

KvEvictionParams kv_eviction(const KvEvictionOptions& o, bool context_shift, bool shift_flag_given, int32_t n_keep,
                             int32_t n_ctx) {
  KvEvictionParams p;
  if (!o.policy.empty() && shift_flag_given)
    throw UsageError("give --kv-evict or --context-shift/--no-context-shift, not both");
  p.policy = o.policy.empty() ? (context_shift ? KvEviction::shift : KvEviction::none) : *parse_kv_eviction(o.policy);
  if (o.sink_flag && o.sink_flag->count() > 0 && p.policy != KvEviction::sink)
    throw UsageError("--sink-tokens applies with --kv-evict sink");
  if (o.budget_flag && o.budget_flag->count() > 0 && p.policy == KvEviction::none)
    throw UsageError("--kv-budget applies with --kv-evict shift, sink or h2o");
  if (o.budget > n_ctx)
    throw UsageError(fmt::format("--kv-budget {} exceeds the context size {} (raise -c)", o.budget, n_ctx));
  p.n_keep = n_keep;
  p.sink_tokens = o.sink_tokens;
  p.budget = o.budget;
  const int32_t budget = o.budget > 0 ? o.budget : n_ctx;
  const int32_t front = p.policy == KvEviction::sink ? p.sink_tokens : std::max(n_keep, 1);
  if ((p.policy == KvEviction::sink || p.policy == KvEviction::h2o) && budget < front + 4)
    throw UsageError(fmt::format("--kv-evict {} needs a budget of at least {} tokens ({} kept at the start + 4), got {}",
                                 o.policy, front + 4, front, budget));
  return p;
}

KvEvictionParams kv_eviction(const GenerationOptions& g, int32_t n_ctx) {
  return kv_eviction(g.evict, g.context_shift, g.shift_flag && g.shift_flag->count() > 0, g.n_keep, n_ctx);
}

void setup_logging(const LogOptions& opts) {
  auto logger = spdlog::stderr_color_mt("kiln");
  logger->set_pattern("%v");
  logger->set_level(opts.quiet ? spdlog::level::warn : opts.verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(logger);
}

bool looks_like_model(const std::string& arg) {
  const auto ends_with = [&arg](std::string_view tail) {
    return arg.size() > tail.size() && arg.compare(arg.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool one_word = !arg.empty() && std::none_of(arg.begin(), arg.end(), [](char c) { return std::isspace((unsigned char)c); });
  if (one_word && (ends_with(".gguf") || ends_with(".bin") || arg.find('/') != std::string::npos)) return true;
  std::error_code ec;
  return !arg.empty() && arg.find('\n') == std::string::npos && std::filesystem::is_regular_file(arg, ec);
}

std::string resolve_model_path(const std::string& given) {
  std::error_code ec;
  if (!given.empty() && !std::filesystem::exists(given, ec)) throw Error(given + ": cannot open: no such model file");
  if (!given.empty()) return given;
  const std::string rel = "models/stories260K.gguf";
  if (std::filesystem::exists(rel, ec)) return rel;
  // The binary lives in build/: try the repository next to it.
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      const auto candidate = dir / rel;
      if (std::filesystem::exists(candidate, ec)) return candidate.string();
    }
  }
  throw UsageError("no model given and the default " + rel + " is missing (run ./scripts/setup)");
}

std::unique_ptr<Model> load_model(const std::string& path, const RepackFlags& repack, const std::string& tokenizer_file) {
  const auto t0 = std::chrono::steady_clock::now();
  const LoadParams params = repack.load_params();
  std::unique_ptr<Model> model;
  if (!tokenizer_file.empty() && Model::is_llama2c(path)) {
    model = Model::load_llama2c(path, Tokenizer::from_file(tokenizer_file), params);
  } else {
    model = Model::load(path, params);
    if (!tokenizer_file.empty()) model->replace_tokenizer(Tokenizer::from_file(tokenizer_file));
  }
  const double ms = ms_since(t0);
  const ModelConfig& c = model->config();
  const std::string weights = model->packed_bytes() > 0
                                  ? "weights repacked (" + std::to_string(model->packed_bytes() >> 20) + " MiB)"
                                  : "weights mapped from the file";
  spdlog::info("kiln: loaded {} ({}, {} layers, dim {}, {} heads / {} kv, vocab {}, {}) in {:.1f} ms, kernels {}, {}",
               path, c.arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.n_vocab, type_name(c.weight_type), ms,
               kernels::isa_name(kernels::ops().isa), weights);
  return model;
}

namespace {
// A q8_0/q4_0 cache block holds 32 values under one scale. With heads narrower than that
// (stories260K's 8-wide heads), or any head size that is not a multiple of 32, a block
// spans several heads and their magnitudes share the scale. q4_0's 16 levels cannot take
// that: stories260K's perplexity grows by about 270% (llama.cpp refuses both types then).
// q8_0 costs little, so it runs with a warning giving its cost, measured with
// `kiln perplexity stories260K.gguf -f tests/data/story.txt -c 128 -fa on` (955 tokens,
// too few for the default -c 512): f16/f16 4.6905, q8_0/q8_0 4.7233 (+0.70%), f16 keys
// with q8_0 values 4.6906 (+0.00%); on tests/data/stories-sampled.txt at -c 512: 2.8319 ->
// 2.8429 (+0.39%).
void check_kv_blocks_fit_heads(const ModelConfig& c, TensorType k, TensorType v) {
  if (c.head_dim % 32 == 0) return;
  for (const auto& [type, flag] : {std::pair{k, "--cache-type-k (-ctk)"}, std::pair{v, "--cache-type-v (-ctv)"}})
    if (type == TensorType::Q4_0)
      throw UsageError(fmt::format("{} q4_0: this model's head size {} is not a multiple of the 32-value block, so "
                                   "blocks would span heads (perplexity +270% on stories260K); use q8_0 or f16",
                                   flag, c.head_dim));
  if (k == TensorType::Q8_0 || v == TensorType::Q8_0)
    spdlog::warn("kiln: warning: q8_0 KV cache with head size {} (not a multiple of 32): blocks span heads, costing "
                 "perplexity (stories260K: +0.7% with q8_0 keys, 4.69 -> 4.72; q8_0 values alone: +0.0%)",
                 c.head_dim);
}
}  // namespace

SessionParams session_params(const ModelOptions& opts, const Model& model) {
  SessionParams p;
  p.n_ctx = opts.n_ctx;
  p.n_batch = opts.n_batch;
  p.n_threads = opts.n_threads;
  p.kv_type_k = cache_type(opts.cache_type_k);
  p.kv_type_v = cache_type(opts.cache_type_v);
  check_kv_blocks_fit_heads(model.config(), p.kv_type_k, p.kv_type_v);
  const std::string fa = lower(opts.flash_attn);
  p.flash_attn = fa == "on" ? FlashAttention::on : fa == "off" ? FlashAttention::off : FlashAttention::automatic;
  p.swa_window = opts.swa_window;
  p.swa_pattern = opts.swa_pattern;
  p.swa_full = opts.swa_full;
  p.kv_layout = kv_layout(opts.kv_layout);
  p.kv_block = opts.kv_block;
  const std::string windows = describe_windows(layer_windows(model.config(), p));
  if (!windows.empty()) spdlog::info("sliding window: {}{}", windows, p.swa_full ? " (full-size cache, --swa-full)" : "");
  p.rope = rope_params(opts.rope);
  // The session's context picks LongRoPE's factors.
  const RopeConfig rope = resolve_rope(model.config(), p.rope, p.context_for(model.config()));
  if (rope.scaling != RopeScaling::None || !rope.freq_factors.empty() || rope.ext_factor != 0 || rope.attn_factor != 1)
    spdlog::info("rope scaling: {}", describe_rope(rope));
  return p;
}

std::string builtin_template_names() {
  std::string names;
  for (const std::string& n : builtin_chat_template_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

void add_chat_template_options(CLI::App& app, ChatTemplateOptions& opts) {
  app.add_option("--chat-template", opts.name, "Built-in chat template instead of the model's: " + builtin_template_names());
  app.add_option("--chat-template-file", opts.file, "Jinja2 chat template file instead of the model's");
}

ChatTemplate select_chat_template(const Model& model, const ChatTemplateOptions& opts, std::string* description) {
  if (!opts.name.empty() && !opts.file.empty())
    throw UsageError("give either --chat-template or --chat-template-file, not both");
  std::string source, origin;
  if (!opts.name.empty()) {
    const char* builtin = builtin_chat_template(opts.name);
    if (!builtin) throw UsageError("unknown chat template '" + opts.name + "' (built in: " + builtin_template_names() + ")");
    source = builtin;
    origin = "built-in " + opts.name;
  } else if (!opts.file.empty()) {
    source = read_text_file(opts.file);
    origin = opts.file;
  } else if (const gguf::Value* v = model.file().find("tokenizer.chat_template"); v && v->type == gguf::ValueType::STRING) {
    source = v->s;
    origin = "the model's tokenizer.chat_template";
  } else {
    source = Chat::plain_template();
    origin = "plain text (the model has no chat template; --chat-template NAME picks one)";
  }
  if (description) *description = origin;
  try {
    return ChatTemplate(std::move(source));
  } catch (const TemplateError& e) {
    throw Error(origin + ": " + e.what() + " (use a built-in one instead: --chat-template " + builtin_template_names() + ")");
  }
}

namespace {
[[noreturn]] void stdout_failed(int err) {
  std::clearerr(stdout);
  if (err == EPIPE) throw OutputClosed{};
  throw Error(std::string("cannot write to stdout: ") + std::strerror(err));
}
}  // namespace

// Straight to the descriptor, resuming after EINTR: the Ctrl-C that stops a reply can land
// inside write(), and stdio cannot tell how much of an interrupted buffer went out.
void write_stdout(std::string_view text) {
  while (std::fflush(stdout) != 0) {
    if (errno != EINTR) stdout_failed(errno);
    std::clearerr(stdout);
  }
  while (!text.empty()) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) stdout_failed(errno);
    text.remove_prefix(size_t(n));
  }
}

std::string read_text_file(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open: " + std::strerror(errno));
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kiln::cli
