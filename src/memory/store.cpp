// MemoryStore: writes (one committed transaction each), reads, and recall (BM25 from
// FTS5, fused with cosine similarity by reciprocal rank fusion when embeddings exist; the
// rule is written in kiln/memory.h).
#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include "kernels/kernels.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "memory/query.h"
#include "memory/store_impl.h"

namespace kiln {

// Embeddings are stored as the raw float32 bytes, little-endian.
static_assert(std::endian::native == std::endian::little, "memory embeddings are stored little-endian");

namespace {

// Reciprocal rank fusion's constant (Cormack et al. 2009): damps the head of each list so
// that one list's first place does not outweigh agreement between the two.
constexpr double kRrfK = 60;
constexpr size_t kMaxEmbedding = 1 << 16;

Memory row_to_memory(const memory::Statement& s, bool with_embedding) {
  Memory m;
  m.id = s.int64(0);
  m.text = s.text(1);
  m.time = s.int64(2);
  m.conversation = s.text(3);
  if (with_embedding && !s.is_null(4)) {
    m.embedding.resize(s.bytes(4) / sizeof(float));
    if (!m.embedding.empty()) std::memcpy(m.embedding.data(), s.blob(4), m.embedding.size() * sizeof(float));
  }
  return m;
}

float norm_of(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += (double)x * x;
  return (float)std::sqrt(s);
}

void check_embedding(std::span<const float> e, const std::string& path) {
  if (e.size() > kMaxEmbedding) throw Error(path + ": embedding of " + std::to_string(e.size()) + " values is too long");
  for (float x : e)
    if (!std::isfinite(x)) throw Error(path + ": embedding holds a value that is not finite");
}

}  // namespace

void MemoryStore::Impl::cache_embedding(int64_t id, std::span<const float> values) {
  auto set = std::find_if(embeddings.begin(), embeddings.end(), [&](const Embeddings& e) { return e.dim == values.size(); });
  if (set == embeddings.end()) set = embeddings.insert(embeddings.end(), Embeddings{values.size(), {}, {}});
  const float norm = norm_of(values);
  set->ids.push_back(id);
  for (float x : values) set->rows.push_back(norm > 0 ? x / norm : 0.0f);
}

MemoryStore::Impl::~Impl() {
  // Statements first: sqlite3_close refuses a connection with live statements.
  insert.reset();
  bm25_search.reset();
  by_id.reset();
  planner.reset();
  if (db) sqlite3_close(db);
}

MemoryStore::MemoryStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MemoryStore::~MemoryStore() = default;

std::unique_ptr<MemoryStore> MemoryStore::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  memory::open_store(*impl);
  sqlite3* db = impl->db;
  impl->insert = std::make_unique<memory::Statement>(
      db, impl->path, "INSERT INTO memories(text, time, conversation, embedding) VALUES (?1, ?2, ?3, ?4)");
  // FTS5 orders by rank (bm25) inside the index; the join only fetches the k rows kept.
  impl->bm25_search = std::make_unique<memory::Statement>(db, impl->path, R"sql(
      SELECT m.id, m.text, m.time, m.conversation, -f.rank
      FROM (SELECT rowid, rank FROM memories_fts WHERE memories_fts MATCH ?1 ORDER BY rank LIMIT ?2) AS f
      JOIN memories AS m ON m.id = f.rowid
      ORDER BY f.rank, m.id)sql");
  impl->planner = std::make_unique<memory::QueryPlanner>(db, impl->path);
  impl->by_id = std::make_unique<memory::Statement>(
      db, impl->path, "SELECT id, text, time, conversation, embedding FROM memories WHERE id = ?1");
  return std::unique_ptr<MemoryStore>(new MemoryStore(std::move(impl)));
}

const std::string& MemoryStore::path() const { return impl_->path; }

