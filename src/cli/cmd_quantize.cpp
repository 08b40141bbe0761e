// kiln quantize IN.gguf OUT.gguf PRESET [--imatrix FILE]: rewrites a float model with
// quantized weights. The K, i-quant and ternary presets choose a type per tensor exactly as
// llama-quantize does (src/quantize/mix.h); the legacy presets quantize every matrix whose
// rows are whole blocks and keep the rest. --imatrix weighs each matrix's quantization
// error by its importance vector (kiln imatrix's or llama-imatrix's file, either format).
// Progress: a bar on stderr when it is a terminal, otherwise one line per tensor; nothing
// but errors with --quiet.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cstdio>
#include <string>

#include "cli/common.h"
#include "kernels/quant.h"
#include "kiln/error.h"
#include "quantize/quantize_model.h"

namespace kiln::cli {
namespace {

struct QuantizeOptions {
  LogOptions log;
  std::string input, output, type, imatrix, output_tensor_type, token_embedding_type;
  bool pure = false;
  unsigned n_threads = 0;
};

std::string shape(const std::vector<uint64_t>& dims) {
  std::string s;
  for (uint64_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

// One line, redrawn in place: [#######.............]  37%  18/48 blk.1.ffn_down.weight -> Q6_K
void draw_bar(const quantize::TensorStep& s, bool finished) {
  const uint64_t done = s.input_bytes_before + (finished ? s.bytes_in : 0);
  const double fraction = s.input_bytes_total ? double(done) / double(s.input_bytes_total) : 1.0;
  constexpr int kWidth = 30;
  const int filled = int(fraction * kWidth + 0.5);
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  std::fprintf(stderr, "\r\x1b[K[%s] %3d%% %zu/%zu %s -> %s", bar.c_str(), int(fraction * 100 + 0.5),
               s.index + (finished ? 1 : 0), s.count, s.name.c_str(), type_name(s.to).c_str());
  std::fflush(stderr);
}

std::string type_counts(const quantize::Summary& sum) {
  std::string s;
  for (const auto& [type, n] : sum.output_types) s += (s.empty() ? "" : ", ") + type_name(type) + " x" + std::to_string(n);
  return s;
}

// A type kiln can write (a quantized type with a quantizer, or F32/F16/BF16), from
// llama-quantize's spelling ("q4_k", "iq2_xxs", "f16").
std::optional<TensorType> override_type(const char* flag, const std::string& name) {
  if (name.empty()) return std::nullopt;
  const std::optional<TensorType> t = type_from_name(name);
  const kernels::ref::QuantTraits* q = t ? kernels::ref::quant_traits(*t) : nullptr;
  if (!t || (!is_float_type(*t) && (!q || *t == TensorType::Q8_K)))
    throw UsageError(std::string(flag) + ": unknown or unwritable type '" + name + "'");
  return t;
}

int quantize(QuantizeOptions& o) {
  setup_logging(o.log);
  const quantize::Preset* preset = quantize::find_preset(o.type);
  if (!preset) throw UsageError("cannot quantize to '" + o.type + "' (supported: " + quantize::preset_names() + ")");

  const bool log_lines = spdlog::should_log(spdlog::level::info);
  const bool bar = log_lines && !o.log.verbose && isatty(fileno(stderr));
  quantize::Progress progress;
  if (bar) {
    progress.tensor_started = [](const quantize::TensorStep& s) { draw_bar(s, false); };
    progress.tensor_finished = [](const quantize::TensorStep& s) { draw_bar(s, true); };
  } else if (log_lines) {
    progress.tensor_finished = [](const quantize::TensorStep& s) {
      const std::string what = s.from == s.to ? type_name(s.from) + " (kept)" : type_name(s.from) + " -> " + type_name(s.to);
      spdlog::info("[{}/{}] {} ({}): {}{}{}", s.index + 1, s.count, s.name, shape(s.dims), what,
                   s.weighted ? " with importance" : "", s.fell_back ? " (" + s.note + ")" : "");
    };
  }

  quantize::TypeOverrides overrides;
  overrides.pure = o.pure;
  overrides.output_type = override_type("--output-tensor-type", o.output_tensor_type);
  overrides.token_embd_type = override_type("--token-embedding-type", o.token_embedding_type);

  const auto t0 = std::chrono::steady_clock::now();
  quantize::Summary sum;
  try {
    sum = quantize::quantize_model(o.input, o.output, *preset, o.n_threads, progress, o.imatrix, overrides);
  } catch (...) {
    if (bar) std::fputc('\n', stderr);  // leave the bar's line before the error message
    throw;
  }
  if (bar) std::fputc('\n', stderr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("kiln: wrote {}: {} of {} tensors quantized to {} ({}), {:.2f} MiB -> {:.2f} MiB in {:.1f} s", o.output,
               sum.n_quantized, sum.n_tensors, preset->name, type_counts(sum), sum.bytes_in / 1048576.0,
               sum.bytes_out / 1048576.0, seconds);
  if (!o.imatrix.empty())
    spdlog::info("kiln: {} of {} quantized matrices weighted by {}", sum.n_weighted, sum.n_quantized, o.imatrix);
  if (sum.n_fell_back)
    spdlog::info("kiln: {} matrices have rows that are not whole blocks of their {} type and got a smaller-block type "
                 "(or kept theirs)",
                 sum.n_fell_back, preset->llama_mix ? "mix" : "preset");
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app, Action& action) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write a copy of a float model with quantized weights");
  cmd->add_option("input", o->input, "F32/F16/BF16 model (GGUF)")->required();
  cmd->add_option("output", o->output, "Output file")->required();
  cmd->add_option("type", o->type, "Preset, as llama-quantize names them: " + quantize::preset_names() +
                                       " (case-insensitive; Q3_K, Q4_K, Q5_K mean the _M mixes)")
      ->required();
  cmd->add_option("-t,--threads", o->n_threads, "Threads (0: all hardware threads)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--imatrix", o->imatrix,
                  "Importance matrix (kiln imatrix or llama-imatrix, GGUF or .dat) to weigh each matrix's "
                  "quantization error by");
  cmd->add_flag("--pure", o->pure, "Every quantized tensor gets the preset's base type (no mix rules, no fallbacks)");
  cmd->add_option("--output-tensor-type", o->output_tensor_type, "Type of output.weight (e.g. q6_k, f16)");
  cmd->add_option("--token-embedding-type", o->token_embedding_type, "Type of token_embd.weight (e.g. q4_k)");
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return quantize(*o); }; });
}

}  // namespace kiln::cli
