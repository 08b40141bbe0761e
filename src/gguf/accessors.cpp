// Typed metadata access: the loader asks for what it needs and gets either the value or
// one error naming the file, the key and what was wrong.
#include "kiln/gguf.h"

namespace kiln::gguf {
namespace {

std::string describe(const Value& v) {
  if (v.type == ValueType::ARRAY) return std::string("array of ") + value_type_name(v.elem_type);
  return value_type_name(v.type);
}

}  // namespace

uint64_t File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  if (v->type == ValueType::BOOL) fail("metadata '" + std::string(key) + "' is bool, expected an integer");
  if (v->is_integer()) {
    if (v->type == ValueType::INT8 || v->type == ValueType::INT16 || v->type == ValueType::INT32 ||
        v->type == ValueType::INT64) {
      if (v->i < 0) fail("metadata '" + std::string(key) + "' is negative (" + std::to_string(v->i) + ")");
      return static_cast<uint64_t>(v->i);
    }
    return v->u;
  }
  fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected an integer");
}

uint64_t File::get_uint(std::string_view key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}

uint32_t File::get_u32(std::string_view key) const {
  const uint64_t v = get_uint(key);
  if (v > UINT32_MAX) fail("metadata '" + std::string(key) + "' is " + std::to_string(v) + ", more than 32 bits");
  return uint32_t(v);
}

uint32_t File::get_u32(std::string_view key, uint32_t fallback) const {
  return has(key) ? get_u32(key) : fallback;
}

int64_t File::get_int(std::string_view key, int64_t fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer()) fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected an integer");
  if (v->type == ValueType::UINT64 && v->u > static_cast<uint64_t>(INT64_MAX))
    fail("metadata '" + std::string(key) + "' is out of range");
  const bool is_signed = v->type == ValueType::INT8 || v->type == ValueType::INT16 ||
                         v->type == ValueType::INT32 || v->type == ValueType::INT64;
  return is_signed ? v->i : static_cast<int64_t>(v->u);
}

double File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(get_int(key, 0));
  fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected a number");
}

double File::get_float(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool File::get_bool(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->type != ValueType::BOOL) fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected bool");
  return v->u != 0;
}

std::string File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  if (v->type != ValueType::STRING) fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected string");
  return v->s;
}

std::string File::get_string(std::string_view key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
    fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected array of string");
  std::vector<std::string> out;
  out.reserve(v->size());
  for (size_t k = 0; k < v->size(); ++k) out.emplace_back(v->string_at(k));
  return out;
}

std::vector<float> File::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return {};
  if (v->type != ValueType::ARRAY || !(v->elem_type == ValueType::FLOAT32 || v->elem_type == ValueType::FLOAT64))
    fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected array of float32");
  std::vector<float> out;
  out.reserve(v->size());
  for (size_t k = 0; k < v->size(); ++k) out.push_back(static_cast<float>(v->at(k).f));
  return out;
}

std::vector<int32_t> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return {};
  if (v->type != ValueType::ARRAY || v->size() == 0) {
    if (v->type == ValueType::ARRAY) return {};
    fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected array of integers");
  }
  if (!v->at(0).is_integer())
    fail("metadata '" + std::string(key) + "' is " + describe(*v) + ", expected array of integers");
  std::vector<int32_t> out;
  out.reserve(v->size());
  const bool is_signed = v->elem_type == ValueType::INT8 || v->elem_type == ValueType::INT16 ||
                         v->elem_type == ValueType::INT32 || v->elem_type == ValueType::INT64;
  for (size_t k = 0; k < v->size(); ++k) {
    const Value item = v->at(k);
    const int64_t x = is_signed ? item.i : static_cast<int64_t>(item.u);
    if (x < INT32_MIN || x > INT32_MAX) fail("metadata '" + std::string(key) + "' has an entry out of int32 range");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

}  // namespace kiln::gguf
