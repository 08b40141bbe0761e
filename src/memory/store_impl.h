#pragma once
// MemoryStore's state, shared by open.cpp (identity, schema, migrations) and store.cpp
// (reads, writes, recall).
#include <sqlite3.h>

#include <memory>
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
  struct Embedding {
    int64_t id;
    std::vector<float> values;
    float norm;
  };
  bool embeddings_loaded = false;
  int64_t data_version = -1;
  std::vector<Embedding> embeddings;

  ~Impl();
};

namespace memory {
// Opens (creating or migrating) the file behind `impl->path`, after checking it is a kiln
// memory store; see kiln/memory.h for what is refused.
void open_store(MemoryStore::Impl& impl);
}  // namespace memory

}  // namespace kiln
