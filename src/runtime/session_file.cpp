// Session files (format in kiln/session_file.h). Loading trusts nothing in the file: every
// size is checked against the others and against the file's real length before anything
// is allocated, and the session is only written once the whole payload has been read and
// its checksum matches.
#include "kiln/session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "kiln/error.h"
#include "util/hash64.h"

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 96;
constexpr size_t kHeaderChecksumAt = 88;

struct Header {
  uint32_t version = kVersion;
  uint64_t model_identity = 0;
  uint32_t n_ctx = 0, n_tokens = 0, n_cached = 0;
  uint32_t kv_type = 0, kv_layers = 0, kv_dim = 0;
  uint64_t kv_layer_bytes = 0;
  uint64_t positions = 0;
  uint64_t app_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

template <typename T>
void put(uint8_t* b, size_t at, T v) {
  std::memcpy(b + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* b, size_t at) {
  T v;
  std::memcpy(&v, b + at, sizeof v);
  return v;
}

void encode(const Header& h, uint8_t* b) {
  std::memset(b, 0, kHeaderBytes);
  std::memcpy(b, kMagic, sizeof kMagic);
  put<uint32_t>(b, 8, h.version);
  put<uint32_t>(b, 12, kHeaderBytes);
  put<uint64_t>(b, 16, h.model_identity);
  put<uint32_t>(b, 24, h.n_ctx);
  put<uint32_t>(b, 28, h.n_tokens);
  put<uint32_t>(b, 32, h.n_cached);
  put<uint32_t>(b, 36, h.kv_type);
  put<uint32_t>(b, 40, h.kv_layers);
  put<uint32_t>(b, 44, h.kv_dim);
  put<uint64_t>(b, 48, h.kv_layer_bytes);
  put<uint64_t>(b, 56, h.app_bytes);
  put<uint64_t>(b, 64, h.payload_bytes);
  put<uint64_t>(b, 72, h.payload_checksum);
  put<uint64_t>(b, 80, h.positions);
  put<uint64_t>(b, kHeaderChecksumAt, Hash64::of(b, kHeaderChecksumAt));
}

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)v);
  return s;
}

