// kiln perplexity MODEL -f FILE [-c 128]: scored as llama.cpp's llama-perplexity does, so
// the two engines' numbers compare directly: the text is cut into chunks of n_ctx tokens,
// each chunk starts with BOS, and only the second half of each chunk is scored.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>

#include "cli/common.h"
#include "kiln/error.h"

namespace kiln::cli {
namespace {

struct PerplexityOptions {
  LogOptions log;
  ModelOptions model;
  std::string file;
  int32_t n_chunks = -1;
};

// -log softmax(logits)[target], in double like the reference.
double nll_of(const float* logits, size_t n_vocab, int32_t target) {
  float max_logit = logits[0];
  for (size_t i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum_exp = 0;
  for (size_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(double(logits[i]) - max_logit);
  return -(double(logits[target]) - max_logit - std::log(sum_exp));
}

int perplexity(PerplexityOptions& o) {
  setup_logging(o.log);
  if (o.file.empty()) throw UsageError("perplexity needs a text file: -f FILE");
  const std::string text = read_text_file(o.file);
  if (o.model.n_ctx == 0) o.model.n_ctx = 512;
  const int32_t n_ctx = o.model.n_ctx;
  if (n_ctx < 4) throw UsageError("context (-c) must be at least 4 tokens for perplexity");

  auto model = load_model(resolve_model_path(o.model.model));
  const Tokenizer& tok = model->tokenizer();
  const bool add_bos = tok.vocab().add_bos && tok.bos() >= 0;
  std::vector<int32_t> tokens = tok.encode(text, add_bos);
  if ((int64_t)tokens.size() < 2 * (int64_t)n_ctx)
    throw Error(o.file + ": " + std::to_string(tokens.size()) + " tokens; perplexity with a context of " +
                std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
  int32_t n_chunk = (int32_t)(tokens.size() / n_ctx);
  if (o.n_chunks > 0) n_chunk = std::min(n_chunk, o.n_chunks);

  Session session(*model, session_params(o.model));
  const size_t n_vocab = model->config().n_vocab;
  const int32_t first = n_ctx / 2;  // the first half of each chunk only provides context
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  spdlog::info("perplexity: {} tokens, {} chunks of {}, scoring the last {} of each", tokens.size(), n_chunk, n_ctx,
               n_ctx - 1 - first);
  for (int32_t i = 0; i < n_chunk; ++i) {
    std::vector<int32_t> chunk(tokens.begin() + (ptrdiff_t)i * n_ctx, tokens.begin() + (ptrdiff_t)(i + 1) * n_ctx);
    if (add_bos) chunk[0] = tok.bos();
    session.reset();
    const std::span<const float> logits = session.decode(chunk, /*all_logits=*/true);
    for (int32_t j = first; j < n_ctx - 1; ++j) {
      const double v = nll_of(&logits[size_t(j) * n_vocab], n_vocab, tokens[size_t(i) * n_ctx + j + 1]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    std::fprintf(stderr, "[%d]%.4f,", i + 1, std::exp(nll / count));
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  const double mean = nll / count;
  const double ppl = std::exp(mean);
  double var = nll2 / count - mean * mean;
  const double err = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) * ppl : 0.0;
  std::printf("PPL = %.4f +/- %.5f\n", ppl, err);
  return 0;
}

}  // namespace

void register_perplexity(CLI::App& app, Action& action) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file, scored like llama-perplexity");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-f,--file", o->file, "Text file to score")->required();
  cmd->add_option("--chunks", o->n_chunks, "Score at most this many chunks");
  add_runtime_options(*cmd, o->model);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] { action = [o] { return perplexity(*o); }; });
}

}  // namespace kiln::cli
