// GGUF reader. The file is mapped read-only; everything read from it is bounds-checked
// before use so a truncated or hostile file ends in one kiln::Error, never a crash.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "kiln/gguf.h"

namespace kiln::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are hostile
constexpr uint32_t kMaxDims = 4;         // ggml's limit

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

// Sequential reader over the mapping; `what` names the field being read for errors.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size,
         const std::function<void(const std::string&)>& fail)
      : base_(base), size_(size), fail_(fail) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }

  void need(uint64_t n, const std::string& what) {
    if (n > remaining())
      fail_(what + " at byte " + std::to_string(pos_) + " needs " + std::to_string(n) +
            " bytes but the file ends at " + std::to_string(size_) + " (truncated?)");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // n bytes in place, past which the cursor moves.
  const uint8_t* take(uint64_t n, const std::string& what) {
    need(n, what);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }
  // Moves past a string, returning its length.
  uint64_t skip_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    take(len, what + " (" + std::to_string(len) + " bytes)");
    return len;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    need(len, what + " (" + std::to_string(len) + " bytes)");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::function<void(const std::string&)>& fail_;
};

// Smallest encoding of one element: bounds array counts before anything is allocated.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

Value read_value(Cursor& cur, ValueType type, const std::string& what, int depth,
                 const std::function<void(const std::string&)>& fail) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::UINT8: v.u = cur.read<uint8_t>(what); break;
    case ValueType::INT8: v.i = cur.read<int8_t>(what); break;
    case ValueType::UINT16: v.u = cur.read<uint16_t>(what); break;
    case ValueType::INT16: v.i = cur.read<int16_t>(what); break;
    case ValueType::UINT32: v.u = cur.read<uint32_t>(what); break;
    case ValueType::INT32: v.i = cur.read<int32_t>(what); break;
    case ValueType::UINT64: v.u = cur.read<uint64_t>(what); break;
    case ValueType::INT64: v.i = cur.read<int64_t>(what); break;
    case ValueType::FLOAT32: v.f = cur.read<float>(what); break;
    case ValueType::FLOAT64: v.f = cur.read<double>(what); break;
    case ValueType::BOOL: {
      const uint8_t b = cur.read<uint8_t>(what);
      if (b > 1) fail(what + ": bool value " + std::to_string(b) + " is neither 0 nor 1");
      v.u = b;
      break;
    }
    case ValueType::STRING: v.s = cur.read_string(what); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) fail(what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      const uint32_t et = cur.read<uint32_t>(what + " element type");
      if (!valid_value_type(et)) fail(what + ": unknown array element type " + std::to_string(et));
      v.elem_type = static_cast<ValueType>(et);
      const uint64_t n = cur.read<uint64_t>(what + " element count");
      if (n > cur.remaining() / min_encoded_size(v.elem_type))
        fail(what + ": array of " + std::to_string(n) + " elements cannot fit in the " +
             std::to_string(cur.remaining()) + " bytes left in the file");
      if (const size_t width = scalar_size(v.elem_type)) {
        const uint8_t* p = cur.take(n * width, what);
        if (v.elem_type == ValueType::BOOL)
          for (uint64_t k = 0; k < n; ++k)
            if (p[k] > 1) fail(what + ": bool value " + std::to_string(p[k]) + " is neither 0 nor 1");
        v.packed.assign(reinterpret_cast<const char*>(p), n * width);
      } else if (v.elem_type == ValueType::STRING) {
        // Lengths first, so that the characters get one allocation of their exact size.
        Cursor scan = cur;
        uint64_t chars = 0;
        for (uint64_t k = 0; k < n; ++k) chars += scan.skip_string(what);
        v.packed.reserve(chars);
        v.offsets.reserve(n + 1);
        v.offsets.push_back(0);
        for (uint64_t k = 0; k < n; ++k) {
          const uint64_t len = cur.read<uint64_t>(what);
          v.packed.append(reinterpret_cast<const char*>(cur.take(len, what)), len);
          v.offsets.push_back(v.packed.size());
        }
      } else {
        // Arrays of arrays: no converter writes large ones, and each costs a whole Value.
        if (n > cur.size() / sizeof(Value))
          fail(what + ": " + std::to_string(n) + " nested arrays would take more memory than the file's size");
        v.items.reserve(n);
        for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(cur, v.elem_type, what, depth + 1, fail));
      }
      break;
    }
  }
  return v;
}

}  // namespace

