// llama.cpp's importance-matrix files (include/kiln/imatrix.h): GGUF through kiln's own
// reader and writer, the legacy .dat by hand. Every count and length a file claims is
// checked against its size before anything is allocated for it.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/imatrix.h"

namespace kiln::imatrix {
namespace {

constexpr const char* kDatasets = "imatrix.datasets";
constexpr const char* kChunkCount = "imatrix.chunk_count";
constexpr const char* kChunkSize = "imatrix.chunk_size";
constexpr std::string_view kSumsSuffix = ".in_sum2", kCountsSuffix = ".counts";

std::string without_suffix(const std::string& name, std::string_view suffix) {
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return {};
  return name.substr(0, name.size() - suffix.size());
}

std::vector<float> floats_of(const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  std::memcpy(out.data(), t.data, t.n_elements * sizeof(float));
  return out;
}

// What every entry must satisfy, whichever format it came from.
void check_entry(const std::string& path, const std::string& name, const Entry& e) {
  const auto fail = [&](const std::string& what) { throw Error(path + ": entry '" + name + "': " + what); };
  if (e.counts.empty() || e.sums.empty()) fail("no values");
  if (e.sums.size() % e.counts.size() != 0)
    fail(std::to_string(e.counts.size()) + " counts do not divide its " + std::to_string(e.sums.size()) + " sums");
  for (int64_t c : e.counts)
    if (c < 0) fail("a negative count (" + std::to_string(c) + ")");
  for (float v : e.sums)
    if (!std::isfinite(v) || v < 0) fail("a sum of squares that is " + std::to_string(v));
}

Imatrix read_gguf(const std::string& path) {
  auto f = gguf::File::open(path);
  const std::string type = f->get_string("general.type", "imatrix");
  if (type != "imatrix") throw Error(path + ": general.type is '" + type + "', not an importance matrix ('imatrix')");
  Imatrix m;
  m.has_metadata = f->has(kDatasets) && f->has(kChunkCount) && f->has(kChunkSize);
  if (const gguf::Value* v = f->find(kDatasets)) {
    if (v->type != gguf::ValueType::ARRAY || v->elem_type != gguf::ValueType::STRING)
      throw Error(path + ": " + kDatasets + " must be an array of strings");
    for (size_t i = 0; i < v->size(); ++i) m.datasets.emplace_back(v->string_at(i));
  }
  m.chunk_count = int32_t(f->get_u32(kChunkCount, 0));
  m.chunk_size = int32_t(f->get_u32(kChunkSize, 0));

  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> pairs;
  for (const gguf::TensorInfo& t : f->tensors()) {
    std::string name = without_suffix(t.name, kSumsSuffix);
    const bool sums = !name.empty();
    if (!sums) name = without_suffix(t.name, kCountsSuffix);
    if (name.empty()) continue;  // not statistics: ignored, as llama.cpp does
    if (t.type != TensorType::F32)
      throw Error(path + ": tensor '" + t.name + "' is " + type_name(t.type) + "; an importance matrix holds F32");
    (sums ? pairs[name].first : pairs[name].second) = &t;
  }
  for (const auto& [name, pair] : pairs) {
    const auto& [sums, counts] = pair;
    if (!sums || !counts)
      throw Error(path + ": tensor '" + name + std::string(sums ? kSumsSuffix : kCountsSuffix) + "' has no '" + name +
                  std::string(sums ? kCountsSuffix : kSumsSuffix) + "' beside it");
    Entry e;
    e.sums = floats_of(*sums);
    for (float c : floats_of(*counts)) {
      if (!std::isfinite(c) || c < 0)
        throw Error(path + ": tensor '" + counts->name + "': a count that is " + std::to_string(c));
      e.counts.push_back(std::lround(c));
    }
    check_entry(path, name, e);
    m.entries.emplace(name, std::move(e));
  }
  if (m.entries.empty())
    throw Error(path + ": no importance matrix entries (no <name>.in_sum2 and <name>.counts tensors)");
  return m;
}

// A .dat file read from memory, each field checked against what is left.
class DatReader {
 public:
  DatReader(const std::string& path, std::string bytes) : path_(path), bytes_(std::move(bytes)) {}
  bool at_end() const { return at_ == bytes_.size(); }
  int32_t i32(const std::string& field) {
    int32_t v = 0;
    take(&v, sizeof v, field);
    return v;
  }
  void take(void* dst, size_t n, const std::string& field) {
    if (bytes_.size() - at_ < n)
      throw Error(path_ + ": ends inside " + field + " (" + std::to_string(bytes_.size()) + " bytes; not an importance matrix?)");
    std::memcpy(dst, bytes_.data() + at_, n);
    at_ += n;
  }
  // A length field: non-negative and within the file, counted in units of `unit` bytes.
  size_t length(const std::string& field, size_t unit) {
    const int32_t n = i32(field);
    if (n < 0 || size_t(n) > (bytes_.size() - at_) / unit)
      throw Error(path_ + ": " + field + " is " + std::to_string(n) + ", not a length within the file (not an importance matrix?)");
    return size_t(n);
  }

