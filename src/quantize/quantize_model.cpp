#include "quantize/quantize_model.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/quant_iq.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/imatrix.h"

namespace kiln::quantize {
namespace {

// llama.cpp's GGML_QNT_VERSION: the block layouts written here (version 2, current since
// 2023). llama-quantize stores it in every file it writes.
constexpr uint32_t kQuantizationVersion = 2;

// Rows converted to floats at a time by one thread: bounds the scratch memory.
constexpr uint64_t kChunkValues = 1 << 16;
// Below this many values per thread, extra threads cost more than they save.
constexpr uint64_t kMinValuesPerThread = 1 << 15;

// n values of a float tensor starting at value `first` -> out.
void to_f32(const gguf::TensorInfo& t, uint64_t first, uint64_t n, float* out) {
  switch (t.type) {
    case TensorType::F32: std::memcpy(out, reinterpret_cast<const float*>(t.data) + first, n * sizeof(float)); return;
    case TensorType::F16: kernels::ops().fp16_to_f32(reinterpret_cast<const uint16_t*>(t.data) + first, out, n); return;
    case TensorType::BF16: kernels::ops().bf16_to_f32(reinterpret_cast<const uint16_t*>(t.data) + first, out, n); return;
    default: break;
  }
  throw Error("tensor '" + t.name + "': cannot read " + type_name(t.type) + " as floats");  // is_float_type was checked
}

uint64_t bytes_of(TensorType type, uint64_t row_length, uint64_t rows) {
  const TypeInfo& info = type_info(type);
  return row_length / info.block_size * info.block_bytes * rows;
}

// Runs work(first_row, end_row) over [0, rows) on up to n_threads threads; the first
// exception any of them throws is rethrown here.
template <class Work>
void for_row_ranges(uint64_t rows, uint64_t row_length, unsigned n_threads, const Work& work) {
  const uint64_t by_size = std::max<uint64_t>(1, rows * row_length / kMinValuesPerThread);
  const unsigned threads = unsigned(std::min<uint64_t>({n_threads, rows, by_size}));
  if (threads <= 1) return work(0, rows);
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      try {
        work(rows * i / threads, rows * (i + 1) / threads);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The tensor converted to `to` (a quantized type, or F16 for the rare fallback).
// importance: nullptr, or a vector of row_length weights per matrix (per expert of a 3-D
// tensor), which each row is fitted with.
std::vector<uint8_t> convert(const gguf::TensorInfo& t, TensorType to, unsigned n_threads, const float* importance) {
  const uint64_t row_length = t.dims[0];
  const uint64_t rows = t.n_elements / row_length;
  const uint64_t rows_per_matrix = t.dims.size() >= 2 ? t.dims[1] : 1;
  const uint64_t row_bytes = bytes_of(to, row_length, 1);
  std::vector<uint8_t> out(row_bytes * rows);
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunkValues / row_length);
  for_row_ranges(rows, row_length, n_threads, [&](uint64_t r0, uint64_t r1) {
    std::vector<float> values(std::min(rows_per_chunk, r1 - r0) * row_length);
    for (uint64_t r = r0, n_rows = 0; r < r1; r += n_rows) {
      n_rows = std::min(rows_per_chunk, r1 - r);
      // A chunk stays within one expert: the experts have importance vectors of their own.
      if (importance) n_rows = std::min(n_rows, rows_per_matrix - r % rows_per_matrix);
      const uint64_t n = n_rows * row_length;
      to_f32(t, r * row_length, n, values.data());
      uint8_t* dst = out.data() + r * row_bytes;
      if (to == TensorType::F16) {
        // Scalar on purpose: round to nearest even exactly as ggml's fp32 -> fp16 row copy.
        for (uint64_t i = 0; i < n; ++i) {
          const uint16_t h = f32_to_fp16(values[i]);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      } else if (importance) {
        kernels::ref::quantize_chunk(to, values.data(), dst, n_rows, row_length,
                                     importance + r / rows_per_matrix * row_length);
      } else {
        // Whole rows of whole blocks: the reference quantizers are row-local, so the
        // bytes do not depend on how rows are split between threads.
        kernels::ref::quantize_chunk(to, values.data(), dst, n_rows, row_length, nullptr);
      }
    }
  });
  return out;
}

// The hyperparameters the mixes read (the legacy presets only the expert count), from the
// <arch>.* keys every family kiln runs writes (choose_types refuses an architecture it has
// no rules for, before using them).
ModelFacts read_facts(const gguf::File& f) {
  ModelFacts m;
  m.arch = f.get_string("general.architecture", "");
  const std::string prefix = m.arch + ".";
  if (!f.has(prefix + "block_count")) return m;
  m.n_layers = uint32_t(f.get_uint(prefix + "block_count"));
  // Hybrids (granitehybrid) give the head counts per layer; llama-quantize's rules read
  // layer 0's, as here.
  const auto layer0 = [&](const std::string& key, uint64_t fallback) -> uint64_t {
    const gguf::Value* v = f.find(key);
    if (v && v->type == gguf::ValueType::ARRAY) {
      if (v->size() == 0 || !v->at(0).is_integer()) throw Error(f.path() + ": " + key + " must hold integers");
      const gguf::Value e = v->at(0);
      return e.i > 0 ? uint64_t(e.i) : e.u;
    }
    return f.get_uint(key, fallback);
  };
  m.n_heads = uint32_t(layer0(prefix + "attention.head_count", 0));
  m.n_kv_heads = uint32_t(layer0(prefix + "attention.head_count_kv", m.n_heads));
  m.n_experts = uint32_t(f.get_uint(prefix + "expert_count", 0));
  return m;
}

// The importance vectors llama-quantize derives from the file, by tensor name, and the
// keys it writes about the file (strings cut at 127 bytes, as its fixed buffers cut them).
std::map<std::string, std::vector<float>> load_importance(const std::string& path, gguf::Writer& w) {
  const imatrix::Imatrix m = imatrix::read(path);
  if (!m.legacy && !m.has_metadata)
    throw Error(path + ": no imatrix.datasets, imatrix.chunk_count or imatrix.chunk_size key (an importance "
                "matrix GGUF has all three)");
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : m.entries) out[name] = imatrix::importance(e, m.legacy);
  const auto cut = [](std::string s) { return s.size() > 127 ? s.substr(0, 127) : s; };
  w.set("quantize.imatrix.file", gguf::Value::of_string(cut(path)));
  if (!m.datasets.empty()) w.set("quantize.imatrix.dataset", gguf::Value::of_string(cut(m.datasets[0])));
  w.set("quantize.imatrix.entries_count", gguf::Value::of_u32(uint32_t(out.size())));
  if (m.chunk_count > 0) w.set("quantize.imatrix.chunks_count", gguf::Value::of_u32(uint32_t(m.chunk_count)));
  return out;
}

// Tensor t's importance vectors, or nullptr when the file has none for it (llama-quantize
// then quantizes it unweighted). An entry of another size is an error, but for the token
// embeddings, which no product reads as a weight matrix.
const float* importance_of(const gguf::TensorInfo& t, const std::map<std::string, std::vector<float>>& importance,
                           const std::string& path) {
  const auto it = importance.find(t.name);
  if (it == importance.end()) return nullptr;
  const uint64_t want = t.dims[0] * (t.dims.size() >= 3 ? t.dims[2] : 1);
  if (it->second.size() == want) return it->second.data();
  if (t.name == "token_embd.weight") return nullptr;
  throw Error(path + ": entry '" + t.name + "' has " + std::to_string(it->second.size()) + " values; the tensor needs " +
              std::to_string(want) + " (an importance matrix of another model?)");
}

}  // namespace

Summary quantize_model(const std::string& input, const std::string& output, const Preset& preset,
                       unsigned n_threads, const Progress& progress, const std::string& imatrix,
                       const TypeOverrides& overrides) {
  std::error_code ec;
  if (std::filesystem::equivalent(input, output, ec))
    throw Error(output + ": is the input file; write the quantized model to another path");
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());