void File::fail(const std::string& what) const { throw Error(path_ + ": " + what); }

namespace {

// Maps the file read-only at an address aligned to 2 MiB, asking for huge pages. Where the
// filesystem keeps large folios in the page cache (ext4, XFS on recent kernels) the
// weights are then mapped 2 MiB at a time: a matvec streaming a mixture of experts'
// scattered expert matrices (a few hundred KiB each) no longer walks the page tables every
// 4 KiB. Elsewhere the advice does nothing. MAP_FAILED on failure, as mmap.
void* map_on_huge_pages(int fd, size_t size) {
  constexpr size_t kHuge = size_t(2) << 20;
  void* area = mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const uintptr_t start = reinterpret_cast<uintptr_t>(area), end = start + size + kHuge;
  const uintptr_t aligned = (start + kHuge - 1) & ~uintptr_t(kHuge - 1);
  void* map = mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (map == MAP_FAILED) {
    munmap(area, size + kHuge);
    return map;
  }
  // The reservation around the mapping is given back.
  if (aligned > start) munmap(area, aligned - start);
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t map_end = (aligned + size + page - 1) & ~(page - 1);
  if (end > map_end) munmap(reinterpret_cast<void*>(map_end), end - map_end);
#ifdef MADV_HUGEPAGE
  madvise(map, size, MADV_HUGEPAGE);
#endif
  return map;
}

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> file(new File());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) file->fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    file->fail("not a regular file");
  }
  file->size_ = static_cast<uint64_t>(st.st_size);
  file->mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  file->inode_ = st.st_ino, file->device_ = st.st_dev;
  if (file->size_ < 24) {
    ::close(fd);
    file->fail("file is " + std::to_string(file->size_) + " bytes, too small to be GGUF (truncated?)");
  }
  void* map = map_on_huge_pages(fd, file->size_);
  ::close(fd);
  if (map == MAP_FAILED) file->fail(std::string("mmap failed: ") + std::strerror(errno));
  file->base_ = static_cast<const uint8_t*>(map);
  file->parse();  // on throw, ~File unmaps
  return file;
}

void File::check_unchanged() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) fail(std::string("changed while loading: ") + std::strerror(errno));
  const int64_t mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (uint64_t(st.st_size) != size_ || mtime_ns != mtime_ns_ || st.st_ino != inode_ || st.st_dev != device_)
    fail("changed while loading (it was " + std::to_string(size_) + " bytes, now " + std::to_string(st.st_size) +
         (uint64_t(st.st_size) == size_ ? ", rewritten" : "") + "): load it again once it is complete");
}

File::~File() {
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
}

