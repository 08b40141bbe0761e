// GGUF v3 writer: used by the model generator and by tests that build files (good and
// deliberately broken ones) byte by byte.
#include <cstring>
#include <fstream>

#include "kiln/gguf.h"

namespace kiln::gguf {
namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void put_value_body(std::vector<uint8_t>& out, const Value& v, ValueType type) {
  switch (type) {
    case ValueType::UINT8: put<uint8_t>(out, (uint8_t)v.u); break;
    case ValueType::INT8: put<int8_t>(out, (int8_t)v.i); break;
    case ValueType::UINT16: put<uint16_t>(out, (uint16_t)v.u); break;
    case ValueType::INT16: put<int16_t>(out, (int16_t)v.i); break;
    case ValueType::UINT32: put<uint32_t>(out, (uint32_t)v.u); break;
    case ValueType::INT32: put<int32_t>(out, (int32_t)v.i); break;
    case ValueType::UINT64: put<uint64_t>(out, v.u); break;
    case ValueType::INT64: put<int64_t>(out, v.i); break;
    case ValueType::FLOAT32: put<float>(out, (float)v.f); break;
    case ValueType::FLOAT64: put<double>(out, v.f); break;
    case ValueType::BOOL: put<uint8_t>(out, v.u ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.s); break;
    case ValueType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.size());
      if (v.items.empty() && scalar_size(v.elem_type)) {
        out.insert(out.end(), v.packed.begin(), v.packed.end());  // as read from a file
      } else {
        for (size_t k = 0; k < v.size(); ++k) put_value_body(out, v.at(k), v.elem_type);
      }
      break;
  }
}

void pad_to(std::vector<uint8_t>& out, uint64_t alignment) {
  while (out.size() % alignment) out.push_back(0);
}

}  // namespace

void Writer::set(const std::string& key, Value value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(key, std::move(value));
}

void Writer::set_alignment(uint64_t alignment) {
  alignment_ = alignment;
  set("general.alignment", Value::of_u32(static_cast<uint32_t>(alignment)));
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                        std::vector<uint8_t> data) {
  tensors_.push_back({name, type, std::move(dims), std::move(data)});
}

std::vector<uint8_t> Writer::header_bytes() const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, 0x46554747);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [key, v] : kv_) {
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value_body(out, v, v.type);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put<uint64_t>(out, d);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset += t.data.size();
    if (offset % alignment_) offset += alignment_ - offset % alignment_;
  }
  pad_to(out, alignment_);
  return out;
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out = header_bytes();
  for (const PendingTensor& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    pad_to(out, alignment_);
  }
  return out;
}

void Writer::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(path + ": cannot create file");
  // Tensor data is streamed from the pending tensors: a multi-GB model needs no second copy.
  const std::vector<uint8_t> header = header_bytes();
  f.write(reinterpret_cast<const char*>(header.data()), (std::streamsize)header.size());
  const std::vector<char> zeros(alignment_, 0);
  for (const PendingTensor& t : tensors_) {
    f.write(reinterpret_cast<const char*>(t.data.data()), (std::streamsize)t.data.size());
    const uint64_t pad = (alignment_ - t.data.size() % alignment_) % alignment_;
    f.write(zeros.data(), (std::streamsize)pad);
  }
  if (!f) throw Error(path + ": write failed");
}

}  // namespace kiln::gguf
