#include "cli/speculation.h"

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln::cli {

void add_speculative_options(CLI::App& app, SpeculativeOptions& o, std::vector<int32_t>* draft_max_list) {
  app.add_option("--model-draft", o.draft_model,
                 "Draft model for speculative decoding (also -md): a smaller model with the same vocabulary proposes "
                 "tokens, the model checks them in one batch; the output is the model's own");
  app.add_option("--spec-type", o.type, "Speculative drafting: draft (a draft model, -md) or ngram (lookup in the prompt "
                                        "and the text so far, no second model)")
      ->check(CLI::IsMember({"draft", "ngram"}));
  if (draft_max_list)
    app.add_option("--draft-max,--draft,--draft-n", *draft_max_list,
                   "Tokens drafted per step at most (comma-separated; 0: the same greedy generation without drafts)")
        ->delimiter(',')
        ->check(CLI::Range(0, 64));
  else
    app.add_option("--draft-max,--draft,--draft-n", o.params.draft_max, "Tokens drafted per step at most")
        ->capture_default_str();
  app.add_option("--draft-min", o.params.draft_min, "A shorter draft is not verified")->capture_default_str();
  app.add_option("--draft-p-min", o.params.draft_p_min,
                 "The draft model stops drafting when its top probability falls below this")
      ->capture_default_str();
  app.add_option("--spec-ngram-n", o.params.ngram_n, "Longest n-gram looked up by --spec-type ngram")
      ->capture_default_str();
  app.add_flag("!--no-spec-adaptive", o.params.adaptive,
               "Always draft --draft-max tokens instead of choosing the length from the measured acceptance and costs");
}

SpecType spec_type(const SpeculativeOptions& o) {
  if (o.type == "ngram") {
    if (!o.draft_model.empty()) throw UsageError("--spec-type ngram drafts without a model: drop -md/--model-draft");
    validate(o.params);
    return SpecType::ngram;
  }
  if (o.type == "draft" && o.draft_model.empty()) throw UsageError("--spec-type draft needs -md/--model-draft FILE");
  if (o.draft_model.empty()) return SpecType::none;
  validate(o.params);
  return SpecType::draft;
}

std::unique_ptr<Model> load_draft_model(const SpeculativeOptions& o, const Model& target, const std::string& target_path,
                                        const RepackFlags& repack) {
  if (spec_type(o) != SpecType::draft) return nullptr;
  std::unique_ptr<Model> draft = load_model(resolve_model_path(o.draft_model), repack);
  check_draft_vocabulary(target.tokenizer(), target_path, draft->tokenizer(), o.draft_model);
  return draft;
}

Speculation make_speculation(const SpeculativeOptions& o, const Model* draft_model, const Session& target_session,
                             const ModelOptions& model_opts, const SamplerParams& sampling) {
  Speculation s;
  s.params = o.params;
  s.params.type = spec_type(o);
  if (s.params.type == SpecType::ngram) s.drafter = make_ngram_drafter(s.params.ngram_n);
  if (s.params.type != SpecType::draft) return s;
  if (!draft_model) throw Error("speculative decoding: the draft model was not loaded");
  SessionParams p;
  p.n_ctx = target_session.n_ctx();
  p.n_batch = model_opts.n_batch;
  p.n_threads = target_session.n_threads();
  p.kv_type_k = cache_type(model_opts.cache_type_k);
  p.kv_type_v = cache_type(model_opts.cache_type_v);
  p.flash_attn = target_session.flash_attn() ? FlashAttention::on : FlashAttention::off;
  s.draft_session = std::make_unique<Session>(*draft_model, p);
  s.drafter = make_model_drafter(*s.draft_session, sampling, s.params.draft_p_min);
  return s;
}

std::string speculation_summary(const SpeculativeStats& spec, int32_t n_generated, double generate_ms) {
  return fmt::format("speculative: drafted {}, accepted {} (accept {:.1f}%), mean accepted length {:.2f} in {} "
                     "verifications, {:.1f} tok/s",
                     spec.n_drafted, spec.n_accepted, 100.0 * spec.acceptance(), spec.mean_accepted(), spec.n_verify,
                     n_generated * 1000.0 / std::max(generate_ms, 1e-9));
}

}  // namespace kiln::cli
