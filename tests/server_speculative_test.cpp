// Speculative decoding in continuous batching (BatchEngine with a draft session, and kiln
// serve -md / --spec-type ngram): greedy texts are the texts without drafting, alone and
// eight at once; sampled continuations are distributed as without a draft (chi-square);
// per-request speculative.n_max/n_min/p_min are read (0: no drafting) and bad values are
// 400s naming the field; /metrics counts draft tokens.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kiln/batch_engine.h"
#include "kiln/gguf.h"
#include "kiln/speculative.h"
#include "model_gen/generate_model.h"
#include "server_process.h"
#include "stories_fixture.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
using test::stories;

SessionParams paged(int32_t n_ctx = 512) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_batch = 64;
  p.n_threads = 2;
  p.kv_layout = KvLayout::paged;
  p.kv_block = 16;
  return p;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Lily and Ben went to the park",
                                           "One day, a big bird", "Tom had a red ball", "The sun was hot",
                                           "There was a girl named Sue", "A cat sat"};

// Reads a stream to its end (fails the test after 60 s instead of hanging).
std::vector<int32_t> collect(CompletionStream& s) {
  std::vector<int32_t> tokens;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  CompletionEvent e;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!s.next(e, std::chrono::milliseconds(100))) continue;
    tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.done) return tokens;
  }
  ADD_FAILURE() << "stream did not end within 60 s";
  return tokens;
}

CompletionRequest request(const std::string& text, int32_t max_tokens, SamplerParams sampling) {
  CompletionRequest r;
  r.prompt = stories().tokenizer().encode(text, true);
  r.max_tokens = max_tokens;
  r.sampling = sampling;
  return r;
}

SamplerParams greedy() {
  SamplerParams sp;
  sp.temperature = 0;
  return sp;
}

// An engine over stories260K with drafting of `type` (a Q4_0 copy as the draft model).
struct Rig {
  Session session{stories(), paged()};
  Session draft_session{stories("Q4_0"), paged()};
  std::unique_ptr<BatchEngine> engine;
  Rig(SpecType type, int32_t n_parallel, bool adaptive = false) {
    BatchEngine::Params p;
    p.n_parallel = n_parallel;
    p.spec_type = type;
    p.spec.draft_max = 6;
    p.spec.adaptive = adaptive;  // off: every step drafts, so verification runs throughout
    p.draft_session = &draft_session;
    engine = std::make_unique<BatchEngine>(session, stories().tokenizer(), p);
  }
};

std::vector<std::vector<int32_t>> greedy_texts(BatchEngine& engine, bool together, int32_t n) {
  std::vector<std::shared_ptr<CompletionStream>> streams;
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : kPrompts) {
    streams.push_back(engine.submit(request(p, n, greedy())));
    if (!together) out.push_back(collect(*streams.back()));
  }
  if (together)
    for (auto& s : streams) out.push_back(collect(*s));
  return out;
}

class EngineSpec : public ::testing::TestWithParam<SpecType> {};