int64_t MemoryStore::add(std::string_view text, std::string_view conversation, std::span<const float> embedding) {
  const std::string& path = impl_->path;
  size_t bad = 0;
  if (text.empty()) throw Error(path + ": a memory needs some text");
  if (!is_valid_utf8(text, &bad)) throw Error(path + ": memory text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  if (!is_valid_utf8(conversation, &bad)) throw Error(path + ": conversation id is not valid UTF-8");
  check_embedding(embedding, path);

  memory::WriteTransaction tx(impl_->db, path);
  memory::Statement& s = *impl_->insert;
  s.bind(1, text);
  s.bind(2, (int64_t)std::time(nullptr));
  s.bind(3, conversation);
  s.bind_blob(4, embedding.empty() ? nullptr : embedding.data(), embedding.size_bytes());
  s.step();
  s.reset();
  const int64_t id = sqlite3_last_insert_rowid(impl_->db);
  tx.commit();
  if (impl_->embeddings_loaded && !embedding.empty()) impl_->cache_embedding(id, embedding);
  return id;
}

std::vector<Memory> MemoryStore::list() {
  memory::Statement s(impl_->db, impl_->path, "SELECT id, text, time, conversation FROM memories ORDER BY id");
  std::vector<Memory> out;
  while (s.step()) out.push_back(row_to_memory(s, false));
  return out;
}

std::vector<Memory> MemoryStore::export_all() {
  memory::Statement s(impl_->db, impl_->path,
                      "SELECT id, text, time, conversation, embedding FROM memories ORDER BY id");
  std::vector<Memory> out;
  while (s.step()) out.push_back(row_to_memory(s, true));
  return out;
}

std::optional<Memory> MemoryStore::get(int64_t id) {
  memory::Statement& s = *impl_->by_id;
  s.bind(1, id);
  std::optional<Memory> m;
  if (s.step()) m = row_to_memory(s, true);
  s.reset();
  return m;
}

int64_t MemoryStore::count() {
  memory::Statement s(impl_->db, impl_->path, "SELECT count(*) FROM memories");
  int64_t n = 0;
  if (s.step()) n = s.int64(0);
  s.reset();
  return n;
}

namespace {

// Forgetting must not leave the words in the file: secure_delete zeroes the freed pages of
// the row, but FTS5 only marks a deleted row's tokens in a newer segment, so the index is
// merged into one segment (the old ones freed, and zeroed), and the WAL, which still holds
// the old pages, is checkpointed and truncated (best effort: a reader in another process
// can keep it).
void purge(MemoryStore::Impl& impl) {
  sqlite3_wal_checkpoint_v2(impl.db, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
}

}  // namespace

bool MemoryStore::forget(int64_t id) {
  memory::WriteTransaction tx(impl_->db, impl_->path);
  memory::Statement s(impl_->db, impl_->path, "DELETE FROM memories WHERE id = ?1");
  s.bind(1, id);
  s.step();
  const bool gone = sqlite3_changes(impl_->db) > 0;
  if (gone) memory::exec(impl_->db, impl_->path, "INSERT INTO memories_fts(memories_fts) VALUES ('optimize')");
  tx.commit();
  if (gone) {
    purge(*impl_);
    impl_->embeddings_loaded = false;  // rare: read them again at the next search
  }
  return gone;
}

int64_t MemoryStore::forget_all() {
  memory::WriteTransaction tx(impl_->db, impl_->path);
  memory::exec(impl_->db, impl_->path, "DELETE FROM memories");
  const int64_t n = sqlite3_changes(impl_->db);
  memory::exec(impl_->db, impl_->path, "INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')");
  tx.commit();
  purge(*impl_);
  impl_->embeddings.clear();
  return n;
}

std::string MemoryStore::fts_query(std::string_view text) { return memory::quoted_or(memory::query_words(text)); }

namespace {

// The stored embeddings, brought up to date: a reload when another connection committed
// since the last look (PRAGMA data_version changes only for other connections' commits).
void refresh_embeddings(MemoryStore::Impl& impl) {
  memory::Statement v(impl.db, impl.path, "PRAGMA data_version");
  const int64_t version = v.step() ? v.int64(0) : -1;
  v.reset();
  if (impl.embeddings_loaded && version == impl.data_version) return;
  impl.embeddings.clear();
  memory::Statement s(impl.db, impl.path, "SELECT id, embedding FROM memories WHERE embedding IS NOT NULL ORDER BY id");
  std::vector<float> values;
  while (s.step()) {
    values.resize(s.bytes(1) / sizeof(float));
    if (values.empty()) continue;
    std::memcpy(values.data(), s.blob(1), values.size() * sizeof(float));
    impl.cache_embedding(s.int64(0), values);
  }
  impl.embeddings_loaded = true;
  impl.data_version = version;
}

}  // namespace

std::vector<MemoryHit> MemoryStore::search(std::string_view query, int k, std::span<const float> query_embedding) {
  if (k <= 0) return {};
  const std::string& path = impl_->path;
  size_t bad = 0;
  if (!is_valid_utf8(query, &bad)) throw Error(path + ": search text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  check_embedding(query_embedding, path);
  const int n_candidates = std::max(50, 10 * k);

  // BM25 candidates, best first.
  std::vector<MemoryHit> bm25;
  const std::string fts = impl_->planner->plan(query, count());
  if (!fts.empty()) {
    memory::Statement& s = *impl_->bm25_search;
    s.bind(1, std::string_view(fts));
    s.bind(2, (int64_t)(query_embedding.empty() ? k : n_candidates));
    while (s.step()) {
      MemoryHit h;
      h.memory = row_to_memory(s, false);
      h.bm25 = s.real(4);
      h.score = *h.bm25;
      bm25.push_back(std::move(h));
    }
    s.reset();
  }

  // Cosine candidates: every stored embedding of the query's size, in memory.
  std::vector<std::pair<double, int64_t>> cosine;  // (similarity, id)
  if (!query_embedding.empty()) {
    refresh_embeddings(*impl_);
    const float qn = norm_of(query_embedding);
    // The kernels' dot product (SIMD, picked by CPUID) against unit rows.
    const kernels::Ops& ops = kernels::ops();
    for (const auto& set : impl_->embeddings) {
      if (set.dim != query_embedding.size()) continue;
      for (size_t r = 0; r < set.ids.size(); ++r) {
        const double dot = ops.dot(set.rows.data() + r * set.dim, query_embedding.data(), set.dim);
        cosine.emplace_back(qn > 0 ? dot / qn : 0.0, set.ids[r]);
      }
    }
    const size_t keep = std::min(cosine.size(), (size_t)n_candidates);
    std::partial_sort(cosine.begin(), cosine.begin() + keep, cosine.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    cosine.resize(keep);
  }

  if (cosine.empty()) {  // BM25 alone
    if (bm25.size() > (size_t)k) bm25.resize(k);
    return bm25;
  }

  // Reciprocal rank fusion over the two candidate lists.
  std::unordered_map<int64_t, MemoryHit> fused;
  for (size_t r = 0; r < bm25.size(); ++r) {
    MemoryHit& h = fused[bm25[r].memory.id];
    h = std::move(bm25[r]);
    h.score = 1.0 / (kRrfK + (double)(r + 1));
  }
  for (size_t r = 0; r < cosine.size(); ++r) {
    auto [it, inserted] = fused.try_emplace(cosine[r].second);
    MemoryHit& h = it->second;
    if (inserted) h.memory.id = cosine[r].second, h.score = 0;
    h.cosine = cosine[r].first;
    h.score += 1.0 / (kRrfK + (double)(r + 1));
  }
  std::vector<MemoryHit> hits;
  hits.reserve(fused.size());
  for (auto& [id, h] : fused) hits.push_back(std::move(h));
  const size_t keep = std::min(hits.size(), (size_t)k);
  std::partial_sort(hits.begin(), hits.begin() + keep, hits.end(), [](const MemoryHit& a, const MemoryHit& b) {
    return a.score != b.score ? a.score > b.score : a.memory.id < b.memory.id;
  });
  hits.resize(keep);
  // Cosine-only hits have no row yet; embeddings stay out of results as in list().
  // A text is never empty, so an empty one marks a memory another process forgot since.
  for (MemoryHit& h : hits) {
    if (h.memory.text.empty())
      if (auto m = get(h.memory.id)) h.memory = std::move(*m);
    h.memory.embedding.clear();
  }
  std::erase_if(hits, [](const MemoryHit& h) { return h.memory.text.empty(); });
  return hits;
}

}  // namespace kiln