 private:
  std::string path_, bytes_;
  size_t at_ = 0;
};

Imatrix read_dat(const std::string& path, std::string bytes) {
  DatReader in(path, std::move(bytes));
  const int32_t n_entries = in.i32("the entry count");
  if (n_entries < 1) throw Error(path + ": the entry count is " + std::to_string(n_entries) + " (no importance matrix entries)");
  Imatrix m;
  m.legacy = true;
  for (int32_t i = 0; i < n_entries; ++i) {
    const std::string where = "entry " + std::to_string(i + 1);
    std::string name(in.length(where + "'s name length", 1), '\0');
    in.take(name.data(), name.size(), where + "'s name");
    const std::string field = "entry '" + name + "'";
    Entry e;
    e.counts = {in.i32(field + "'s call count")};
    const size_t n = in.length(field + "'s value count", sizeof(float));
    if (n == 0) throw Error(path + ": " + field + " has no values");
    e.sums.resize(n);
    in.take(e.sums.data(), n * sizeof(float), field + "'s values");
    check_entry(path, name, e);
    if (!m.entries.emplace(name, std::move(e)).second) throw Error(path + ": " + field + " appears twice");
  }
  if (!in.at_end()) {  // the chunk count and the dataset, which older files lack
    m.chunk_count = in.i32("the chunk count");
    if (!in.at_end()) {
      std::string dataset(in.length("the dataset name length", 1), '\0');
      in.take(dataset.data(), dataset.size(), "the dataset name");
      if (!dataset.empty()) m.datasets.push_back(dataset);
    }
  }
  return m;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

void check_writable(const Imatrix& m, const std::string& path) {
  if (m.legacy) throw Error(path + ": cannot write statistics read from a legacy .dat file (they are not raw sums)");
  for (const auto& [name, e] : m.entries) check_entry(path, name, e);
}

}  // namespace

Imatrix read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open: " + std::strerror(errno));
  char magic[4] = {};
  f.read(magic, 4);
  if (f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return read_gguf(path);
  f.clear();
  f.seekg(0);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error(path + ": read failed");
  return read_dat(path, std::move(bytes));
}

void write_gguf(const Imatrix& m, const std::string& path) {
  check_writable(m, path);
  gguf::Writer w;
  w.set("general.type", gguf::Value::of_string("imatrix"));
  std::vector<gguf::Value> datasets;
  for (const std::string& d : m.datasets) datasets.push_back(gguf::Value::of_string(d));
  w.set(kDatasets, gguf::Value::of_array(gguf::ValueType::STRING, std::move(datasets)));
  w.set(kChunkCount, gguf::Value::of_u32(uint32_t(m.chunk_count)));
  w.set(kChunkSize, gguf::Value::of_u32(uint32_t(m.chunk_size)));
  for (const auto& [name, e] : m.entries) {  // std::map: by name, as llama-imatrix orders them
    const uint64_t n_mat = e.n_mat(), n = e.n_per_row();
    std::vector<float> counts(e.counts.begin(), e.counts.end());
    // ggml drops trailing dimensions of 1 from a tensor's shape.
    w.add_tensor(name + std::string(kSumsSuffix), TensorType::F32,
                 n_mat > 1 ? std::vector<uint64_t>{n, n_mat} : std::vector<uint64_t>{n}, bytes_of(e.sums));
    w.add_tensor(name + std::string(kCountsSuffix), TensorType::F32,
                 n_mat > 1 ? std::vector<uint64_t>{1, n_mat} : std::vector<uint64_t>{1}, bytes_of(counts));
  }
  w.write(path);
}

void write_dat(const Imatrix& m, const std::string& path) {
  check_writable(m, path);
  if (m.chunk_size <= 0) throw Error(path + ": the chunk size is needed to write a .dat file");
  std::vector<uint8_t> out;
  const auto put = [&](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const auto put_i32 = [&](int32_t v) { put(&v, sizeof v); };
  int32_t n_stored = 0;
  for (const auto& [name, e] : m.entries)
    n_stored += std::any_of(e.counts.begin(), e.counts.end(), [](int64_t c) { return c > 0; });
  put_i32(n_stored);
  for (const auto& [name, e] : m.entries) {
    const int64_t most = *std::max_element(e.counts.begin(), e.counts.end());
    if (most == 0) continue;  // no row ever went into it
    put_i32(int32_t(name.size()));
    put(name.data(), name.size());
    // The chunks the largest count spans, rounded up so that no entry stores 0 calls.
    const int32_t ncall = int32_t((most + m.chunk_size - 1) / m.chunk_size);
    put_i32(ncall);
    put_i32(int32_t(e.sums.size()));
    const size_t n = e.n_per_row();
    for (size_t i = 0; i < e.sums.size(); ++i) {
      const float count = float(e.counts[i / n]);
      // An expert without rows stores 1, which reads back as 1 / ncall.
      const float mean = count == 0.0f ? 1.0f : e.sums[i] / count;
      const float v = mean * float(ncall);
      put(&v, sizeof v);
    }
  }
  put_i32(m.chunk_count);
  const std::string dataset = m.datasets.empty() ? std::string() : m.datasets.back();
  put_i32(int32_t(dataset.size()));
  put(dataset.data(), dataset.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(path + ": cannot create file");
  f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size()));
  if (!f) throw Error(path + ": write failed");
}

std::vector<float> importance(const Entry& e, bool legacy) {
  std::vector<float> out(e.sums.size());
  if (legacy) {
    const int64_t ncall = e.counts.empty() ? 0 : e.counts[0];
    for (size_t i = 0; i < out.size(); ++i) out[i] = ncall > 0 ? e.sums[i] / float(ncall) : e.sums[i];
    return out;
  }
  const size_t n = e.n_per_row();
  for (size_t k = 0; k < e.n_mat(); ++k) {
    const float count = float(e.counts[k]);
    for (size_t j = 0; j < n; ++j) out[k * n + j] = count > 0 ? e.sums[k * n + j] / count : 1.0f;
  }
  return out;
}

}  // namespace kiln::imatrix
