// kiln perplexity MODEL -f FILE [-c 512]: scored as llama.cpp's llama-perplexity does, so
// the two engines' numbers compare directly: the text is cut into chunks of n_ctx tokens,
// each chunk starts with BOS, and only the second half of each chunk is scored.
// --kl-divergence-base FILE saves the reference's distributions at the scored positions;
// adding --kl-divergence compares another model (a quantized copy) against them.
// --stream scores a text longer than the cache instead: the whole file is one sequence,
// decoded a token at a time, and --kv-evict makes room at the --kv-budget; every token
// after the first is scored (see perplexity_stream).
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "cli/common.h"
#include "cli/kl_divergence.h"
#include "kiln/error.h"
#include "kiln/eviction_policy.h"

namespace kiln::cli {
namespace {

struct PerplexityOptions {
  LogOptions log;
  ModelOptions model;
  std::string file;
  int32_t n_chunks = -1;
  std::string kld_base;
  bool kl_divergence = false;
  bool stream = false;
  KvEvictionOptions evict;
};

// -log softmax(logits)[target], in double like the reference.
double nll_of(const float* logits, size_t n_vocab, int32_t target) {
  float max_logit = logits[0];
  for (size_t i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum_exp = 0;
  for (size_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(double(logits[i]) - max_logit);
  return -(double(logits[target]) - max_logit - std::log(sum_exp));
}

// PPL = exp(mean NLL) and its standard error, as the last line of both modes.
void print_ppl(double nll, double nll2, int64_t count) {
  const double mean = nll / count;
  const double ppl = std::exp(mean);
  double var = nll2 / count - mean * mean;
  const double err = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) * ppl : 0.0;
  std::printf("PPL = %.4f +/- %.5f\n", ppl, err);
}

// The logits of every position of chunk i of `tokens` (BOS first when the vocabulary
// asks for it), the cache cleared before.
std::span<const float> run_chunk(Session& session, const Tokenizer& tok, const std::vector<int32_t>& tokens,
                                 int32_t i, int32_t n_ctx) {
  std::vector<int32_t> chunk(tokens.begin() + (ptrdiff_t)i * n_ctx, tokens.begin() + (ptrdiff_t)(i + 1) * n_ctx);
  if (tok.vocab().add_bos && tok.bos() >= 0) chunk[0] = tok.bos();
  session.reset();
  return session.decode(chunk, /*all_logits=*/true);
}

int perplexity(PerplexityOptions& o) {
  setup_logging(o.log);
  if (o.file.empty()) throw UsageError("perplexity needs a text file: -f FILE");
  const std::string text = read_text_file(o.file);
  if (o.model.n_ctx == 0) o.model.n_ctx = 512;
  const int32_t n_ctx = o.model.n_ctx;
  if (n_ctx < 4) throw UsageError("context (-c) must be at least 4 tokens for perplexity");

  auto model = load_model(resolve_model_path(o.model.model), o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  const bool add_bos = tok.vocab().add_bos && tok.bos() >= 0;
  std::vector<int32_t> tokens = tok.encode(text, add_bos);
  if ((int64_t)tokens.size() < 2 * (int64_t)n_ctx)
    throw Error(o.file + ": " + std::to_string(tokens.size()) + " tokens; perplexity with a context of " +
                std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
  int32_t n_chunk = (int32_t)(tokens.size() / n_ctx);
  if (o.n_chunks > 0) n_chunk = std::min(n_chunk, o.n_chunks);

  Session session(*model, session_params(o.model, *model));
  const size_t n_vocab = model->config().n_vocab;
  const int32_t first = n_ctx / 2;  // the first half of each chunk only provides context
  spdlog::info("perplexity: {} tokens, {} chunks of {}, scoring the last {} of each", tokens.size(), n_chunk, n_ctx,
               n_ctx - 1 - first);
  std::optional<kld::BaseWriter> base;
  if (!o.kld_base.empty()) {
    tokens.resize(size_t(n_chunk) * n_ctx);  // the file holds exactly the scored chunks
    base.emplace(o.kld_base, kld::Header{(uint32_t)n_vocab, (uint32_t)n_ctx, (uint32_t)n_chunk, (uint32_t)first},
                 tokens);
  }
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  for (int32_t i = 0; i < n_chunk; ++i) {
    const std::span<const float> logits = run_chunk(session, tok, tokens, i, n_ctx);
    for (int32_t j = first; j < n_ctx - 1; ++j) {
      const int32_t target = tokens[size_t(i) * n_ctx + j + 1];
      const double v = nll_of(&logits[size_t(j) * n_vocab], n_vocab, target);
      if (base) base->add(&logits[size_t(j) * n_vocab], target);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    std::fprintf(stderr, "[%d]%.4f,", i + 1, std::exp(nll / count));
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  if (base) {
    base->finish();
    spdlog::info("perplexity: saved the distributions of {} scored tokens to {}", count, o.kld_base);
  }
  print_ppl(nll, nll2, count);
  return 0;
}

// The whole text as one sequence through a cache of the budget's size: each token is
// decoded after the policy made room for it, so it sees only what the policy kept, as in
// unbounded generation. Without eviction the cache holds the whole text (the reference).
int perplexity_stream(PerplexityOptions& o) {
  setup_logging(o.log);
  if (o.file.empty()) throw UsageError("perplexity needs a text file: -f FILE");
  if (!o.kld_base.empty() || o.n_chunks > 0) throw UsageError("--stream scores the whole text: no --chunks or --kl-divergence-base");
  const std::string text = read_text_file(o.file);
  auto model = load_model(resolve_model_path(o.model.model), o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> tokens = tok.encode(text, tok.vocab().add_bos && tok.bos() >= 0);
  if (tokens.size() < 2) throw Error(o.file + ": fewer than 2 tokens, nothing to score");
  const bool evicting = !o.evict.policy.empty() && o.evict.policy != "none";
  if (o.model.n_ctx == 0) o.model.n_ctx = evicting ? (o.evict.budget > 0 ? o.evict.budget : 512) : int32_t(tokens.size());
  if (!evicting && tokens.size() > size_t(o.model.n_ctx))
    throw UsageError(fmt::format("{}: {} tokens do not fit -c {} without --kv-evict (leave -c out for the whole text)",
                                 o.file, tokens.size(), o.model.n_ctx));
  Session session(*model, session_params(o.model, *model));
  KvEvictor evictor(session, kv_eviction(o.evict, false, false, 0, session.n_ctx()), tok.bos());
  const size_t n_vocab = model->config().n_vocab;
  spdlog::info("perplexity --stream: {} tokens, kv-evict {}, budget {}, {} KiB of KV cache", tokens.size(),
               kv_eviction_name(evictor.policy()), evictor.budget(), int64_t(session.kv_cache_bytes() / 1024));
  double nll = 0, nll2 = 0;
  int64_t count = 0, dropped = 0;
  const auto score = [&](const float* logits, int32_t target) {
    const double v = nll_of(logits, n_vocab, target);
    nll += v, nll2 += v * v, ++count;
  };
  if (!evicting) {
    const std::span<const float> logits = session.decode(tokens, /*all_logits=*/true);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) score(&logits[i * n_vocab], tokens[i + 1]);
  } else {
    std::vector<int32_t> cached;
    cached.reserve(size_t(session.n_ctx()));
    for (size_t i = 0; i < tokens.size(); ++i) {
      dropped += evictor.make_room(1, cached);
      if (session.n_past() >= session.n_ctx()) throw Error("kv-evict " + o.evict.policy + " could not make room");
      const std::span<const float> logits = session.decode(std::span<const int32_t>(&tokens[i], 1));
      cached.push_back(tokens[i]);
      if (i + 1 < tokens.size()) score(logits.data(), tokens[i + 1]);
    }
  }
  spdlog::info("perplexity --stream: {} tokens scored, {} evicted, {} cached at the end", count, dropped,
               session.n_past());
  print_ppl(nll, nll2, count);
  return 0;
}

// The tokens and chunking come from the base file; -c, --chunks and -f, when given, must
// agree with it, so that two runs can never silently score different things.
int kl_divergence(PerplexityOptions& o) {
  setup_logging(o.log);
  kld::BaseReader base(o.kld_base);
  const kld::Header& h = base.header();
  const std::string& path = base.path();
  if (o.model.n_ctx != 0 && uint32_t(o.model.n_ctx) != h.n_ctx)
    throw Error(path + ": made with a context of " + std::to_string(h.n_ctx) + ", not -c " +
                std::to_string(o.model.n_ctx) + " (leave -c out to use the file's)");
  o.model.n_ctx = (int32_t)h.n_ctx;
  auto model = load_model(resolve_model_path(o.model.model), o.model.repack);
  const Tokenizer& tok = model->tokenizer();
  const size_t n_vocab = model->config().n_vocab;
  if (n_vocab != h.n_vocab)
    throw Error(path + ": made with a vocabulary of " + std::to_string(h.n_vocab) + " tokens, this model has " +
                std::to_string(n_vocab));
  if (!o.file.empty()) {
    const bool add_bos = tok.vocab().add_bos && tok.bos() >= 0;
    std::vector<int32_t> tokens = tok.encode(read_text_file(o.file), add_bos);
    if (tokens.size() < base.tokens().size() || !std::equal(base.tokens().begin(), base.tokens().end(), tokens.begin()))
      throw Error(path + ": made from another text than " + o.file + " (the tokens differ)");
  }
  const int32_t n_chunk = o.n_chunks > 0 ? std::min<int32_t>(o.n_chunks, (int32_t)h.n_chunk) : (int32_t)h.n_chunk;
  const int32_t n_ctx = (int32_t)h.n_ctx, first = (int32_t)h.first;

  Session session(*model, session_params(o.model, *model));
  spdlog::info("kl-divergence: {} chunks of {} against {}, scoring the last {} of each", n_chunk, n_ctx, path,
               n_ctx - 1 - first);
  spdlog::info("{}", kld::Stats::table_header());
  kld::Stats stats;
  for (int32_t i = 0; i < n_chunk; ++i) {
    const std::span<const float> logits = run_chunk(session, tok, base.tokens(), i, n_ctx);
    for (int32_t j = first; j < n_ctx - 1; ++j)
      stats.add(base.next(), logits.subspan(size_t(j) * n_vocab, n_vocab), base.tokens()[size_t(i) * n_ctx + j + 1]);
    spdlog::info("{}", stats.table_line(i + 1));
  }
  std::printf("%s", stats.summary().c_str());
  return 0;
}

}  // namespace

void register_perplexity(CLI::App& app, Action& action) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file, scored like llama-perplexity");
  cmd->add_option("model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-m,--model", o->model.model, "Model file (GGUF)");
  cmd->add_option("-f,--file", o->file, "Text file to score (with --kl-divergence: optional, checked against the base)");
  cmd->add_option("--chunks", o->n_chunks, "Score at most this many chunks");
  cmd->add_option("--kl-divergence-base", o->kld_base,
                  "Save the model's distributions to this file (or, with --kl-divergence, read them)");
  cmd->add_flag("--kl-divergence", o->kl_divergence,
                "Compare the model with the --kl-divergence-base file: KL divergence, top-token agreement");
  cmd->add_flag("--stream", o->stream,
                "Score the whole text as one sequence, a token at a time, through a cache of --kv-budget tokens "
                "with --kv-evict (without: a context holding the whole text)");
  add_kv_eviction_options(*cmd, o->evict);
  add_runtime_options(*cmd, o->model);
  // The chunk length, whose default differs from the other commands' (the model's context).
  cmd->get_option("--ctx-size")->description("Tokens per scored chunk (0 or absent: 512, llama-perplexity's default)");
  add_kv_layout_options(*cmd, o->model);
  add_log_options(*cmd, o->log);
  cmd->callback([o, &action] {
    const bool evict_flags = !o->evict.policy.empty() || o->evict.sink_flag->count() > 0 || o->evict.budget_flag->count() > 0;
    if (evict_flags && !o->stream) throw CLI::ValidationError("--kv-evict", "applies with --stream");
    if (o->stream) {
      action = [o] { return perplexity_stream(*o); };
      return;
    }
    if (o->kl_divergence && o->kld_base.empty())
      throw CLI::ValidationError("--kl-divergence",
                                 "needs --kl-divergence-base FILE (made by a run on the reference model)");
    action = [o] { return o->kl_divergence ? kl_divergence(*o) : perplexity(*o); };
  });
}

}  // namespace kiln::cli
