#pragma once
// From a user's message to the FTS5 query that recalls memories for it.
//
// Safety: the message is cut into words (runs of ASCII letters and digits and of non-ASCII
// bytes; quotes, *, ^, :, parentheses and the rest separate words) and each word is quoted,
// so nothing the user types is FTS5 syntax ("AND" is the word and).
//
// Cost: BM25 is computed for every memory that holds any word of the query, so a message
// full of common words ("I", "my", "the") would score most of the store on every turn.
// The planner looks up how many memories hold each word (the FTS index's own counts,
// through fts5vocab and the index's tokenizer) and keeps, rarest first:
//  - no word that no memory holds (it can match nothing);
//  - no word held by more than half the memories: FTS5 clamps such a word's IDF to 1e-6,
//    so it cannot change a ranking, only break ties;
//  - words while the memories they hold add up to at most kPostingBudget (the rarest word
//    is always kept): the words left out are the commonest, whose IDF weighs least.
// Below a few thousand memories only the first two rules ever apply, and the ranking is
// the full query's BM25 (ties aside).
// Counting a common word's memories reads its whole doclist, and common words come back
// every turn, so the counts of common tokens (64 memories and more) are kept until another
// process writes or the store grows or shrinks by a sixteenth: they only steer the
// pruning, never a score.
#include <sqlite3.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memory/sqlite.h"

namespace kiln::memory {

constexpr int64_t kPostingBudget = 2000;

// The message's distinct words (case-insensitively), in order, at most 64.
std::vector<std::string> query_words(std::string_view text);
// "w1" OR "w2" ...; "" for no word.
std::string quoted_or(const std::vector<std::string>& words);

class QueryPlanner {
 public:
  QueryPlanner(sqlite3* db, const std::string& path);
  ~QueryPlanner();
  QueryPlanner(const QueryPlanner&) = delete;
  QueryPlanner& operator=(const QueryPlanner&) = delete;

  // The FTS5 query for `text` over a store of `n_memories` ("" when nothing can match).
  std::string plan(std::string_view text, int64_t n_memories);
  // How many memories hold `word` (as the index tokenizes it; a word of several tokens
  // counts those holding its rarest token: an upper bound).
  int64_t memories_with(const std::string& word);

 private:
  sqlite3* db_;
  const std::string& path_;
  fts5_tokenizer api_{};
  Fts5Tokenizer* tokenizer_ = nullptr;
  Statement vocab_, data_version_;
  std::unordered_map<std::string, int64_t> counts_;  // token -> memories holding it
  int64_t counts_version_ = -1, counts_n_ = 0;       // the data_version and size they are from
};

}  // namespace kiln::memory
