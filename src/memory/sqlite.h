#pragma once
// Thin RAII over the SQLite C API for the memory store: every failure becomes one
// kiln::Error line naming the file, and a transaction that is not committed rolls back.
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::memory {

// "PATH: WHAT (sqlite's message)"; a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB) is
// named as such so the user knows the file, not kiln, is the problem.
[[noreturn]] void throw_sqlite(sqlite3* db, int rc, const std::string& path, const std::string& what);

// Runs SQL without results (several statements allowed); throws on failure.
void exec(sqlite3* db, const std::string& path, const char* sql);

class Statement {
 public:
  Statement(sqlite3* db, const std::string& path, const char* sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // True for a row, false when done; throws on an error. Resets itself when done or on
  // an error so the statement never holds a read transaction open.
  bool step();
  void reset();  // also clears the bindings

  void bind(int i, int64_t v);
  void bind(int i, double v);
  void bind(int i, std::string_view text);
  void bind_blob(int i, const void* data, size_t bytes);  // nullptr: NULL
  void bind_null(int i);

  int64_t int64(int col) const;
  double real(int col) const;
  std::string text(int col) const;
  const void* blob(int col) const;
  size_t bytes(int col) const;
  bool is_null(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  const std::string& path_;
};

// BEGIN IMMEDIATE takes the write lock up front (waiting through the busy timeout), so a
// writer never has to upgrade a read transaction, which SQLite may refuse without waiting.
class WriteTransaction {
 public:
  WriteTransaction(sqlite3* db, const std::string& path);
  ~WriteTransaction();  // rolls back unless committed
  void commit();

 private:
  sqlite3* db_;
  const std::string& path_;
  bool open_ = true;
};

}  // namespace kiln::memory
