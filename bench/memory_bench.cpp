// Recall from the chat memory store (kiln/memory.h) with 10,000 memories: what a chat turn
// pays before it is answered (the bar: under 5 ms).
//   BM_MemorySearch:       BM25 alone (no embeddings)
//   BM_MemorySearchLongMessage: the same with an 80-word message
//   BM_MemorySearchFirstTurn: a 12-word message on a store just opened (no counts kept)
//   BM_MemorySearchFused:  BM25 fused with cosine over 10,000 stored 384-value embeddings
//   BM_MemorySearchCosineOnly: the cosine scan alone (a query with no words)
//   BM_MemoryAdd:          one memory written and synced (the turn's write, after the answer)
// Texts are 12 words drawn from a Zipf law over 5,000 words, as in English: the commonest
// words ("I", "my", "the") are in most memories, so a query's OR over its words matches
// thousands of rows, the case that costs. Queries are drawn the same way.
#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kiln/memory.h"

namespace {

constexpr int kMemories = 10000;
constexpr int kWords = 5000;
constexpr int kDim = 384;

struct Corpus {
  std::vector<std::string> texts, queries, long_queries;  // long: 80 words, a pasted paragraph
  std::vector<std::vector<float>> embeddings, query_embeddings;
};

std::vector<float> random_vector(std::mt19937& rng) {
  std::normal_distribution<float> n(0, 1);
  std::vector<float> v(kDim);
  for (float& x : v) x = n(rng);
  return v;
}

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    std::mt19937 rng(42);
    std::vector<double> weights(kWords);
    for (int i = 0; i < kWords; ++i) weights[i] = 1.0 / (i + 1);
    std::discrete_distribution<int> zipf(weights.begin(), weights.end());
    auto sentence = [&](int words = 12) {
      std::string s;
      for (int w = 0; w < words; ++w) s += (s.empty() ? "w" : " w") + std::to_string(zipf(rng));
      return s;
    };
    for (int i = 0; i < kMemories; ++i) c.texts.push_back(sentence()), c.embeddings.push_back(random_vector(rng));
    for (int i = 0; i < 64; ++i) c.queries.push_back(sentence()), c.query_embeddings.push_back(random_vector(rng));
    for (int i = 0; i < 16; ++i) c.long_queries.push_back(sentence(80));
    return c;
  }();
  return c;
}

// A store of kMemories in a temporary directory, with or without embeddings, loaded in one
// SQLite transaction (10,000 synced commits would take a minute) after MemoryStore created
// the schema; the FTS index is filled by the schema's triggers as for add().
struct TempStore {
  std::string dir, path;
  std::unique_ptr<kiln::MemoryStore> store;

  explicit TempStore(bool embeddings) {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-memory-bench-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    dir = pattern;
    path = dir + "/memory.db";
    kiln::MemoryStore::open(path).reset();
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO memories(text, time, conversation, embedding) VALUES (?1, 0, 'bench', ?2)", -1,
                       &s, nullptr);
    const Corpus& c = corpus();
    for (int i = 0; i < kMemories; ++i) {
      sqlite3_bind_text(s, 1, c.texts[i].c_str(), -1, SQLITE_STATIC);
      if (embeddings) sqlite3_bind_blob(s, 2, c.embeddings[i].data(), kDim * sizeof(float), SQLITE_STATIC);
      else sqlite3_bind_null(s, 2);
      if (sqlite3_step(s) != SQLITE_DONE) throw std::runtime_error(sqlite3_errmsg(db));
      sqlite3_reset(s);
    }
    sqlite3_finalize(s);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    store = kiln::MemoryStore::open(path);
  }
  ~TempStore() {
    store.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

void BM_MemorySearch(benchmark::State& state) {
  TempStore t(false);
  const Corpus& c = corpus();
  size_t i = 0, hits = 0;
  for (auto _ : state) {
    auto r = t.store->search(c.queries[i++ % c.queries.size()], 3);
    hits += r.size();
    benchmark::DoNotOptimize(r);
  }
  state.counters["memories"] = (double)t.store->count();
  state.counters["hits_per_query"] = (double)hits / (double)state.iterations();
}
BENCHMARK(BM_MemorySearch)->Unit(benchmark::kMillisecond);

// A pasted paragraph: 80 words, of which the planner looks up at most 64.
void BM_MemorySearchLongMessage(benchmark::State& state) {
  TempStore t(false);
  const Corpus& c = corpus();
  size_t i = 0;
  for (auto _ : state) {
    auto r = t.store->search(c.long_queries[i++ % c.long_queries.size()], 3);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_MemorySearchLongMessage)->Unit(benchmark::kMillisecond);

// A chat's first turn: a store just opened, no word counts kept yet (the open is not timed).
void BM_MemorySearchFirstTurn(benchmark::State& state) {
  TempStore t(false);
  const Corpus& c = corpus();
  size_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto store = kiln::MemoryStore::open(t.path);
    state.ResumeTiming();
    auto r = store->search(c.queries[i++ % c.queries.size()], 3);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_MemorySearchFirstTurn)->Unit(benchmark::kMillisecond);

void BM_MemorySearchFused(benchmark::State& state) {
  TempStore t(true);
  const Corpus& c = corpus();
  t.store->search(c.queries[0], 3, c.query_embeddings[0]);  // the first search reads the embeddings once
  size_t i = 0;
  for (auto _ : state) {
    const size_t q = i++ % c.queries.size();
    auto r = t.store->search(c.queries[q], 3, c.query_embeddings[q]);
    benchmark::DoNotOptimize(r);
  }
  state.counters["memories"] = (double)t.store->count();
  state.counters["dim"] = kDim;
}
BENCHMARK(BM_MemorySearchFused)->Unit(benchmark::kMillisecond);

// The cosine half alone (a query without words): the scan over the cached embeddings.
void BM_MemorySearchCosineOnly(benchmark::State& state) {
  TempStore t(true);
  const Corpus& c = corpus();
  t.store->search("", 3, c.query_embeddings[0]);
  size_t i = 0;
  for (auto _ : state) {
    auto r = t.store->search("", 3, c.query_embeddings[i++ % c.query_embeddings.size()]);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_MemorySearchCosineOnly)->Unit(benchmark::kMillisecond);

void BM_MemoryAdd(benchmark::State& state) {
  TempStore t(false);
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(t.store->add("the user said something new " + std::to_string(i++), "bench"));
}
BENCHMARK(BM_MemoryAdd)->Unit(benchmark::kMillisecond)->Iterations(200);

}  // namespace
