#include "cli/bench_runs.h"

#include <algorithm>
#include <chrono>

#include "kiln/generator.h"
#include "kiln/sampler.h"

namespace kiln::cli {

std::vector<int32_t> random_tokens(const Model& model, size_t n, std::mt19937& rng) {
  std::vector<int32_t> t(n);
  std::uniform_int_distribution<int32_t> dist(0, (int32_t)model.config().n_vocab - 1);
  for (auto& x : t) x = dist(rng);
  if (!t.empty() && model.tokenizer().bos() >= 0 && model.tokenizer().vocab().add_bos) t[0] = model.tokenizer().bos();
  return t;
}

// One timed run: a prompt of n_prompt tokens in batches, then n_gen single-token steps,
// after `depth` untimed tokens put in the cache. Without the KV cache every generated
// token recomputes the whole sequence.
double run_once(Session& session, const Model& model, int32_t n_prompt, int32_t n_gen, bool kv_cache, std::mt19937& rng,
                int32_t depth) {
  session.reset();
  if (depth > 0) session.decode(random_tokens(model, size_t(depth), rng));
  std::vector<int32_t> seq = random_tokens(model, (size_t)std::max(n_prompt, 1), rng);
  const auto t0 = std::chrono::steady_clock::now();
  if (n_prompt > 0) session.decode(seq);
  else seq.resize(1);  // generation starts from one token, like llama-bench
  std::uniform_int_distribution<int32_t> dist(0, (int32_t)model.config().n_vocab - 1);
  int32_t token = seq.back();
  for (int32_t i = 0; i < n_gen; ++i) {
    if (kv_cache) {
      const int32_t one[1] = {token};
      session.decode(one);
    } else {
      session.reset();
      session.decode(seq);
    }
    token = dist(rng);
    seq.push_back(token);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

// -np: `prefix` tokens (at least one) decoded once into sequence 0 (untimed), n_seq - 1
// forks sharing them, then n_gen timed steps of one token per sequence as one batch.
// kv gets the KV memory of the last step.
double run_parallel_once(Session& session, const Model& model, int32_t prefix, int32_t n_gen, int32_t n_seq,
                         std::mt19937& rng, KvMemory& kv) {
  session.reset();
  session.decode(random_tokens(model, size_t(std::max(prefix, 1)), rng));
  std::vector<int32_t> seqs{0};
  for (int32_t i = 1; i < n_seq; ++i) seqs.push_back(session.fork_sequence(0));
  std::uniform_int_distribution<int32_t> dist(0, (int32_t)model.config().n_vocab - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n_seq));
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < n_gen; ++i) {
    for (int32_t& t : tokens) t = dist(rng);
    if (session.kv_layout() == KvLayout::paged) session.decode_parallel(seqs, tokens);
    else session.decode(tokens);  // one sequence
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  kv = session.kv_memory();
  for (size_t i = 1; i < seqs.size(); ++i) session.free_sequence(seqs[i]);
  return ns;
}

double run_speculative_once(Session& session, const Model& model, const Model* draft_model,
                            const SpeculativeOptions& spec_opts, int32_t n_draft, const ModelOptions& mo, int32_t depth,
                            int32_t n_gen, std::mt19937& rng, SpeculativeStats& sum) {
  session.reset();
  SamplerParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy, model.config().n_vocab);
  Generator generator(session, model.tokenizer(), sampler);
  generator.set_ignore_eos(true);
  Speculation spec;
  if (n_draft > 0) {
    SpeculativeOptions so = spec_opts;
    so.params.draft_max = n_draft;
    spec = make_speculation(so, draft_model, session, mo, greedy);
    spec.attach(generator);
  }
  const GenerationStats st =
      generator.generate(random_tokens(model, size_t(depth + kSpeculativePrompt), rng), n_gen, [](std::string_view) {});
  sum.n_drafted += st.spec.n_drafted;
  sum.n_accepted += st.spec.n_accepted;
  sum.n_verify += st.spec.n_verify;
  return st.generate_ms * 1e6;
}

}  // namespace kiln::cli
