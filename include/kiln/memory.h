#pragma once
// A chat's long-term memory: what the user said (each user turn, or short facts), kept in
// one SQLite file with its time, its conversation and optionally an embedding, and recalled
// by relevance to a new message.
//
// The file is the user's data, so the store is careful with it:
//  - identity first: a file that is not a kiln memory store (another program's SQLite
//    database, random bytes) or that a newer kiln wrote (schema version above ours) is
//    refused with one kiln::Error line naming it, before anything writes to it: no WAL
//    switch, no table, no -wal/-shm file; a missing store is built beside its path and
//    linked into place, so nobody sees a half-made one;
//  - WAL journal, synchronous=FULL, one transaction per write: a process killed mid-write
//    leaves a consistent file holding every write that add()/forget() returned from;
//  - a busy timeout: several processes can write to one file at once without losing any.
//
// Recall (search): BM25 over an FTS5 index of the texts (Porter stemming, Unicode 6.1
// tokens, diacritics folded). The query is cut into words and each word is quoted, joined
// with OR, so user text with quotes, AND, NEAR, * or parentheses is never FTS syntax.
// Words no memory holds, words held by more than half of them (FTS5's IDF for those is
// 1e-6: they cannot change a ranking) and, in a large store, the commonest words beyond a
// budget of 2,000 matching memories are left out of the query, which bounds a turn's cost
// (src/memory/query.h). When a query embedding is given and stored embeddings of the
// same size exist, the cosine ranking is fused with the BM25 ranking by reciprocal rank
// fusion (Cormack et al. 2009):
//   score(m) = 1 / (60 + rank_bm25(m)) + 1 / (60 + rank_cosine(m))
// (ranks from 1, a term left out where m is not among that list's candidates, which are
// its best max(50, 10 k)); ties go to the lower id. Without fusion the score is the BM25
// relevance itself (SQLite's bm25() negated: larger is better).
//
// A MemoryStore is one connection: use it from one thread at a time.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct Memory {
  int64_t id = 0;            // never reused, even after forget
  std::string text;          // UTF-8
  int64_t time = 0;          // Unix time in seconds when it was added
  std::string conversation;  // the conversation it came from ("" when none)
  std::vector<float> embedding;  // empty when none (list() leaves it empty; export_all() fills it)
};

struct MemoryHit {
  Memory memory;
  double score = 0;             // larger is better; see the fusion rule above
  std::optional<double> bm25;   // BM25 relevance (larger is better) when the text matched
  std::optional<double> cosine; // cosine similarity when both embeddings exist
};

class MemoryStore {
 public:
  // The schema this build writes (PRAGMA user_version) and the file's mark
  // (PRAGMA application_id, "klnm").
  static constexpr int kSchemaVersion = 1;
  static constexpr int32_t kApplicationId = 0x6b6c6e6d;

  // Opens `path`, creating it with the schema when it does not exist (or is empty), and
  // migrating an older schema. Throws kiln::Error, one line naming the file, for an empty
  // path, a directory, a file that is not a kiln memory store, a newer schema version, a
  // damaged file or one that cannot be opened for writing.
  static std::unique_ptr<MemoryStore> open(const std::string& path);
  ~MemoryStore();
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  const std::string& path() const;

  // Adds a memory, committed before it returns; the new id. Invalid UTF-8 or an empty
  // text is an Error. A non-empty embedding must be finite values.
  int64_t add(std::string_view text, std::string_view conversation = "", std::span<const float> embedding = {});
  // Every memory, oldest first, without embeddings.
  std::vector<Memory> list();
  // Every memory with its embedding (export).
  std::vector<Memory> export_all();
  std::optional<Memory> get(int64_t id);
  int64_t count();
  // The k most relevant memories for `query`, best first (fewer when fewer match).
  std::vector<MemoryHit> search(std::string_view query, int k = 3, std::span<const float> query_embedding = {});
  // True when a memory with this id existed and is now gone.
  bool forget(int64_t id);
  // How many were forgotten.
  int64_t forget_all();

  // A user's text as a safe FTS5 query: its words, each quoted, joined by OR ("" when it
  // has no word). search() runs this less the words it prunes. Exposed for tests.
  static std::string fts_query(std::string_view text);

  struct Impl;  // defined in src/memory/ only

 private:
  explicit MemoryStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