// Closes on every path; fclose's result matters only when writing and is checked there.
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    struct stat st;
    if (fstat(fd_, &st) != 0) fail(std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    size_ = uint64_t(st.st_size);
  }
  ~Reader() {
    if (fd_ >= 0) ::close(fd_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

  // Magic, version and the header's own checksum: after this every field is as written
  // (the sizes in it still have to be checked against each other and the file).
  Header header() {
    uint8_t b[kHeaderBytes];
    size_t got = 0;
    while (got < kHeaderBytes) {
      const ssize_t n = ::pread(fd_, b + got, kHeaderBytes - got, off_t(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(std::string("cannot read: ") + std::strerror(errno));
      if (n == 0) break;
      got += size_t(n);
    }
    const size_t magic_got = got < sizeof kMagic ? got : sizeof kMagic;
    if (got == 0 || std::memcmp(b, kMagic, magic_got) != 0) fail("not a kiln session file (no KILNSESS magic)");
    if (got >= 12) {
      const uint32_t version = get<uint32_t>(b, 8);
      if (version > kVersion)
        fail("session file version " + std::to_string(version) + " is newer than this kiln reads (" +
             std::to_string(kVersion) + "); save it again with this version");
      if (version != kVersion) fail("unknown session file version " + std::to_string(version));
    }
    if (got < kHeaderBytes)
      fail("truncated (" + std::to_string(got) + " bytes, a session file header has " + std::to_string(kHeaderBytes) + ")");
    if (get<uint32_t>(b, 12) != kHeaderBytes || get<uint64_t>(b, kHeaderChecksumAt) != Hash64::of(b, kHeaderChecksumAt))
      fail("corrupted (header checksum mismatch)");
    Header h;
    h.version = get<uint32_t>(b, 8);
    h.model_identity = get<uint64_t>(b, 16);
    h.n_ctx = get<uint32_t>(b, 24);
    h.n_tokens = get<uint32_t>(b, 28);
    h.n_cached = get<uint32_t>(b, 32);
    h.kv_type = get<uint32_t>(b, 36);
    h.kv_layers = get<uint32_t>(b, 40);
    h.kv_dim = get<uint32_t>(b, 44);
    h.kv_layer_bytes = get<uint64_t>(b, 48);
    h.app_bytes = get<uint64_t>(b, 56);
    h.payload_bytes = get<uint64_t>(b, 64);
    h.payload_checksum = get<uint64_t>(b, 72);
    h.positions = get<uint64_t>(b, 80);
    constexpr uint32_t kMaxInt = std::numeric_limits<int32_t>::max();
    if (h.n_ctx > kMaxInt || h.n_tokens > kMaxInt || h.n_cached > h.n_tokens || h.n_cached > h.n_ctx)
      fail("corrupted (inconsistent token counts: " + std::to_string(h.n_tokens) + " tokens, " +
           std::to_string(h.n_cached) + " cached, context " + std::to_string(h.n_ctx) + ")");
    return h;
  }

  // Exactly n bytes at offset `at`. The file was checked to be long enough, so running
  // out means it changed while being read.
  void read_at(uint64_t at, void* dst, size_t n) {
    auto* p = static_cast<uint8_t*>(dst);
    while (n) {
      const ssize_t got = ::pread(fd_, p, n, off_t(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(std::string("cannot read: ") + std::strerror(errno));
      if (got == 0) fail("truncated while being read (changed meanwhile?)");
      p += got, at += uint64_t(got), n -= size_t(got);
    }
  }

  uint64_t size() const { return size_; }

 private:
  const std::string& path_;
  int fd_;
  uint64_t size_ = 0;
};

SessionFileInfo info_of(const Header& h) {
  return {h.version, h.model_identity, int32_t(h.n_ctx), int32_t(h.n_tokens), int32_t(h.n_cached)};
}

bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

void save_session_file(const std::string& path, const Session& session, std::span<const int32_t> tokens,
                       std::string_view app_data) {
  const int32_t n_cached = session.n_past();
  if (tokens.size() < size_t(n_cached))
    throw Error(path + ": cannot save: the session holds " + std::to_string(n_cached) + " positions but only " +
                std::to_string(tokens.size()) + " tokens were given");
  if (tokens.size() > size_t(std::numeric_limits<int32_t>::max()))
    throw Error(path + ": cannot save: " + std::to_string(tokens.size()) + " tokens are too many");
  const KvStateDesc kv = session.kv_state_desc(n_cached);

  Header h;
  h.model_identity = session.model().identity();
  h.n_ctx = uint32_t(session.n_ctx());
  h.n_tokens = uint32_t(tokens.size());
  h.n_cached = uint32_t(n_cached);
  h.kv_type = kv.kv_type;
  h.kv_layers = kv.n_layers;
  h.kv_dim = kv.kv_dim;
  h.kv_layer_bytes = kv.layer_bytes;
  h.positions = kv.positions;
  h.app_bytes = app_data.size();
  h.payload_bytes = tokens.size_bytes() + app_data.size() + kv.bytes();

  // Everything goes to PATH.tmp, which is removed again if anything fails before the
  // rename: a failed save never damages the previous file.
  const std::string tmp = path + ".tmp";
  FilePtr f(std::fopen(tmp.c_str(), "wb"));
  if (!f) throw Error(path + ": cannot write " + tmp + ": " + std::strerror(errno));
  bool done = false;
  struct RemoveTmp {
    const std::string& tmp;
    const bool& done;
    ~RemoveTmp() {
      if (!done) std::remove(tmp.c_str());
    }
  } remove_tmp{tmp, done};
  const auto io_error = [&](const char* what) {
    throw Error(path + ": cannot " + std::string(what) + " " + tmp + ": " + std::strerror(errno));
  };
  // The KV state arrives as many row-sized pieces (one per value dimension and layer):
  // a larger stdio buffer turns them into fewer writes (not too large: fresh memory
  // costs a page fault per 4 KiB).
  std::setvbuf(f.get(), nullptr, _IOFBF, 256 << 10);

  uint8_t header[kHeaderBytes];
  encode(h, header);  // a placeholder until the payload checksum is known
  if (std::fwrite(header, 1, kHeaderBytes, f.get()) != kHeaderBytes) io_error("write");
  Hash64 checksum;
  uint64_t written = 0;
  const auto piece = [&](const void* data, size_t bytes) {
    if (bytes == 0) return;
    checksum.update(data, bytes);
    if (std::fwrite(data, 1, bytes, f.get()) != bytes) io_error("write");
    written += bytes;
  };
  piece(tokens.data(), tokens.size_bytes());
  piece(app_data.data(), app_data.size());
  session.write_kv_state(piece);
  if (written != h.payload_bytes)
    throw Error(path + ": internal error: wrote " + std::to_string(written) + " payload bytes, expected " +
                std::to_string(h.payload_bytes));

  h.payload_checksum = checksum.digest();
  encode(h, header);
  if (std::fseek(f.get(), 0, SEEK_SET) != 0) io_error("seek in");
  if (std::fwrite(header, 1, kHeaderBytes, f.get()) != kHeaderBytes) io_error("write");
  if (std::fflush(f.get()) != 0) io_error("write");
  // Synced before the rename, or a crash could leave PATH naming a file whose data never
  // reached the disk.
  if (fsync(fileno(f.get())) != 0) io_error("sync");
  if (std::fclose(f.release()) != 0) io_error("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(path + ": cannot replace it with " + tmp + ": " + std::strerror(errno));
  done = true;
}

SessionFileInfo read_session_file_info(const std::string& path) {
  Reader r(path);
  return info_of(r.header());
}

LoadedSession load_session_file(const std::string& path, Session& session) {
  Reader r(path);
  const Header h = r.header();
  const Model& model = session.model();
  if (h.model_identity != model.identity())
    r.fail("saved with a different model (its identity is " + hex(h.model_identity) + ", " + model.config().name +
           " has " + model.identity_hex() + ")");

  KvStateDesc kv{h.kv_type, h.kv_layers, h.kv_dim, int32_t(h.n_cached), h.kv_layer_bytes, h.positions};
  const KvStateDesc want = session.kv_state_desc(int32_t(h.n_cached));
  // The recurrent layers' state has the model's size (its identity matched above), so the
  // header has no field for it; the payload size below counts it.
  kv.recurrent_bytes = want.recurrent_bytes;
  if (kv.positions != want.positions)
    r.fail("its keys were rotated with other RoPE settings (" +
           std::string(kv.positions ? "scaled RoPE " + hex(kv.positions) : "the model's own RoPE") + ") than this session's (" +
           (want.positions ? "scaled RoPE " + hex(want.positions) : "the model's own RoPE") +
           "): use the --rope-* flags it was saved with");
  if (!(kv == want))
    r.fail("its KV cache (" + Session::kv_type_name(kv.kv_type) + ", " + std::to_string(kv.n_layers) +
           " layers of width " + std::to_string(kv.kv_dim) + ", " + std::to_string(kv.layer_bytes) +
           " bytes per layer) does not match this session's (" + Session::kv_type_name(want.kv_type) + ", " +
           std::to_string(want.n_layers) + " layers of width " + std::to_string(want.kv_dim) + ", " +
           std::to_string(want.layer_bytes) + " bytes): use the -ctk, -ctv and -fa it was saved with");
  if (h.n_tokens > uint32_t(session.n_ctx()))
    r.fail("needs a context of at least " + std::to_string(h.n_tokens) + " tokens (this session has " +
           std::to_string(session.n_ctx()) + "; raise -c)");

  // kv.bytes() cannot overflow here: it equals what this session would write.
  uint64_t payload_bytes = 0;
  if (mul_overflows(h.n_tokens, sizeof(int32_t), &payload_bytes) || add_overflows(payload_bytes, h.app_bytes, &payload_bytes) ||
      add_overflows(payload_bytes, kv.bytes(), &payload_bytes) || payload_bytes != h.payload_bytes)
    r.fail("corrupted (the header's sizes disagree)");
  const uint64_t have = r.size() - kHeaderBytes;  // header() read kHeaderBytes
  if (have < payload_bytes)
    r.fail("truncated (" + std::to_string(r.size()) + " bytes, the header describes " +
           std::to_string(kHeaderBytes + payload_bytes) + ")");
  if (have > payload_bytes) r.fail("corrupted (" + std::to_string(have - payload_bytes) + " unexpected bytes after the data)");

  // Two passes over the KV bytes through one small buffer: the first only checksums
  // them, the second reads them straight into the cache rows. Reading the file twice from
  // the page cache is cheap; the obvious single read into a payload-sized buffer is not,
  // since every 4 KiB of fresh memory costs a page fault (VM: 86 MiB TinyLlama state of
  // 2,000 tokens, 460 ms that way, ~160 ms through a mapping of the file, which also dies
  // of SIGBUS if the file shrinks meanwhile, ~90 ms like this, ~20 of them the first
  // pass). Every size was checked against the file's length above: nothing here
  // allocates more than the file holds.
  LoadedSession out;
  out.info = info_of(h);
  out.tokens.resize(h.n_tokens);
  out.app_data.resize(size_t(h.app_bytes));
  Hash64 checksum;
  uint64_t at = kHeaderBytes;
  r.read_at(at, out.tokens.data(), out.tokens.size() * sizeof(int32_t));
  checksum.update(out.tokens.data(), out.tokens.size() * sizeof(int32_t));
  at += out.tokens.size() * sizeof(int32_t);
  r.read_at(at, out.app_data.data(), out.app_data.size());
  checksum.update(out.app_data.data(), out.app_data.size());
  at += out.app_data.size();
  const uint64_t kv_at = at, kv_end = kv_at + kv.bytes();
  const Hash64 before_kv = checksum;
  constexpr size_t kChunk = size_t(256) << 10;  // small: fresh memory costs a fault per page
  const size_t buf_bytes = size_t(std::min<uint64_t>(kChunk, kv.bytes()));
  const auto buf = std::make_unique_for_overwrite<uint8_t[]>(buf_bytes);
  for (; at < kv_end; at += buf_bytes) {
    const size_t n = size_t(std::min<uint64_t>(buf_bytes, kv_end - at));
    r.read_at(at, buf.get(), n);
    checksum.update(buf.get(), n);
  }
  if (checksum.digest() != h.payload_checksum) r.fail("corrupted (checksum mismatch)");

  // A file with a valid checksum can still be crafted: ids index tables later.
  const uint32_t n_vocab = model.config().n_vocab;
  for (size_t i = 0; i < out.tokens.size(); ++i)
    if (uint32_t(out.tokens[i]) >= n_vocab)
      r.fail("corrupted (token " + std::to_string(i) + " is id " + std::to_string(out.tokens[i]) +
             ", outside the vocabulary of " + std::to_string(n_vocab) + ")");

  // Second pass. Rows smaller than the buffer are served from it, larger ones read in
  // place. Only another program rewriting the file in place (kiln's saves never do: they
  // rename a new file over it) could make these bytes differ from the checked ones; then
  // the session, already partly overwritten, is cleared rather than left inconsistent.
  Hash64 again = before_kv;
  size_t pos = 0, len = 0;
  at = kv_at;
  const auto source = [&](void* dst, size_t n) {
    auto* p = static_cast<uint8_t*>(dst);
    const size_t bytes = n;
    const size_t from_buf = std::min(n, len - pos);
    std::memcpy(p, buf.get() + pos, from_buf);
    pos += from_buf, p += from_buf, n -= from_buf;
    if (n >= buf_bytes) {
      r.read_at(at, p, n);
      at += n;
    } else if (n) {
      len = size_t(std::min<uint64_t>(buf_bytes, kv_end - at));
      if (len < n) r.fail("truncated while being read (changed meanwhile?)");
      r.read_at(at, buf.get(), len);
      at += len;
      std::memcpy(p, buf.get(), n);
      pos = n;
    }
    again.update(dst, bytes);
  };
  try {
    session.read_kv_state(kv, source);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind(path + ": ", 0) == 0) throw;
    r.fail(msg);  // checked above; only a bug gets here, still one line naming the file
  }
  if (again.digest() != h.payload_checksum) {
    session.reset();
    r.fail("changed while being loaded (the conversation was cleared)");
  }
  return out;
}

}  // namespace kiln
