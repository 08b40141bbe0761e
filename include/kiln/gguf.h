#pragma once
// GGUF (versions 2 and 3) read over a read-only mmap, and written by tools and tests.
// Every count, offset, dimension and length is validated with overflow-safe arithmetic;
// a bad file throws kiln::Error naming the file and the field.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor_type.h"

namespace kiln::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);
size_t scalar_size(ValueType t);  // bytes of one element; 0 for STRING and ARRAY

// One metadata value. Scalars keep their exact type; arrays hold their element type and
// elements (which may be arrays again): read them with size() and at().
struct Value {
  ValueType type = ValueType::UINT32;
  uint64_t u = 0;     // UINT*, BOOL
  int64_t i = 0;      // INT*
  double f = 0;       // FLOAT*
  std::string s;      // STRING
  ValueType elem_type = ValueType::UINT8;  // ARRAY
  // Arrays built in code (of_array) hold a Value per element in `items`. Arrays of scalars
  // and strings read from a file stay packed instead: `packed` holds the elements' bytes
  // as the file stores them (strings: their characters, one after the other, element k
  // in [offsets[k], offsets[k + 1])). A Value per element would take up to 96 times the
  // bytes the file spent on it, and a file could make the reader allocate that much.
  std::vector<Value> items;
  std::string packed;
  std::vector<uint64_t> offsets;

  size_t size() const;         // elements of an ARRAY
  Value at(size_t k) const;    // element k of an ARRAY (k < size())
  std::string_view string_at(size_t k) const;  // element k of an ARRAY of STRING

  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  // Human-readable rendering (arrays abbreviated after `max_items`).
  std::string to_string(size_t max_items = 8) const;

  static Value of_u32(uint32_t v);
  static Value of_i32(int32_t v);
  static Value of_u64(uint64_t v);
  static Value of_f32(float v);
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  static Value of_array(ValueType elem_type, std::vector<Value> items);
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] is the contiguous (row) dimension, as in ggml
  TensorType type = TensorType::F32;
  uint64_t offset = 0;         // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping

  uint64_t rows() const;          // product of dims[1..]
  uint64_t row_bytes() const;     // bytes of one dims[0] row
};

class File {
 public:
  // Maps and validates the whole header and tensor table; throws kiln::Error.
  static std::unique_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // where tensor data starts
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // Throws kiln::Error if the file on disk is no longer the one that was mapped (size,
  // modification time or inode changed): a loader calls it once it has read what it
  // needs, since a file rewritten in place meanwhile may have given it a mix of both.
  void check_unchanged() const;

  // Every lookup of a present key (find, has, get_*) marks it read: unread_keys lists what
  // a loader never asked about, i.e. what it ignores.
  const Value* find(std::string_view key) const;
  std::vector<std::string> unread_keys(std::string_view prefix) const;
  const TensorInfo* find_tensor(std::string_view name) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors: absent key -> fallback (or an error naming the key if required);
  // present with an incompatible type -> an error naming the key and both types.
  uint64_t get_uint(std::string_view key) const;  // required
  uint64_t get_uint(std::string_view key, uint64_t fallback) const;
  // The same, for values that must fit 32 bits (counts and sizes kept as uint32_t): a
  // larger one is an error naming the key, never silently truncated.
  uint32_t get_u32(std::string_view key) const;  // required
  uint32_t get_u32(std::string_view key, uint32_t fallback) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;   // required
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;  // required
  std::string get_string(std::string_view key, const std::string& fallback) const;
  std::vector<std::string> get_string_array(std::string_view key) const;  // required
  std::vector<float> get_float_array(std::string_view key) const;         // empty if absent
  std::vector<int32_t> get_int_array(std::string_view key) const;         // empty if absent

 private:
  File() = default;
  void parse();
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t inode_ = 0, device_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  mutable std::unique_ptr<std::atomic<bool>[]> kv_read_;  // [kv_.size()]
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF v3 file in memory order and writes it. Used by tools/ and tests.
class Writer {
 public:
  void set(const std::string& key, Value value);  // replaces an existing key
  void add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                  std::vector<uint8_t> data);
  void set_alignment(uint64_t alignment);
  // Writes the file; throws kiln::Error on I/O failure.
  void write(const std::string& path) const;
  // The same bytes as write() would produce.
  std::vector<uint8_t> to_bytes() const;

 private:
  std::vector<uint8_t> header_bytes() const;
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
  uint64_t alignment_ = 32;
};

}  // namespace kiln::gguf
