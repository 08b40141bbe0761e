#include <cstring>
#include <sstream>

#include "kiln/gguf.h"

namespace kiln::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

std::string Value::to_string(size_t max_items) const {
  std::ostringstream out;
  switch (type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
      out << u;
      break;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      out << i;
      break;
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      out << f;
      break;
    case ValueType::BOOL:
      out << (u ? "true" : "false");
      break;
    case ValueType::STRING: {
      std::string shown = s.size() > 60 ? s.substr(0, 57) + "..." : s;
      for (char& c : shown)
        if (c == '\n') c = ' ';
      out << '"' << shown << '"';
      break;
    }
    case ValueType::ARRAY: {
      const size_t n = size();
      out << "[" << value_type_name(elem_type) << " x " << n << "]";
      if (n) out << " ";
      for (size_t k = 0; k < n && k < max_items; ++k) out << (k ? ", " : "") << at(k).to_string(max_items);
      if (n > max_items) out << ", ...";
      break;
    }
  }
  return out.str();
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: case ValueType::ARRAY: return 0;
  }
  return 0;
}

size_t Value::size() const {
  if (!items.empty()) return items.size();
  if (elem_type == ValueType::STRING) return offsets.empty() ? 0 : offsets.size() - 1;
  const size_t width = scalar_size(elem_type);
  return width ? packed.size() / width : 0;
}

std::string_view Value::string_at(size_t k) const {
  if (!items.empty()) return items[k].s;
  return std::string_view(packed).substr(offsets[k], offsets[k + 1] - offsets[k]);
}

Value Value::at(size_t k) const {
  if (!items.empty()) return items[k];
  Value v;
  v.type = elem_type;
  if (elem_type == ValueType::STRING) {
    v.s = string_at(k);
    return v;
  }
  const char* p = packed.data() + k * scalar_size(elem_type);
  const auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (elem_type) {
    case ValueType::UINT8: case ValueType::BOOL: v.u = get(uint8_t()); break;
    case ValueType::INT8: v.i = get(int8_t()); break;
    case ValueType::UINT16: v.u = get(uint16_t()); break;
    case ValueType::INT16: v.i = get(int16_t()); break;
    case ValueType::UINT32: v.u = get(uint32_t()); break;
    case ValueType::INT32: v.i = get(int32_t()); break;
    case ValueType::UINT64: v.u = get(uint64_t()); break;
    case ValueType::INT64: v.i = get(int64_t()); break;
    case ValueType::FLOAT32: v.f = get(float()); break;
    case ValueType::FLOAT64: v.f = get(double()); break;
    case ValueType::STRING: case ValueType::ARRAY: break;
  }
  return v;
}

Value Value::of_u32(uint32_t v) { Value x; x.type = ValueType::UINT32; x.u = v; return x; }
Value Value::of_i32(int32_t v) { Value x; x.type = ValueType::INT32; x.i = v; return x; }
Value Value::of_u64(uint64_t v) { Value x; x.type = ValueType::UINT64; x.u = v; return x; }
Value Value::of_f32(float v) { Value x; x.type = ValueType::FLOAT32; x.f = v; return x; }
Value Value::of_bool(bool v) { Value x; x.type = ValueType::BOOL; x.u = v; return x; }
Value Value::of_string(std::string v) { Value x; x.type = ValueType::STRING; x.s = std::move(v); return x; }
Value Value::of_array(ValueType elem_type, std::vector<Value> items) {
  Value x;
  x.type = ValueType::ARRAY;
  x.elem_type = elem_type;
  x.items = std::move(items);
  return x;
}

}  // namespace kiln::gguf
