#pragma once
// MemoryStore's state, shared by open.cpp (identity, schema, migrations) and store.cpp
// (reads, writes, recall).
#include <sqlite3.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/memory.h"
#include "memory/query.h"
#include "memory/sqlite.h"

namespace kiln {

struct MemoryStore::Impl {
  std::string path;
  sqlite3* db = nullptr;

  // Prepared once: recall runs on every chat turn.
  std::unique_ptr<memory::Statement> insert, bm25_search, by_id;
  std::unique_ptr<memory::QueryPlanner> planner;

  // The stored embeddings, read once and kept, so that a turn's recall reads no blobs:
  // this connection's own writes update it in place; another connection's commit (seen
  // through PRAGMA data_version) makes it reload.
  // One matrix per embedding size (a store normally has one), each row scaled to unit
  // length: the scan is one pass over contiguous memory, bandwidth-bound (10,000 x 384
  // floats are 15 MB a turn).
  struct Embeddings {
    size_t dim = 0;
    std::vector<int64_t> ids;
    std::vector<float> rows;  // ids.size() x dim
  };
  bool embeddings_loaded = false;
  int64_t data_version = -1;
  std::vector<Embeddings> embeddings;
  void cache_embedding(int64_t id, std::span<const float> values);

  ~Impl();
};

namespace memory {
// Opens (creating or migrating) the file behind `impl->path`, after checking it is a kiln
// memory store; see kiln/memory.h for what is refused.
void open_store(MemoryStore::Impl& impl);
}  // namespace memory

}  // namespace kiln
