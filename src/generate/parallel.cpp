#include "kiln/parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kiln/error.h"
#include "util/ms_since.h"

namespace kiln {
ParallelResult generate_parallel(Session& session, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                                 const ParallelParams& p) {
  const int32_t n = p.n_seq;
  if (n < 1) throw Error("--parallel needs at least 1 sequence, got " + std::to_string(n));
  if (n > 1 && session.kv_layout() != KvLayout::paged)
    throw Error("parallel sequences need the paged KV layout (--kv-layout paged)");
  if (prompt.empty()) throw Error("nothing to process: give at least one token");
  if (prompt.size() >= size_t(session.n_ctx()))
    throw Error("the prompt (" + std::to_string(prompt.size()) + " tokens) leaves no room to generate in a context of " +
                std::to_string(session.n_ctx()) + " (use -c to raise it)");
  const size_t n_vocab = size_t(tokenizer.n_vocab());
  std::vector<int32_t> eog;
  if (p.ignore_eos)
    for (int32_t id = 0; id < tokenizer.n_vocab(); ++id)
      if (tokenizer.is_eog(id)) eog.push_back(id);

  ParallelResult r;
  r.seqs.resize(size_t(n));
  std::vector<Sampler> samplers;
  std::vector<Detokenizer> detoks;
  samplers.reserve(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    SamplerParams sp = p.sampling;
    if (i > 0) sp.seed = samplers[0].seed() + uint64_t(i);  // sampler 0 resolved a random seed
    samplers.emplace_back(sp, tokenizer.n_vocab());
    for (int32_t t : prompt) samplers.back().accept(t);
    detoks.emplace_back(tokenizer);
    r.seqs[size_t(i)].seed = samplers.back().seed();
  }

  session.reset();
  auto t0 = std::chrono::steady_clock::now();
  const std::span<const float> prompt_logits = session.decode(prompt);
  std::vector<float> logits(prompt_logits.begin(), prompt_logits.end());
  r.n_prompt = int32_t(prompt.size());
  r.prompt_ms = ms_since(t0);

  t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> seq_id(size_t(n), 0), batch_seqs, batch_tokens, batch_of;
  for (int32_t i = 1; i < n; ++i) seq_id[size_t(i)] = session.fork_sequence(0);
  std::vector<size_t> row(size_t(n), 0);  // each sequence's logits row (all share the prompt's first)
  std::vector<int32_t> active(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) active[size_t(i)] = i;
  std::vector<float> masked;
  const auto note_memory = [&] {
    const KvMemory m = session.kv_memory();
    r.peak.blocks_used = std::max(r.peak.blocks_used, m.blocks_used);
    r.peak.blocks_unshared = std::max(r.peak.blocks_unshared, m.blocks_unshared);
    r.peak.bytes_used = std::max(r.peak.bytes_used, m.bytes_used);
    r.peak.bytes_unshared = std::max(r.peak.bytes_unshared, m.bytes_unshared);
    r.peak.bytes_allocated = std::max(r.peak.bytes_allocated, m.bytes_allocated);
  };
  note_memory();
  while (!active.empty()) {
    batch_seqs.clear(), batch_tokens.clear(), batch_of.clear();
    for (int32_t i : active) {
      ParallelSequence& s = r.seqs[size_t(i)];
      std::span<const float> row_logits(&logits[row[size_t(i)] * n_vocab], n_vocab);
      if (!eog.empty()) {
        masked.assign(row_logits.begin(), row_logits.end());
        for (int32_t id : eog) masked[size_t(id)] = -INFINITY;
        row_logits = masked;
      }
      const int32_t token = samplers[size_t(i)].sample(row_logits);
      samplers[size_t(i)].accept(token);
      s.tokens.push_back(token);
      ++r.n_generated;
      if (tokenizer.is_eog(token)) s.stop = StopReason::end_of_generation;
      else s.text += detoks[size_t(i)].push(token);
      if (s.stop == StopReason::none && p.n_predict >= 0 && int32_t(s.tokens.size()) >= p.n_predict)
        s.stop = StopReason::length;
      if (s.stop == StopReason::none && session.n_past(seq_id[size_t(i)]) >= session.n_ctx())
        s.stop = StopReason::context_full;
      if (s.stop != StopReason::none) {
        s.text += detoks[size_t(i)].flush();
        session.free_sequence(seq_id[size_t(i)]);
        continue;
      }
      batch_seqs.push_back(seq_id[size_t(i)]);
      batch_tokens.push_back(token);
      batch_of.push_back(i);
    }
    active = batch_of;
    if (active.empty()) break;
    const std::span<const float> out = session.decode_parallel(batch_seqs, batch_tokens);
    logits.assign(out.begin(), out.end());
    for (size_t b = 0; b < active.size(); ++b) row[size_t(active[b])] = b;
    note_memory();
  }
  r.generate_ms = ms_since(t0);
  return r;
}

}  // namespace kiln
