#pragma once
// Speculative decoding on the command line (run, chat, bench, serve): llama.cpp's flags,
// the draft model loaded and checked against the target, and the stderr stats line.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "kiln/generator.h"
#include "kiln/speculative.h"

namespace kiln::cli {

struct SpeculativeOptions {
  std::string draft_model;  // -md/--model-draft
  std::string type;         // --spec-type draft|ngram; empty: draft with -md, else none
  SpeculativeParams params;
};
// draft_max_list: --draft-max takes a comma-separated list there (bench sweeps it) instead
// of opts.params.draft_max.
void add_speculative_options(CLI::App& app, SpeculativeOptions& opts, std::vector<int32_t>* draft_max_list = nullptr);
// The type the flags ask for, the flags checked (UsageError naming the flag): callers ask
// before loading anything.
SpecType spec_type(const SpeculativeOptions& opts);

// The -md draft model, its vocabulary checked against the target's (kiln::Error naming
// both files); null when the flags ask for no draft model.
std::unique_ptr<Model> load_draft_model(const SpeculativeOptions& opts, const Model& target,
                                        const std::string& target_path, const RepackFlags& repack);

// What one target session drafts with: a session of the draft model like the target's
// (context, threads, KV types, flash attention) and its drafter, or the n-gram drafter
// alone. Empty (drafter null) when speculation is off.
struct Speculation {
  std::unique_ptr<Session> draft_session;
  std::unique_ptr<Drafter> drafter;
  SpeculativeParams params;
  void attach(Generator& generator) const {
    if (drafter) generator.set_speculative(drafter.get(), params);
  }
};
// `draft_model` outlives the result.
Speculation make_speculation(const SpeculativeOptions& opts, const Model* draft_model, const Session& target_session,
                             const ModelOptions& model_opts, const SamplerParams& sampling);

// "speculative: drafted 120, accepted 76 (accept 63.3%), mean accepted length 2.53, 41.2 tok/s"
std::string speculation_summary(const SpeculativeStats& spec, int32_t n_generated, double generate_ms);

}  // namespace kiln::cli