  auto in = gguf::File::open(input);
  std::vector<TensorDesc> descs;
  uint64_t total_in = 0;
  for (const gguf::TensorInfo& t : in->tensors()) {
    descs.push_back({t.name, t.dims, t.type});
    total_in += t.n_bytes;
  }
  std::vector<TypeChoice> choices;
  try {
    choices = choose_types(preset, read_facts(*in), descs, !imatrix.empty(), overrides);
  } catch (const Error& e) {
    throw Error(input + ": " + e.what());
  }

  gguf::Writer w;
  for (const auto& [key, value] : in->metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set("general.quantization_version", gguf::Value::of_u32(kQuantizationVersion));
  w.set("general.file_type", gguf::Value::of_u32(uint32_t(preset.file_type)));
  const std::map<std::string, std::vector<float>> importance =
      imatrix.empty() ? std::map<std::string, std::vector<float>>{} : load_importance(imatrix, w);

  Summary sum;
  sum.n_tensors = in->tensors().size();
  uint64_t done_in = 0;
  for (size_t i = 0; i < in->tensors().size(); ++i) {
    const gguf::TensorInfo& t = in->tensors()[i];
    const TypeChoice& c = choices[i];
    TensorStep step{i, sum.n_tensors, t.name, t.dims, t.type, c.type, c.fell_back, c.note, t.n_bytes, 0, done_in, total_in};
    if (progress.tensor_started) progress.tensor_started(step);

    std::vector<uint8_t> bytes;
    if (c.type == t.type) {
      bytes.assign(t.data, t.data + t.n_bytes);
    } else if (!is_float_type(t.type)) {
      throw Error(input + ": tensor '" + t.name + "' is " + type_name(t.type) +
                  "; quantize from an F32, F16 or BF16 model");
    } else {
      const float* weights = c.type == TensorType::F16 ? nullptr : importance_of(t, importance, imatrix);
      step.weighted = weights != nullptr;
      bytes = convert(t, c.type, n_threads, weights);
      if (c.type != TensorType::F16) ++sum.n_quantized;
      sum.n_weighted += step.weighted;
    }
    step.bytes_out = bytes.size();
    done_in += t.n_bytes;
    sum.bytes_in += t.n_bytes;
    sum.bytes_out += bytes.size();
    sum.n_fell_back += c.fell_back;
    ++sum.output_types[c.type];
    w.add_tensor(t.name, c.type, t.dims, std::move(bytes));
    if (progress.tensor_finished) progress.tensor_finished(step);
  }
  w.write(output);
  return sum;
}

}  // namespace kiln::quantize
