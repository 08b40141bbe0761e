// The recall query: user text cut into quoted words, pruned by how many memories hold each
// (rules and reasons in query.h).
#include "memory/query.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <unordered_set>

#include "kiln/error.h"

namespace kiln::memory {
namespace {

// A pasted page must not make a turn's recall look up hundreds of words.
constexpr size_t kMaxQueryWords = 64;
// Counts from this many memories up are kept between turns (query.h).
constexpr int64_t kCachedCount = 64;

bool word_byte(unsigned char c) { return c >= 0x80 || std::isalnum(c); }

// The memories table's FTS index tokenizes with porter over unicode61 (open.cpp's
// schema); the planner must cut a word into the same tokens to find its counts.
const char* const kTokenizerArgs[] = {"unicode61", "remove_diacritics", "2"};

// Creates this connection's view of the index's vocabulary: a TEMP table, so the file
// itself is not changed.
sqlite3* with_vocab(sqlite3* db, const std::string& path) {
  exec(db, path, "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memories_vocab USING fts5vocab(main, memories_fts, 'row')");
  return db;
}

fts5_api* fts5_of(sqlite3* db, const std::string& path) {
  fts5_api* api = nullptr;
  sqlite3_stmt* raw = nullptr;
  // Statement has no pointer binding; this one call goes to the C API directly.
  if (sqlite3_prepare_v2(db, "SELECT fts5(?1)", -1, &raw, nullptr) != SQLITE_OK) throw Error(path + ": SQLite lacks FTS5");
  sqlite3_bind_pointer(raw, 1, (void*)&api, "fts5_api_ptr", nullptr);
  sqlite3_step(raw);
  sqlite3_finalize(raw);
  if (!api) throw Error(path + ": SQLite lacks FTS5");
  return api;
}

}  // namespace

std::vector<std::string> query_words(std::string_view text) {
  std::vector<std::string> words;
  std::unordered_set<std::string> seen;
  size_t i = 0;
  while (i < text.size() && words.size() < kMaxQueryWords) {
    while (i < text.size() && !word_byte((unsigned char)text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && word_byte((unsigned char)text[i])) ++i;
    if (i == start) break;
    std::string word(text.substr(start, i - start));
    std::string key = word;
    for (char& c : key) c = (char)std::tolower((unsigned char)c);
    if (seen.insert(key).second) words.push_back(std::move(word));
  }
  return words;
}

std::string quoted_or(const std::vector<std::string>& words) {
  // A word never holds '"' (it separates words), so quoting needs no escaping.
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "\"" : " OR \"") + w + '"';
  return out;
}

QueryPlanner::QueryPlanner(sqlite3* db, const std::string& path)
    : db_(db),
      path_(path),
      vocab_(with_vocab(db, path), path, "SELECT doc FROM temp.memories_vocab WHERE term = ?1"),
      data_version_(db, path, "PRAGMA data_version") {
  fts5_api* api = fts5_of(db, path);
  void* user_data = nullptr;
  if (api->xFindTokenizer(api, "porter", &user_data, &api_) != SQLITE_OK ||
      api_.xCreate(user_data, const_cast<const char**>(kTokenizerArgs), 3, &tokenizer_) != SQLITE_OK)
    throw Error(path + ": SQLite's FTS5 lacks the porter tokenizer");
}

QueryPlanner::~QueryPlanner() {
  if (tokenizer_) api_.xDelete(tokenizer_);
}

int64_t QueryPlanner::memories_with(const std::string& word) {
  std::vector<std::string> tokens;
  auto on_token = [](void* ctx, int, const char* token, int n, int, int) {
    static_cast<std::vector<std::string>*>(ctx)->emplace_back(token, (size_t)n);
    return SQLITE_OK;
  };
  api_.xTokenize(tokenizer_, &tokens, FTS5_TOKENIZE_QUERY, word.data(), (int)word.size(), on_token);
  if (tokens.empty()) return 0;  // only symbols: the phrase matches nothing
  int64_t fewest = INT64_MAX;
  for (const auto& t : tokens) {
    int64_t n = 0;
    if (auto it = counts_.find(t); it != counts_.end()) {
      n = it->second;
    } else {
      vocab_.bind(1, std::string_view(t));
      n = vocab_.step() ? vocab_.int64(0) : 0;
      vocab_.reset();
      // Only the costly counts: a rare word's is cheap to read again, and a word held by
      // none must be seen as soon as a memory holds it.
      if (n >= kCachedCount) counts_.emplace(t, n);
    }
    fewest = std::min(fewest, n);
  }
  return fewest;
}

std::string QueryPlanner::plan(std::string_view text, int64_t n_memories) {
  struct Word {
    std::string text;
    int64_t memories;
  };
  const int64_t version = data_version_.step() ? data_version_.int64(0) : -1;
  data_version_.reset();
  if (version != counts_version_ || std::abs(n_memories - counts_n_) > counts_n_ / 16 || counts_.size() > 100000) {
    counts_.clear();
    counts_version_ = version;
    counts_n_ = n_memories;
  }
  std::vector<Word> words;
  for (auto& w : query_words(text)) {
    const int64_t n = memories_with(w);
    if (n > 0) words.push_back({std::move(w), n});
  }
  if (words.empty()) return "";
  std::stable_sort(words.begin(), words.end(), [](const Word& a, const Word& b) { return a.memories < b.memories; });
  std::vector<std::string> kept{words[0].text};
  int64_t postings = words[0].memories;
  for (size_t i = 1; i < words.size(); ++i) {
    if (2 * words[i].memories > n_memories || postings + words[i].memories > kPostingBudget) break;
    postings += words[i].memories;
    kept.push_back(words[i].text);
  }
  return quoted_or(kept);
}

}  // namespace kiln::memory