void File::parse() {
  const std::function<void(const std::string&)> failer = [this](const std::string& w) { fail(w); };
  Cursor cur(base_, size_, failer);

  const uint32_t magic = cur.read<uint32_t>("magic");
  if (magic != kMagic) fail("bad magic: not a GGUF file");
  version_ = cur.read<uint32_t>("version");
  if (version_ == 1) fail("GGUF version 1 is not supported (only 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0 && (version_ >> 24) <= 3) fail("big-endian GGUF files are not supported");
    fail("unsupported GGUF version " + std::to_string(version_) + " (only 2 and 3)");
  }
  const uint64_t n_tensors = cur.read<uint64_t>("tensor count");
  const uint64_t n_kv = cur.read<uint64_t>("metadata count");
  // A key is at least 8 (length) + 4 (type) + 1 bytes; a tensor info at least 8+4+8+4+8.
  if (n_kv > cur.remaining() / 13) fail("metadata count " + std::to_string(n_kv) + " cannot fit in the file");
  if (n_tensors > cur.remaining() / 32) fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the file");

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = cur.read_string("metadata key #" + std::to_string(k));
    if (key.empty()) fail("metadata key #" + std::to_string(k) + " is empty");
    const uint32_t t = cur.read<uint32_t>("metadata '" + key + "' type");
    if (!valid_value_type(t)) fail("metadata '" + key + "' has unknown value type " + std::to_string(t));
    Value v = read_value(cur, static_cast<ValueType>(t), "metadata '" + key + "'", 0, failer);
    if (kv_index_.count(key)) fail("metadata key '" + key + "' appears twice");
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }
  kv_read_ = std::make_unique<std::atomic<bool>[]>(kv_.size());

  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::UINT32) fail("general.alignment must be uint32, not " + std::string(value_type_name(a->type)));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail("general.alignment " + std::to_string(a->u) + " is not a power of two");
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    t.name = cur.read_string("tensor #" + std::to_string(k) + " name");
    const std::string label = "tensor '" + t.name + "'";
    const uint32_t n_dims = cur.read<uint32_t>(label + " dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(label + " has " + std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)");
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = cur.read<uint64_t>(label + " dimension " + std::to_string(d));
      if (dim == 0 || dim > (uint64_t(1) << 40))
        fail(label + " dimension " + std::to_string(d) + " is " + std::to_string(dim) + " (absurd)");
      if (mul_overflows(t.n_elements, dim, &t.n_elements) || t.n_elements > (uint64_t(1) << 50))
        fail(label + " has too many elements (dimensions overflow)");
      t.dims.push_back(dim);
    }
    const uint32_t raw_type = cur.read<uint32_t>(label + " type");
    const TypeInfo* info = type_info(raw_type);
    if (!info) fail(label + " has unknown tensor type " + std::to_string(raw_type));
    t.type = static_cast<TensorType>(raw_type);
    if (t.dims[0] % info->block_size != 0)
      fail(label + " row of " + std::to_string(t.dims[0]) + " elements is not a multiple of the " +
           info->name + " block size " + std::to_string(info->block_size));
    t.n_bytes = t.n_elements / info->block_size * info->block_bytes;
    t.offset = cur.read<uint64_t>(label + " offset");
    if (t.offset % alignment_ != 0)
      fail(label + " data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
           std::to_string(alignment_));
    if (tensor_index_.count(t.name)) fail(label + " appears twice");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  uint64_t data_start = cur.pos();
  if (data_start % alignment_) data_start += alignment_ - data_start % alignment_;
  data_offset_ = data_start;
  if (!tensors_.empty() && data_start > size_)
    fail("tensor data section starts at byte " + std::to_string(data_start) + ", past the end of the file (" +
         std::to_string(size_) + " bytes; truncated?)");
  for (TensorInfo& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (add_overflows(data_start, t.offset, &begin) || add_overflows(begin, t.n_bytes, &end) || end > size_)
      fail("tensor '" + t.name + "' data [offset " + std::to_string(t.offset) + ", " + std::to_string(t.n_bytes) +
           " bytes] lies past end of file (" + std::to_string(size_) + " bytes, data section at " +
           std::to_string(data_start) + ")");
    t.data = base_ + begin;
  }
  // Tensors sharing bytes are no converter's output; the runtime would read one tensor's
  // weights as another's (and packing releases a tensor's pages once copied).
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = *by_offset[k - 1];
    if (by_offset[k]->offset < prev.offset + prev.n_bytes)  // both ends were checked above
      fail("tensor '" + by_offset[k]->name + "' data [offset " + std::to_string(by_offset[k]->offset) +
           "] overlaps tensor '" + prev.name + "' [offset " + std::to_string(prev.offset) + ", " +
           std::to_string(prev.n_bytes) + " bytes]");
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return nullptr;
  kv_read_[it->second].store(true, std::memory_order_relaxed);
  return &kv_[it->second].second;
}

std::vector<std::string> File::unread_keys(std::string_view prefix) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < kv_.size(); ++i)
    if (kv_[i].first.starts_with(prefix) && !kv_read_[i].load(std::memory_order_relaxed)) out.push_back(kv_[i].first);
  return out;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t TensorInfo::rows() const {
  uint64_t r = 1;
  for (size_t d = 1; d < dims.size(); ++d) r *= dims[d];
  return r;
}

uint64_t TensorInfo::row_bytes() const {
  const TypeInfo& info = type_info(type);
  return dims[0] / info.block_size * info.block_bytes;
}

}  // namespace kiln::gguf