TEST_P(EngineSpec, GreedyTextsAreTheTextsWithoutDrafting) {
  Rig plain(SpecType::none, 8);
  const auto want = greedy_texts(*plain.engine, false, 120);
  Rig spec(GetParam(), 8);
  EXPECT_EQ(greedy_texts(*spec.engine, false, 120), want);
  EXPECT_EQ(greedy_texts(*spec.engine, true, 120), want);  // verifications beside other requests' tokens
  const BatchEngineMetrics m = spec.engine->metrics();
  EXPECT_GT(m.draft_tokens_total, 0u);
  EXPECT_GT(m.draft_accepted_total, 0u);
  EXPECT_LT(m.draft_accepted_total, m.draft_tokens_total);
  // The draft session's sequences go with their requests.
  spec.engine->shutdown(true);
  EXPECT_EQ(spec.draft_session.kv_memory().blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Drafters, EngineSpec, ::testing::Values(SpecType::draft, SpecType::ngram),
                         [](const auto& info) { return std::string(info.param == SpecType::draft ? "draft" : "ngram"); });

TEST(EngineSpec, ARequestWithoutDraftingDraftsNothing) {
  Rig spec(SpecType::draft, 4);
  CompletionRequest r = request(kPrompts[0], 60, greedy());
  r.speculative = SpeculativeParams{};
  r.speculative->draft_max = 0;
  collect(*spec.engine->submit(r));
  EXPECT_EQ(spec.engine->metrics().draft_tokens_total, 0u);
}

// Three-token continuations sampled (seeded) with and without the draft, 8 requests at a
// time: one distribution (two-sample chi-square), the draft sampling at another
// temperature than the target.
TEST(EngineSpec, SampledContinuationsAreDistributedAsWithoutADraft) {
  const int n = test::kSanitized ? 400 : 2400;
  std::map<std::vector<int32_t>, std::pair<double, double>> counts;
  for (bool speculative : {false, true}) {
    Rig rig(speculative ? SpecType::draft : SpecType::none, 8);
    std::vector<std::shared_ptr<CompletionStream>> streams;
    for (int i = 0; i < n; ++i) {
      SamplerParams sp;
      sp.temperature = 0.8f;
      sp.top_k = 6;
      sp.seed = uint64_t(7000 + i) + (speculative ? 900000 : 0);
      streams.push_back(rig.engine->submit(request("Once upon a time, there was a", 3, sp)));
      if (streams.size() == 8 || i + 1 == n) {
        for (auto& s : streams) {
          const std::vector<int32_t> t = collect(*s);
          (speculative ? counts[t].second : counts[t].first) += 1;
        }
        streams.clear();
      }
    }
    if (speculative) EXPECT_GT(rig.engine->metrics().draft_tokens_total, uint64_t(n) / 2);
  }
  std::vector<std::pair<double, double>> cells;
  for (const auto& [seq, c] : counts) cells.push_back(c);
  int df = 0;
  const double stat = test::chi_square_two_samples(cells, df);
  EXPECT_LT(stat, test::chi_square_critical(df)) << counts.size() << " continuations";
}

// ------------------------------------------------------------------ kiln serve

json completion(httplib::Client& c, json body) {
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"http_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body, nullptr, false);
  j["http_status"] = r->status;
  return j;
}

TEST(ServeSpec, DraftedGreedyTextsAreThePlainServersTexts) {
  std::vector<std::string> want;
  {
    test::ServerProcess plain({"-np", "8"});
    ASSERT_GT(plain.port(), 0);
    for (const std::string& p : kPrompts) {
      const json j = completion(*plain.client(), {{"prompt", p}, {"max_tokens", 80}, {"temperature", 0}});
      ASSERT_EQ(j["http_status"], 200) << j.dump();
      want.push_back(j["choices"][0]["text"]);
    }
  }
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"-md", test::stories_path("Q4_0"), "--draft-max", "6", "--no-spec-adaptive"},
        std::vector<std::string>{"--spec-type", "ngram", "--no-spec-adaptive"}}) {
    SCOPED_TRACE(flags[0]);
    std::vector<std::string> args = {"-np", "8"};
    args.insert(args.end(), flags.begin(), flags.end());
    test::ServerProcess server(args);
    ASSERT_GT(server.port(), 0) << server.err();
    std::vector<json> got(kPrompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < kPrompts.size(); ++i)
      threads.emplace_back([&, i] {
        got[i] = completion(*server.client(), {{"prompt", kPrompts[i]}, {"max_tokens", 80}, {"temperature", 0}});
      });
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      ASSERT_EQ(got[i]["http_status"], 200) << got[i].dump() << "\n" << server.err();
      EXPECT_EQ(got[i]["choices"][0]["text"], want[i]) << kPrompts[i];
    }
    auto c = server.client();
    auto m = c->Get("/metrics");
    ASSERT_TRUE(m);
    const double drafted = test::metric_value(m->body, "kiln:draft_tokens_total");
    EXPECT_GT(drafted, 0);
    EXPECT_GT(test::metric_value(m->body, "kiln:draft_tokens_accepted_total"), 0);
    // speculative.n_max 0: this request drafts nothing.
    const json none = completion(*c, {{"prompt", kPrompts[0]}, {"max_tokens", 80}, {"temperature", 0},
                                      {"speculative.n_max", 0}});
    ASSERT_EQ(none["http_status"], 200) << none.dump();
    EXPECT_EQ(none["choices"][0]["text"], want[0]);
    m = c->Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(test::metric_value(m->body, "kiln:draft_tokens_total"), drafted);
    // Bad values: 400 naming the field.
    for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
             {"speculative.n_max", -1}, {"speculative.n_max", "four"}, {"speculative.p_min", 2.0}}) {
      const json j = completion(*c, {{"prompt", "hi"}, {field, value}});
      EXPECT_EQ(j["http_status"], 400) << j.dump();
      EXPECT_NE(j["error"]["message"].get<std::string>().find(field), std::string::npos) << j.dump();
    }
    const json j = completion(*c, {{"prompt", "hi"}, {"speculative.n_max", 2}, {"speculative.n_min", 3}});
    EXPECT_EQ(j["http_status"], 400) << j.dump();
    EXPECT_EQ(server.stop(), 0) << server.err();
  }
}

TEST(ServeSpec, ADraftWithAnotherVocabularyIsRefusedAtStartup) {
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("tiny");
  o.type = TensorType::F32;
  const std::string other = test::temp_dir() + "/serve-other-vocab.gguf";
  gen::build_model(o, *gguf::File::open(test::shared_path("vocab/ggml-vocab-llama-spm.gguf"))).write(other);
  const test::CommandResult r = test::run_command(test::shell_quote(test::kiln_binary()) + " serve " +
                                                  test::shell_quote(test::stories_path("F32")) + " --port 0 -md " +
                                                  test::shell_quote(other));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("does not share the vocabulary"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("serve-other-vocab.gguf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kiln
