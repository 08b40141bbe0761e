// RAII over SQLite for the memory store (see sqlite.h).
#include "memory/sqlite.h"

#include "kiln/error.h"

namespace kiln::memory {

void throw_sqlite(sqlite3* db, int rc, const std::string& path, const std::string& what) {
  const int primary = rc & 0xff;
  std::string message = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
    throw Error(path + ": damaged memory store (" + message + ")");
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
    throw Error(path + ": " + what + ": the file stayed locked by another process (" + message + ")");
  if (primary == SQLITE_FULL) throw Error(path + ": " + what + ": disk full (" + message + ")");
  throw Error(path + ": " + what + " (" + message + ")");
}

void exec(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string message = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    const int primary = rc & 0xff;
    if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
      throw Error(path + ": damaged memory store (" + message + ")");
    throw Error(path + ": " + message);
  }
}

Statement::Statement(sqlite3* db, const std::string& path, const char* sql) : db_(db), path_(path) {
  const int rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
  if (rc != SQLITE_OK) throw_sqlite(db, rc, path, "cannot prepare a query");
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) {
    sqlite3_reset(stmt_);
    return false;
  }
  sqlite3_reset(stmt_);
  throw_sqlite(db_, rc, path_, "query failed");
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

void Statement::bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
void Statement::bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
void Statement::bind(int i, std::string_view text) {
  sqlite3_bind_text64(stmt_, i, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
}
void Statement::bind_blob(int i, const void* data, size_t bytes) {
  if (!data) sqlite3_bind_null(stmt_, i);
  else sqlite3_bind_blob64(stmt_, i, data, bytes, SQLITE_TRANSIENT);
}
void Statement::bind_null(int i) { sqlite3_bind_null(stmt_, i); }

int64_t Statement::int64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::real(int col) const { return sqlite3_column_double(stmt_, col); }
std::string Statement::text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p ? std::string(p, (size_t)sqlite3_column_bytes(stmt_, col)) : std::string();
}
const void* Statement::blob(int col) const { return sqlite3_column_blob(stmt_, col); }
size_t Statement::bytes(int col) const { return (size_t)sqlite3_column_bytes(stmt_, col); }
bool Statement::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

WriteTransaction::WriteTransaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {
  exec(db, path, "BEGIN IMMEDIATE");
}

WriteTransaction::~WriteTransaction() {
  if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void WriteTransaction::commit() {
  exec(db_, path_, "COMMIT");
  open_ = false;
}

}  // namespace kiln::memory
