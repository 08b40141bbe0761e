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
      out << "[" << value_type_name(elem_type) << " x " << items.size() << "]";
      if (!items.empty()) out << " ";
      for (size_t k = 0; k < items.size() && k < max_items; ++k)
        out << (k ? ", " : "") << items[k].to_string(max_items);
      if (items.size() > max_items) out << ", ...";
      break;
    }
  }
  return out.str();
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
