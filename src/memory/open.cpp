// Opening a memory store: is this file ours, and is its schema one we can use? Decided
// before anything writes to the file, because setting journal_mode=WAL, creating a table or
// even migrating would change another program's database or a newer kiln's store. Then
// the connection settings, and the schema created or migrated one version at a time.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "kiln/error.h"
#include "memory/store_impl.h"

namespace kiln::memory {
namespace {

// How long a writer waits for another process's transaction before giving up: writes are
// one short transaction each, so only a stuck process makes anyone wait this long.
constexpr int kBusyTimeoutMs = 10000;

// The SQLite file header (https://www.sqlite.org/fileformat.html#the_database_header):
// magic at 0, user_version at 60, application_id at 68, both 4-byte big-endian.
constexpr char kSqliteMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f', 'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};

uint32_t be32(const unsigned char* p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

std::string not_ours(const std::string& path, const std::string& why) {
  return path + ": not a kiln memory store (" + why + "); refusing to touch it";
}

std::string newer(const std::string& path, int64_t version) {
  return path + ": memory store schema version " + std::to_string(version) + " is newer than this kiln's (" +
         std::to_string(MemoryStore::kSchemaVersion) + "); refusing to touch it";
}

// Reads the header with plain read(2), so that nothing of SQLite's (hot journal rollback,
// -shm creation) ever runs on a file that is not ours. A file of 0 bytes is a new store.
void check_header(const std::string& path, off_t size) {
  if (size == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open memory store (" + std::strerror(errno) + ")");
  unsigned char header[100];
  size_t got = 0;
  while (got < sizeof header) {
    const ssize_t n = ::read(fd, header + got, sizeof header - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  ::close(fd);
  if (got < sizeof header || std::memcmp(header, kSqliteMagic, sizeof kSqliteMagic) != 0)
    throw Error(not_ours(path, "not a SQLite database"));
  const uint32_t app_id = be32(header + 68), version = be32(header + 60);
  if (app_id != (uint32_t)MemoryStore::kApplicationId)
    throw Error(not_ours(path, app_id == 0 ? "a SQLite database without kiln's application id"
                                           : "a SQLite database of another application"));
  // The header can lag a WAL that has not been checkpointed; open_store checks again
  // through SQLite.
  if (version > (uint32_t)MemoryStore::kSchemaVersion) throw Error(newer(path, version));
}

// What the file holds, read through SQLite without writing: ours (and its version), a new
// empty database, or someone else's.
struct Identity {
  int64_t app_id, version, objects;
};
// One statement, so one read transaction: three separate pragmas could straddle another
// process's commit (id 0 from before it, a version from after) and see a store that never was.
Identity identify(sqlite3* db, const std::string& path) {
  Statement s(db, path,
              "SELECT a.application_id, v.user_version, (SELECT count(*) FROM sqlite_schema) "
              "FROM pragma_application_id() AS a, pragma_user_version() AS v");
  Identity id{0, 0, 0};
  if (s.step()) id = {s.int64(0), s.int64(1), s.int64(2)};
  s.reset();
  return id;
}

// Refuses a file that is not ours or is too new; true when it is a new, empty database.
bool check_identity(const Identity& id, const std::string& path) {
  if (id.app_id == MemoryStore::kApplicationId) {
    if (id.version > MemoryStore::kSchemaVersion) throw Error(newer(path, id.version));
    return false;
  }
  if (id.app_id == 0 && id.version == 0 && id.objects == 0) return true;
  throw Error(not_ours(path, id.app_id == 0 ? "a SQLite database without kiln's application id"
                                            : "a SQLite database of another application"));
}

// Version 1: the memories, an external-content FTS5 index over their text kept in step by
// triggers (the text is stored once), and an index to find a conversation's memories.
// AUTOINCREMENT so that an id is never reused after a forget: a script holding an old id
// must not delete a newer memory with it.
void migrate_to_1(sqlite3* db, const std::string& path) {
  exec(db, path, R"sql(
    CREATE TABLE memories(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      text TEXT NOT NULL,
      time INTEGER NOT NULL,
      conversation TEXT NOT NULL DEFAULT '',
      embedding BLOB
    );
    CREATE INDEX memories_by_conversation ON memories(conversation);
    CREATE VIRTUAL TABLE memories_fts USING fts5(
      text, content='memories', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2');
    CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
      INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
      INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories BEGIN
      INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
      INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text);
    END;
  )sql");
}

// migrations[v - 1] turns version v - 1 into version v; a new schema version adds one
// function here and bumps MemoryStore::kSchemaVersion.
using Migration = void (*)(sqlite3*, const std::string&);
constexpr Migration kMigrations[] = {migrate_to_1};
static_assert(std::size(kMigrations) == MemoryStore::kSchemaVersion);

// Creates or upgrades the schema in one transaction. Re-read under the write lock: another
// process may have created or migrated the file since we looked.
void migrate(sqlite3* db, const std::string& path) {
  WriteTransaction tx(db, path);
  const Identity id = identify(db, path);
  check_identity(id, path);
  if (id.version == MemoryStore::kSchemaVersion) return;  // rolls back an empty transaction
  for (int64_t v = id.version; v < MemoryStore::kSchemaVersion; ++v) kMigrations[v](db, path);
  exec(db, path, ("PRAGMA application_id = " + std::to_string(MemoryStore::kApplicationId)).c_str());
  exec(db, path, ("PRAGMA user_version = " + std::to_string(MemoryStore::kSchemaVersion)).c_str());
  tx.commit();
}

}  // namespace

namespace {

// The connection, its checks and settings, on a file that check_header passed (or that is
// empty: then the schema is created in place).
void connect(MemoryStore::Impl& impl, const std::string& path) {
  // No SQLITE_OPEN_CREATE: if the file vanished meanwhile, fail rather than make a new one
  // under the user's feet.
  int rc = sqlite3_open_v2(path.c_str(), &impl.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) throw_sqlite(impl.db, rc, path, "cannot open memory store");
  sqlite3_extended_result_codes(impl.db, 1);
  if (sqlite3_db_readonly(impl.db, "main") == 1) throw Error(path + ": memory store is read-only");
  sqlite3_busy_timeout(impl.db, kBusyTimeoutMs);

  // Read-only checks first (the header can lag the WAL). Until they pass, closing must not
  // checkpoint a WAL into the file either: that would rewrite its pages.
  sqlite3_db_config(impl.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  const bool fresh = check_identity(identify(impl.db, path), path);
  sqlite3_db_config(impl.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, nullptr);

  // A new store gets its schema in rollback-journal mode, so the file's own header holds
  // kiln's application id from the first commit (check_header reads it there); WAL after.
  if (fresh || identify(impl.db, path).version < MemoryStore::kSchemaVersion) migrate(impl.db, path);

  // WAL: readers do not block the writer and a killed writer leaves the file consistent.
  // Switching needs the file to itself for a moment; while another process reads it the
  // pragma answers with the old mode instead of waiting, so try again for the busy timeout.
  // Once the file is in WAL mode (persistent), this is a no-op that always succeeds.
  std::string mode;
  for (int waited_ms = 0;; waited_ms += 5) {
    Statement s(impl.db, path, "PRAGMA journal_mode = WAL");
    mode = s.step() ? s.text(0) : "";
    s.reset();
    if (mode == "wal" || waited_ms >= kBusyTimeoutMs) break;
    ::usleep(5000);
  }
  if (mode != "wal") throw Error(path + ": cannot switch the memory store to WAL mode (still '" + mode + "')");
  // FULL: a commit is on disk before add() returns, power loss included (a few ms per
  // write, once per chat turn). secure_delete: forgotten text is overwritten, not left in
  // free pages.
  exec(impl.db, path, "PRAGMA synchronous = FULL; PRAGMA secure_delete = ON");
}

// A missing store is built under a temporary name beside it and linked into place, so no
// process ever sees a half-made file under the real name, and two processes creating it
// at once end up sharing one store (link(2) refuses the second, which opens the first's).
// The file is the user's only (0600, mkstemp's mode).
void create_store(const std::string& path) {
  std::string tmp = path + ".new-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create memory store (" + std::strerror(errno) + ")");
  ::close(fd);
  struct Unlink {
    const std::string& name;
    ~Unlink() { ::unlink(name.c_str()); }
  } cleanup{tmp};
  {
    MemoryStore::Impl building;
    building.path = tmp;
    connect(building, tmp);
  }  // closing checkpoints the WAL into the file and removes its -wal and -shm
  if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST)
    throw Error(path + ": cannot create memory store (" + std::strerror(errno) + ")");
  // The new name durable too (best effort: the store is consistent either way).
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) ::fsync(dfd), ::close(dfd);
}

}  // namespace

void open_store(MemoryStore::Impl& impl) {
  const std::string& path = impl.path;
  if (path.empty()) throw Error("memory store: empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw Error(path + ": cannot open memory store (" + std::strerror(errno) + ")");
    create_store(path);
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open memory store (" + std::strerror(errno) + ")");
  }
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a directory, not a memory store");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file, not a memory store");
  check_header(path, st.st_size);
  connect(impl, path);
}

}  // namespace kiln::memory
