#pragma once
// What the speculative-decoding tests share: greedy/session settings, a generation with or
// without a drafter, stories260K prompts, and tiny random-weight files of other families
// on stories260K's vocabulary with their Q4_0 copies as drafts.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/gguf.h"
#include "kiln/speculative.h"
#include "model_gen/generate_model.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln::test {

inline SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

inline SessionParams session_params(int32_t n_ctx, KvLayout layout = KvLayout::contiguous, TensorType kv = TensorType::F16) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_threads = 2;
  p.kv_layout = layout;
  p.kv_type_k = p.kv_type_v = kv;
  if (kv == TensorType::Q8_0 || kv == TensorType::Q4_0) p.flash_attn = FlashAttention::on;
  return p;
}

// A drafter as a test names it: a draft model (in its own session) or n-gram lookup.
struct DraftSource {
  const Model* model = nullptr;  // null: n-grams
  SamplerParams sampling = greedy();
};

struct Output {
  std::string text;
  std::vector<int32_t> tokens;
  GenerationStats stats;
};

struct RunSetup {
  SessionParams session = session_params(512);
  SamplerParams sampling = greedy();
  KvEvictionParams eviction;
  SpeculativeParams spec;
};

// Plain decoding when `draft` is null.
inline Output generate(const Model& target, const RunSetup& r, const std::vector<int32_t>& prompt, int32_t n,
                const DraftSource* draft) {
  Session session(target, r.session);
  Sampler sampler(r.sampling, target.config().n_vocab);
  Generator generator(session, target.tokenizer(), sampler);
  generator.set_kv_eviction(r.eviction);
  std::unique_ptr<Session> draft_session;
  std::unique_ptr<Drafter> drafter;
  if (draft) {
    if (draft->model) {
      SessionParams dp = session_params(r.session.n_ctx);
      draft_session = std::make_unique<Session>(*draft->model, dp);
      drafter = make_model_drafter(*draft_session, draft->sampling, 0.0f);
    } else {
      drafter = make_ngram_drafter(r.spec.ngram_n);
    }
    generator.set_speculative(drafter.get(), r.spec);
  }
  Output out;
  out.stats = generator.generate(prompt, n, [&](std::string_view t) { out.text += t; });
  out.tokens = generator.history();
  return out;
}

inline std::vector<int32_t> encode(const Model& m, const std::string& text) { return m.tokenizer().encode(text, true); }

inline const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog was happy because",
                                           "Lily and Tom went to the park. They saw a big"};

inline SpeculativeParams fixed_length(int32_t k) {
  SpeculativeParams p;
  p.draft_max = k;
  p.adaptive = false;  // every step drafts: the verification path runs all the time
  return p;
}


inline std::vector<std::vector<int32_t>> story_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (const std::string& s : kPrompts) p.push_back(encode(stories(), s));
  return p;
}


// Tiny random-weight files of other families on stories260K's 512-token vocabulary: the
// F32 target and its Q4_0 copy as the draft (they disagree now and then).
struct FamilyPair {
  std::unique_ptr<Model> target, draft;
};
inline const FamilyPair& family(const std::string& shape) {
  static std::map<std::string, FamilyPair> pairs;
  FamilyPair& p = pairs[shape];
  if (p.target) return p;
  const gen::GenerateOptions o = gen::peaky_options(shape, 11, /*tie_output=*/true);
  const std::unique_ptr<gguf::File> vocab = gguf::File::open(shared_path("models/stories260K.gguf"));
  const std::vector<uint8_t> bytes = gen::build_model(o, *vocab).to_bytes();
  const std::string f32 = temp_dir() + "/" + shape + ".gguf", q4 = temp_dir() + "/" + shape + "-q4_0.gguf";
  write_file(f32, std::string(bytes.begin(), bytes.end()));
  const CommandResult r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(f32) + " " + shell_quote(q4) + " Q4_0");
  if (r.exit_code != 0) throw std::runtime_error("kiln quantize failed: " + r.err);
  p.target = Model::load(f32);
  p.draft = Model::load(q4);
  return p;
}


}  // namespace kiln::test
