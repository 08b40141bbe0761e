// kiln imatrix -m MODEL -f TEXT [-o imatrix.gguf]: an importance matrix (kiln/imatrix.h)
// collected as llama-imatrix collects it, in its file formats, for `kiln quantize
// --imatrix` or llama-quantize. The text is cut into chunks of -c tokens, each evaluated
// from an empty cache with BOS first (when the vocabulary adds one); every weight product
// of a block (and output.weight with --process-output) adds its input rows' squares.
// Unless --no-ppl, each chunk's second half is scored as llama-imatrix scores it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/common.h"
#include "kiln/error.h"
#include "kiln/imatrix.h"
#include "quantize/imatrix_collector.h"

namespace kiln::cli {
namespace {

// llama.cpp's micro-batch, the most rows one of its forward passes takes by default.
constexpr int32_t kLlamaUbatch = 512;

struct ImatrixOptions {
  LogOptions log;
  ModelOptions model;
  std::string file, output = "imatrix.gguf", format = "gguf";
  int32_t n_chunks = -1, skip_chunks = 0;
  bool process_output = false, no_ppl = false;
};

// -log softmax(logits)[target] as llama-imatrix computes it (unlike cmd_perplexity.cpp's
// nll_of, which follows llama-perplexity): float differences, their
// exponentials summed in double.
double nll_float_differences(const float* logits, size_t n_vocab, int32_t target) {
  float max_logit = logits[0];
  for (size_t i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum_exp = 0;
  for (size_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
  return -(double(logits[target] - max_logit) - std::log(sum_exp));
}

// Entries that some expert's tokens never reached: llama-imatrix warns about them too
// (the GGUF keeps them; a quantizer weighs such an expert evenly).
void warn_partial(const imatrix::Imatrix& m) {
  for (const auto& [name, e] : m.entries) {
    const size_t zeros = size_t(std::count(e.counts.begin(), e.counts.end(), int64_t(0)));
    if (zeros > 0)
      spdlog::warn("imatrix: entry '{}' has partial data ({:.2f}% of its {} experts had tokens)", name,
                   100.0 * double(e.n_mat() - zeros) / double(e.n_mat()), e.n_mat());
  }
}

int imatrix(ImatrixOptions& o) {
  setup_logging(o.log);
  if (o.file.empty()) throw UsageError("imatrix needs a text file: -f FILE");
  std::string text = read_text_file(o.file);
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp's -f reads a prompt
  if (o.model.n_ctx == 0) o.model.n_ctx = 512;
  const int32_t n_ctx = o.model.n_ctx;
  if (n_ctx < 4) throw UsageError("context (-c) must be at least 4 tokens for imatrix");
  if (o.format == "gguf" && !o.output.ends_with(".gguf"))
    spdlog::warn("imatrix: writing GGUF to '{}', whose name does not end in .gguf (--output-format dat: the legacy format)",
                 o.output);

  // llama-imatrix evaluates max(1, b / c) chunks per batch of min(b, c * that) tokens, in
  // micro-batches of 512. With one chunk per batch its micro-batches are pieces of a
  // chunk, which kiln evaluates the same way, so the rule that skips small products
  // sees the same rows; with several, its micro-batches mix chunks and hold 16 rows or
  // more, and every product counts.
  const int32_t n_seq = std::max(1, o.model.n_batch / n_ctx);
  const int32_t batch = std::min(o.model.n_batch, n_ctx);
  o.model.n_batch = std::min(kLlamaUbatch, batch);

  const std::string model_path = resolve_model_path(o.model.model);
  auto model = load_model(model_path, o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  const bool add_bos = tok.vocab().add_bos && tok.bos() >= 0;
  std::vector<int32_t> tokens = tok.encode(text, add_bos);
  if (o.skip_chunks > 0) {
    if (int64_t(o.skip_chunks + 2) * n_ctx >= int64_t(tokens.size()))
      throw Error(o.file + ": not enough tokens left after skipping " + std::to_string(o.skip_chunks) + " chunks");
    tokens.erase(tokens.begin(), tokens.begin() + ptrdiff_t(o.skip_chunks) * n_ctx);
  }
  if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
    throw Error(o.file + ": " + std::to_string(tokens.size()) + " tokens; imatrix with a context of " +
                std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
  int32_t n_chunk = int32_t(tokens.size() / size_t(n_ctx));
  if (o.n_chunks >= 0) n_chunk = std::min(n_chunk, o.n_chunks);
  if (n_chunk < 1) throw UsageError("--chunks " + std::to_string(o.n_chunks) + ": nothing to evaluate");

  Session session(*model, session_params(o.model, *model));
  imatrix::Collector collector(o.process_output);
  collector.set_min_dense_rows(n_seq == 1 ? 16 : 0);
  session.set_matmul_observer(&collector);
  const bool ppl = !o.no_ppl;
  const size_t n_vocab = model->config().n_vocab;
  const int32_t first = n_ctx / 2;
  spdlog::info("imatrix: {} tokens, {} chunks of {}, batches of {}", tokens.size(), n_chunk, n_ctx, batch);

  double nll = 0, nll2 = 0;
  int64_t count = 0;
  for (int32_t i = 0; i < n_chunk; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t start = size_t(i) * size_t(n_ctx);
    std::vector<int32_t> chunk(tokens.begin() + ptrdiff_t(start), tokens.begin() + ptrdiff_t(start + size_t(n_ctx)));
    if (add_bos) chunk[0] = tok.bos();
    session.reset();
    for (int32_t b0 = 0; b0 < n_ctx; b0 += batch) {
      const int32_t n = std::min(batch, n_ctx - b0);
      // Every row's logits when they are scored or output.weight is collected, as
      // llama-imatrix asks for them (otherwise only the last row's, which is cheaper).
      const std::span<const float> logits =
          session.decode({chunk.data() + b0, size_t(n)}, /*all_logits=*/ppl || o.process_output);
      if (!ppl) continue;
      for (int32_t j = std::max(b0, first); j < std::min(b0 + n, n_ctx - 1); ++j) {
        const double v = nll_float_differences(&logits[size_t(j - b0) * n_vocab], n_vocab, tokens[start + size_t(j) + 1]);
        nll += v, nll2 += v * v, ++count;
      }
    }
    if (i == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      spdlog::info("imatrix: {:.2f} seconds per chunk - ETA {:.2f} minutes", s, s * n_chunk / 60.0);
    }
    if (ppl) {
      std::fprintf(stderr, "[%d]%.4f,", i + 1, std::exp(nll / double(count)));
      std::fflush(stderr);
    }
  }
  if (ppl) {
    std::fprintf(stderr, "\n");
    const double mean = nll / double(count), var = nll2 / double(count) - mean * mean;
    const double p = std::exp(mean);
    if (var > 0) std::printf("Final estimate: PPL = %.4f +/- %.5f\n", p, std::sqrt(var / double(count - 1)) * p);
    else std::printf("Final estimate: PPL = %.4f\n", p);
  }
  session.set_matmul_observer(nullptr);

  const imatrix::Imatrix m = collector.result({o.file}, n_ctx);
  if (m.entries.empty())
    throw Error(model_path + ": no weight matrix named blk.* (or output.weight) was multiplied; nothing to write");
  warn_partial(m);
  if (o.format == "dat") imatrix::write_dat(m, o.output);
  else imatrix::write_gguf(m, o.output);
  spdlog::info("imatrix: wrote {} entries over {} chunks of {} tokens to {}", m.entries.size(), m.chunk_count, n_ctx,
               o.output);
  return 0;
}

}  // namespace

void register_imatrix(CLI::App& app, Action& action) {
  auto o = std::make_shared<ImatrixOptions>();
  o->model.n_batch = 2048;  // llama-imatrix's default: four 512-token chunks per batch
  CLI::App* cmd = app.add_subcommand("imatrix", "Importance matrix of a text for quantization, as llama-imatrix collects it");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-f,--file", o->file, "Text to collect the statistics on")->required();
  cmd->add_option("-o,--output-file", o->output, "Output file (default imatrix.gguf)");
  cmd->add_option("--output-format", o->format, "gguf (default) or dat (llama.cpp's legacy format)")
      ->check(CLI::IsMember({"gguf", "dat"}));
  cmd->add_option("--chunks", o->n_chunks, "Evaluate at most this many chunks (-1: all)");
  cmd->add_option("--chunk", o->skip_chunks, "Skip this many chunks at the start of the text")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--process-output", o->process_output, "Also collect output.weight's inputs");
  cmd->add_flag("--no-ppl", o->no_ppl, "Do not compute the perplexity of each chunk");
  add_runtime_options(*cmd, o->model);
  cmd->get_option("--ctx-size")->description("Tokens per chunk (0 or absent: 512, llama-imatrix's default)");
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return imatrix(*o); }; });
}

}  // namespace kiln::cli
