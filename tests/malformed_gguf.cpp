#include "malformed_gguf.h"

#include <cstring>
#include <functional>
#include <stdexcept>

namespace kiln::test {
namespace {

using gguf::Value;
using gguf::ValueType;

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

void put_body(std::vector<uint8_t>& out, const Value& v, ValueType type) {
  switch (type) {
    case ValueType::UINT8: case ValueType::BOOL: put<uint8_t>(out, uint8_t(v.u)); break;
    case ValueType::INT8: put<int8_t>(out, int8_t(v.i)); break;
    case ValueType::UINT16: put<uint16_t>(out, uint16_t(v.u)); break;
    case ValueType::INT16: put<int16_t>(out, int16_t(v.i)); break;
    case ValueType::UINT32: put<uint32_t>(out, uint32_t(v.u)); break;
    case ValueType::INT32: put<int32_t>(out, int32_t(v.i)); break;
    case ValueType::UINT64: put<uint64_t>(out, v.u); break;
    case ValueType::INT64: put<int64_t>(out, v.i); break;
    case ValueType::FLOAT32: put<float>(out, float(v.f)); break;
    case ValueType::FLOAT64: put<double>(out, v.f); break;
    case ValueType::STRING: put_string(out, v.s); break;
    case ValueType::ARRAY:
      put<uint32_t>(out, uint32_t(v.elem_type));
      put<uint64_t>(out, v.size());
      for (size_t k = 0; k < v.size(); ++k) put_body(out, v.at(k), v.elem_type);
      break;
  }
}

template <typename T>
std::vector<uint8_t> raw(T v) {
  std::vector<uint8_t> out;
  put<T>(out, v);
  return out;
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// Deterministic small weights: the base model must load and run, the values do not matter.
std::vector<uint8_t> f32_tensor(size_t n, uint32_t seed, bool ones) {
  std::vector<uint8_t> out;
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    put<float>(out, ones ? 1.0f : (float(s >> 8) / float(1 << 24) - 0.5f) * 0.2f);
  }
  return out;
}

}  // namespace

std::vector<uint8_t> encode_value(const Value& v) {
  std::vector<uint8_t> out;
  put_body(out, v, v.type);
  return out;
}

std::vector<uint8_t> RawGguf::bytes(Layout* layout) const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, magic);
  put<uint32_t>(out, version);
  put<uint64_t>(out, override_counts ? n_tensors : tensors.size());
  put<uint64_t>(out, override_counts ? n_kv : kv.size());
  if (layout) layout->kv_begin = out.size();
  for (const Kv& k : kv) {
    put_string(out, k.key);
    put<uint32_t>(out, k.type);
    out.insert(out.end(), k.body.begin(), k.body.end());
  }
  if (layout) layout->tensors_begin = out.size();
  for (const Tensor& t : tensors) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.dims.size()));
    for (uint64_t d : t.dims) put<uint64_t>(out, d);
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, t.offset);
  }
  const uint64_t align = alignment ? alignment : 1;
  while (out.size() % align) out.push_back(0);
  if (layout) layout->data_begin = out.size();
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

RawGguf::Kv* RawGguf::find(const std::string& key) {
  for (Kv& k : kv)
    if (k.key == key) return &k;
  return nullptr;
}

RawGguf::Tensor* RawGguf::tensor(const std::string& name) {
  for (Tensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void RawGguf::set(const std::string& key, const Value& v) {
  Kv k{key, uint32_t(v.type), encode_value(v)};
  if (Kv* old = find(key)) *old = std::move(k);
  else kv.push_back(std::move(k));
}

void RawGguf::erase(const std::string& key) {
  std::erase_if(kv, [&](const Kv& k) { return k.key == key; });
}

void RawGguf::erase_tensor(const std::string& name) {
  std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; });
}

void RawGguf::add_f32_tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t seed) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  while (data.size() % alignment) data.push_back(0);
  const std::vector<uint8_t> bytes = f32_tensor(n, seed, dims.size() == 1);
  tensors.push_back({name, std::move(dims), uint32_t(TensorType::F32), data.size()});
  data.insert(data.end(), bytes.begin(), bytes.end());
}

RawGguf base_model(const gguf::File& vocab) {
  RawGguf g;
  g.set("general.architecture", Value::of_string("llama"));
  g.set("general.name", Value::of_string("malformed-base"));
  g.set("llama.context_length", Value::of_u32(64));
  g.set("llama.embedding_length", Value::of_u32(8));
  g.set("llama.block_count", Value::of_u32(1));
  g.set("llama.feed_forward_length", Value::of_u32(16));
  g.set("llama.attention.head_count", Value::of_u32(2));
  g.set("llama.attention.head_count_kv", Value::of_u32(1));
  g.set("llama.attention.layer_norm_rms_epsilon", Value::of_f32(1e-5f));
  g.set("llama.rope.dimension_count", Value::of_u32(4));
  for (const auto& [key, value] : vocab.metadata())
    if (key.rfind("tokenizer.ggml.", 0) == 0) g.set(key, value);
  const uint64_t n_vocab = vocab.get_string_array("tokenizer.ggml.tokens").size();

  uint32_t seed = 0;
  const auto add = [&](const std::string& name, std::vector<uint64_t> dims) { g.add_f32_tensor(name, std::move(dims), ++seed); };
  add("token_embd.weight", {8, n_vocab});
  add("output_norm.weight", {8});
  add("output.weight", {8, n_vocab});
  add("blk.0.attn_norm.weight", {8});
  add("blk.0.attn_q.weight", {8, 8});
  add("blk.0.attn_k.weight", {8, 4});
  add("blk.0.attn_v.weight", {8, 4});
  add("blk.0.attn_output.weight", {8, 8});
  add("blk.0.ffn_norm.weight", {8});
  add("blk.0.ffn_gate.weight", {8, 16});
  add("blk.0.ffn_up.weight", {8, 16});
  add("blk.0.ffn_down.weight", {16, 8});
  return g;
}

RawGguf moe_model(const gguf::File& vocab) {
  RawGguf g = base_model(vocab);
  g.set("llama.expert_count", Value::of_u32(4));
  g.set("llama.expert_used_count", Value::of_u32(2));
  for (const char* t : {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"}) g.erase_tensor(t);
  g.add_f32_tensor("blk.0.ffn_gate_inp.weight", {8, 4}, 101);
  g.add_f32_tensor("blk.0.ffn_gate_exps.weight", {8, 16, 4}, 102);
  g.add_f32_tensor("blk.0.ffn_up_exps.weight", {8, 16, 4}, 103);
  g.add_f32_tensor("blk.0.ffn_down_exps.weight", {16, 8, 4}, 104);
  return g;
}

RawGguf mamba2_model(const gguf::File& vocab) {
  RawGguf g;
  g.set("general.architecture", Value::of_string("mamba2"));
  g.set("general.name", Value::of_string("malformed-mamba2"));
  g.set("mamba2.context_length", Value::of_u32(64));
  g.set("mamba2.embedding_length", Value::of_u32(8));
  g.set("mamba2.block_count", Value::of_u32(1));
  g.set("mamba2.feed_forward_length", Value::of_u32(0));
  g.set("mamba2.attention.head_count", Value::of_u32(0));
  g.set("mamba2.ssm.conv_kernel", Value::of_u32(4));
  g.set("mamba2.ssm.inner_size", Value::of_u32(16));
  g.set("mamba2.ssm.state_size", Value::of_u32(4));
  g.set("mamba2.ssm.time_step_rank", Value::of_u32(4));
  g.set("mamba2.ssm.group_count", Value::of_u32(2));
  g.set("mamba2.attention.layer_norm_rms_epsilon", Value::of_f32(1e-5f));
  for (const auto& [key, value] : vocab.metadata())
    if (key.rfind("tokenizer.ggml.", 0) == 0) g.set(key, value);
  const uint64_t n_vocab = vocab.get_string_array("tokenizer.ggml.tokens").size();
  uint32_t seed = 200;
  const auto add = [&](const std::string& name, std::vector<uint64_t> dims) { g.add_f32_tensor(name, std::move(dims), ++seed); };
  add("token_embd.weight", {8, n_vocab});
  add("output_norm.weight", {8});
  add("blk.0.attn_norm.weight", {8});
  add("blk.0.ssm_in.weight", {8, 16 + 32 + 4});  // z, xBC (16 + 2 groups x 2 x 4), dt
  add("blk.0.ssm_conv1d.weight", {4, 32});
  add("blk.0.ssm_conv1d.bias", {32});
  add("blk.0.ssm_dt.bias", {4});
  add("blk.0.ssm_a", {1, 4});
  add("blk.0.ssm_d", {1, 4});
  add("blk.0.ssm_norm.weight", {8, 2});
  add("blk.0.ssm_out.weight", {16, 8});
  return g;
}

std::vector<MalformedCase> malformed_gguf_cases(const gguf::File& vocab) {
  const RawGguf base = base_model(vocab);
  RawGguf::Layout layout;
  const std::vector<uint8_t> good = base.bytes(&layout);
  std::vector<MalformedCase> cases;

  // A case made by editing the fields, or the serialized bytes.
  const auto edit = [&](std::string name, std::vector<std::string> expect, const std::function<void(RawGguf&)>& f) {
    RawGguf g = base;
    f(g);
    cases.push_back({std::move(name), g.bytes(), std::move(expect)});
  };
  const auto bytes = [&](std::string name, std::vector<std::string> expect, std::vector<uint8_t> b) {
    cases.push_back({std::move(name), std::move(b), std::move(expect)});
  };
  const auto prefix = [&](size_t n) { return std::vector<uint8_t>(good.begin(), good.begin() + long(n)); };
  const auto tensor_at = [&](RawGguf& g, const char* name) -> RawGguf::Tensor& {
    RawGguf::Tensor* t = g.tensor(name);
    if (!t) throw std::logic_error(std::string("base model has no ") + name);
    return *t;
  };
  constexpr uint64_t kHuge = ~uint64_t(0);

  // Header.
  bytes("empty", {"too small"}, {});
  bytes("cut-in-header", {"too small"}, prefix(16));
  edit("bad-magic", {"bad magic"}, [](RawGguf& g) { g.magic = 0x46554748; });
  edit("version-1", {"version 1"}, [](RawGguf& g) { g.version = 1; });
  edit("version-4", {"unsupported GGUF version 4"}, [](RawGguf& g) { g.version = 4; });
  edit("big-endian", {"big-endian"}, [](RawGguf& g) { g.version = 0x03000000; });
  edit("tensor-count-2^64", {"tensor count 18446744073709551615"}, [](RawGguf& g) {
    g.override_counts = true, g.n_tensors = kHuge, g.n_kv = g.kv.size();
  });
  edit("kv-count-2^64", {"metadata count 18446744073709551608", "cannot fit"}, [](RawGguf& g) {
    g.override_counts = true, g.n_tensors = g.tensors.size(), g.n_kv = kHuge - 7;
  });
  // One key more than there are: the first tensor's name is read as a key, its tensor
  // count as the key's type, and what follows runs past the end.
  edit("kv-count-too-many", {"truncated"}, [](RawGguf& g) {
    g.override_counts = true, g.n_tensors = g.tensors.size(), g.n_kv = g.kv.size() + 1;
  });

  // Truncated inside every section.
  bytes("cut-after-header", {"metadata count 19 cannot fit in the file"}, prefix(layout.kv_begin + 5));
  bytes("cut-in-metadata", {"metadata", "truncated"}, prefix((layout.kv_begin + layout.tensors_begin) / 2));
  bytes("cut-in-tensor-table", {"tensor", "truncated"}, prefix((layout.tensors_begin + layout.data_begin) / 2));
  bytes("cut-before-data", {"past the end of the file"}, prefix(layout.data_begin - 1));
  bytes("cut-in-data", {"tensor 'blk.0.ffn_down.weight'", "past end of file"}, prefix(good.size() - 100));

  // Lengths and counts past the end.
  const auto patched = [&](size_t at, uint64_t v) {
    std::vector<uint8_t> b = good;
    poke<uint64_t>(b, at, v);
    return b;
  };
  // The first key's length is the first field after the counts.
  bytes("key-length-2^64", {"metadata key #0", "truncated"}, patched(layout.kv_begin, kHuge));
  edit("string-length-past-end", {"'general.name'", "truncated"}, [&](RawGguf& g) {
    g.find("general.name")->body = raw<uint64_t>(good.size());
  });
  edit("array-count-2^62", {"'tokenizer.ggml.scores'", "cannot fit"}, [](RawGguf& g) {
    poke<uint64_t>(g.find("tokenizer.ggml.scores")->body, 4, uint64_t(1) << 62);
  });
  edit("array-string-length-past-end", {"'tokenizer.ggml.tokens'", "truncated"}, [&](RawGguf& g) {
    poke<uint64_t>(g.find("tokenizer.ggml.tokens")->body, 12, uint64_t(good.size()));
  });
  bytes("tensor-name-length-past-end", {"tensor #0 name", "truncated"}, patched(layout.tensors_begin, uint64_t(1) << 40));

  // Metadata that cannot be right.
  edit("empty-key", {"metadata key #", "is empty"}, [](RawGguf& g) { g.kv.push_back({"", uint32_t(ValueType::UINT32), raw<uint32_t>(1)}); });
  edit("duplicate-key", {"'llama.block_count' appears twice"}, [](RawGguf& g) {
    g.kv.push_back({"llama.block_count", uint32_t(ValueType::UINT32), raw<uint32_t>(1)});
  });
  edit("unknown-value-type", {"'general.name'", "unknown value type 13"}, [](RawGguf& g) { g.find("general.name")->type = 13; });
  edit("unknown-array-element-type", {"'tokenizer.ggml.scores'", "unknown array element type 99"}, [](RawGguf& g) {
    poke<uint32_t>(g.find("tokenizer.ggml.scores")->body, 0, 99);
  });
  edit("bool-not-0-or-1", {"'tokenizer.ggml.add_bos_token'", "bool value 2"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.add_bos_token", Value::of_bool(true));
    g.find("tokenizer.ggml.add_bos_token")->body = {2};
  });
  edit("arrays-nested-too-deep", {"'general.deep'", "nested deeper"}, [](RawGguf& g) {
    Value deep = Value::of_array(ValueType::UINT8, {});
    for (int i = 0; i < 10; ++i) deep = Value::of_array(ValueType::ARRAY, {deep});
    g.set("general.deep", deep);
  });
  edit("alignment-not-power-of-two", {"general.alignment 48", "power of two"}, [](RawGguf& g) {
    g.set("general.alignment", Value::of_u32(48));
  });
  edit("alignment-zero", {"general.alignment 0", "power of two"}, [](RawGguf& g) { g.set("general.alignment", Value::of_u32(0)); });
  edit("alignment-wrong-type", {"general.alignment must be uint32"}, [](RawGguf& g) {
    g.set("general.alignment", Value::of_u64(32));
  });

  // Tensor table.
  edit("tensor-0-dims", {"tensor 'output_norm.weight' has 0 dimensions"}, [&](RawGguf& g) { tensor_at(g, "output_norm.weight").dims = {}; });
  edit("tensor-5-dims", {"tensor 'output_norm.weight' has 5 dimensions"}, [&](RawGguf& g) {
    tensor_at(g, "output_norm.weight").dims = {8, 1, 1, 1, 1};
  });
  edit("tensor-dim-zero", {"tensor 'blk.0.attn_q.weight' dimension 1 is 0"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_q.weight").dims = {8, 0};
  });
  edit("tensor-dim-2^64", {"tensor 'blk.0.attn_q.weight' dimension 0", "absurd"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_q.weight").dims = {kHuge, 8};
  });
  edit("tensor-dims-product-overflows", {"tensor 'blk.0.attn_q.weight' has too many elements"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_q.weight").dims = {uint64_t(1) << 32, uint64_t(1) << 32, uint64_t(1) << 32};
  });
  edit("tensor-unknown-type", {"tensor 'blk.0.attn_k.weight' has unknown tensor type 99"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_k.weight").type = 99;
  });
  edit("tensor-row-not-whole-blocks", {"tensor 'blk.0.attn_k.weight'", "Q4_0 block size 32"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_k.weight").type = uint32_t(TensorType::Q4_0);
  });
  edit("tensor-mxfp4-row-not-whole-blocks", {"tensor 'blk.0.attn_k.weight'", "MXFP4 block size 32"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_k.weight").type = uint32_t(TensorType::MXFP4);
  });
  edit("duplicate-tensor", {"tensor 'blk.0.attn_q.weight' appears twice"}, [&](RawGguf& g) {
    g.tensors.push_back(tensor_at(g, "blk.0.attn_q.weight"));
  });
  edit("tensor-misaligned", {"tensor 'blk.0.attn_v.weight' data offset", "not a multiple of the alignment 32"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_v.weight").offset += 4;
  });
  edit("tensor-out-of-bounds", {"tensor 'blk.0.attn_v.weight'", "past end of file"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_v.weight").offset = g.data.size();
  });
  edit("tensor-offset-overflows", {"tensor 'blk.0.attn_v.weight'", "past end of file"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_v.weight").offset = kHuge - 31;
  });
  edit("tensor-larger-than-file", {"tensor 'blk.0.ffn_down.weight'", "past end of file"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.ffn_down.weight").dims = {16, 8000};
  });
  edit("tensors-overlap", {"tensor 'blk.0.attn_k.weight'", "overlaps", "'blk.0.attn_q.weight'"}, [&](RawGguf& g) {
    tensor_at(g, "blk.0.attn_k.weight").offset = tensor_at(g, "blk.0.attn_q.weight").offset + 32;
  });

  // A file that parses but is no model kiln can run.
  edit("missing-architecture", {"missing metadata key 'general.architecture'"}, [](RawGguf& g) { g.erase("general.architecture"); });
  edit("unknown-architecture", {"unsupported architecture 'gpt-9'"}, [](RawGguf& g) {
    g.set("general.architecture", Value::of_string("gpt-9"));
  });
  edit("missing-block-count", {"missing metadata key 'llama.block_count'"}, [](RawGguf& g) { g.erase("llama.block_count"); });
  edit("block-count-string", {"'llama.block_count' is string, expected an integer"}, [](RawGguf& g) {
    g.set("llama.block_count", Value::of_string("one"));
  });
  edit("block-count-2^32-1", {"llama.block_count 4294967295"}, [](RawGguf& g) {
    g.set("llama.block_count", Value::of_u32(~0u));
  });
  edit("block-count-2^32-1-sliding-window", {"llama.block_count 4294967295"}, [](RawGguf& g) {
    g.set("llama.block_count", Value::of_u32(~0u));
    g.set("llama.attention.sliding_window", Value::of_u32(16));  // per-layer windows come first
  });
  edit("block-count-past-32-bits", {"'llama.block_count' is 4294967297"}, [](RawGguf& g) {
    g.set("llama.block_count", Value::of_u64((uint64_t(1) << 32) + 1));
  });
  edit("embedding-length-past-32-bits", {"'llama.embedding_length' is 4294967304"}, [](RawGguf& g) {
    g.set("llama.embedding_length", Value::of_u64((uint64_t(1) << 32) + 8));
  });
  edit("head-count-zero", {"attention.head_count 0"}, [](RawGguf& g) { g.set("llama.attention.head_count", Value::of_u32(0)); });
  edit("head-count-kv-zero", {"attention.head_count_kv 0"}, [](RawGguf& g) {
    g.set("llama.attention.head_count_kv", Value::of_u32(0));
  });
  edit("ffn-length-zero", {"llama.feed_forward_length is 0"}, [](RawGguf& g) {
    g.set("llama.feed_forward_length", Value::of_u32(0));
  });
  edit("key-length-zero", {"llama.attention.key_length is 0"}, [](RawGguf& g) {
    g.set("llama.attention.key_length", Value::of_u32(0));
  });
  edit("embedding-disagrees-with-tensor", {"tensor 'token_embd.weight' has shape [8, 512], expected [16, 0]"}, [](RawGguf& g) {
    g.set("llama.embedding_length", Value::of_u32(16));
  });
  edit("missing-tensor", {"missing tensor 'blk.0.attn_q.weight'"}, [](RawGguf& g) { g.erase_tensor("blk.0.attn_q.weight"); });
  edit("output-vocab-disagrees", {"tensor 'output.weight' has shape [8, 256], expected [8, 512]"}, [&](RawGguf& g) {
    tensor_at(g, "output.weight").dims = {8, 256};
  });
  edit("missing-tokens", {"missing metadata key 'tokenizer.ggml.tokens'"}, [](RawGguf& g) { g.erase("tokenizer.ggml.tokens"); });
  edit("tokens-not-strings", {"'tokenizer.ggml.tokens' is array of uint32, expected array of string"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.tokens", Value::of_array(ValueType::UINT32, {Value::of_u32(1)}));
  });
  edit("vocab-larger-than-embedding", {"tokenizer has 512 tokens but token_embd.weight only 256 rows"}, [&](RawGguf& g) {
    tensor_at(g, "token_embd.weight").dims = {8, 256};
    tensor_at(g, "output.weight").dims = {8, 256};
  });
  edit("bos-id-out-of-range", {"tokenizer.ggml.bos_token_id is 512, outside the vocabulary of 512 tokens"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.bos_token_id", Value::of_u32(512));
  });
  edit("eos-id-negative", {"tokenizer.ggml.eos_token_id is -7, outside the vocabulary"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.eos_token_id", Value::of_i32(-7));
  });
  edit("token-type-unknown", {"tokenizer.ggml.token_type[3] is 9"}, [](RawGguf& g) {
    poke<int32_t>(g.find("tokenizer.ggml.token_type")->body, 12 + 3 * 4, 9);
  });
  edit("scores-count-disagrees", {"tokenizer.ggml.scores has 1 entries, tokens has 512"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.scores", Value::of_array(ValueType::FLOAT32, {Value::of_f32(0)}));
  });
  edit("tokenizer-model-unknown", {"tokenizer.ggml.model 'wordpiece-9' is not supported"}, [](RawGguf& g) {
    g.set("tokenizer.ggml.model", Value::of_string("wordpiece-9"));
  });

  // Mixture of experts: counts that disagree with each other or with the tensors.
  const RawGguf moe = moe_model(vocab);
  const auto moe_edit = [&](std::string name, std::vector<std::string> expect, const std::function<void(RawGguf&)>& f) {
    RawGguf g = moe;
    f(g);
    cases.push_back({std::move(name), g.bytes(), std::move(expect)});
  };
  moe_edit("expert-used-past-count", {"llama.expert_used_count is 5, expected 1 to llama.expert_count (4)"},
           [](RawGguf& g) { g.set("llama.expert_used_count", Value::of_u32(5)); });
  moe_edit("expert-used-zero", {"llama.expert_used_count is 0"}, [](RawGguf& g) { g.set("llama.expert_used_count", Value::of_u32(0)); });
  moe_edit("expert-count-zero", {"llama.expert_count is 0, expected 1 to 4096"}, [](RawGguf& g) {
    g.set("llama.expert_count", Value::of_u32(0));
  });
  moe_edit("expert-count-2^31", {"llama.expert_count is 2147483648"}, [](RawGguf& g) {
    g.set("llama.expert_count", Value::of_u32(1u << 31));
  });
  moe_edit("expert-count-disagrees-with-router", {"tensor 'blk.0.ffn_gate_inp.weight' has shape [8, 4], expected [8, 8]"},
           [](RawGguf& g) { g.set("llama.expert_count", Value::of_u32(8)); });
  moe_edit("expert-tensor-2d", {"tensor 'blk.0.ffn_up_exps.weight' has shape [8, 64], expected [8, 16, 4]"},
           [&](RawGguf& g) { tensor_at(g, "blk.0.ffn_up_exps.weight").dims = {8, 64}; });
  moe_edit("expert-width-disagrees", {"tensor 'blk.0.ffn_gate_exps.weight' has shape [8, 16, 4], expected [8, 32, 4]"},
           [](RawGguf& g) { g.set("llama.expert_feed_forward_length", Value::of_u32(32)); });
  moe_edit("expert-router-missing", {"missing tensor 'blk.0.ffn_gate_inp.weight'"}, [](RawGguf& g) {
    g.erase_tensor("blk.0.ffn_gate_inp.weight");
  });

  // Mamba-2: SSM sizes that disagree with each other or with the tensors.
  const RawGguf mamba = mamba2_model(vocab);
  const auto mamba_edit = [&](std::string name, std::vector<std::string> expect, const std::function<void(RawGguf&)>& f) {
    RawGguf g = mamba;
    f(g);
    cases.push_back({std::move(name), g.bytes(), std::move(expect)});
  };
  mamba_edit("ssm-state-size-missing", {"mamba2.ssm.state_size"}, [](RawGguf& g) { g.erase("mamba2.ssm.state_size"); });
  mamba_edit("ssm-groups-not-dividing-heads", {"mamba2.ssm.group_count is 3, expected a divisor of ssm.time_step_rank 4"},
             [](RawGguf& g) { g.set("mamba2.ssm.group_count", Value::of_u32(3)); });
  mamba_edit("ssm-heads-zero", {"mamba2.ssm.time_step_rank is 0"}, [](RawGguf& g) { g.set("mamba2.ssm.time_step_rank", Value::of_u32(0)); });
  mamba_edit("ssm-conv-kernel-huge", {"mamba2.ssm.conv_kernel is 65, expected 1 to 64"},
             [](RawGguf& g) { g.set("mamba2.ssm.conv_kernel", Value::of_u32(65)); });
  mamba_edit("ssm-inner-disagrees", {"tensor 'blk.0.ssm_in.weight' has shape [8, 52], expected [8, 68]"},
             [](RawGguf& g) { g.set("mamba2.ssm.inner_size", Value::of_u32(24)); });
  mamba_edit("ssm-d-missing", {"missing tensor 'blk.0.ssm_d'"}, [](RawGguf& g) { g.erase_tensor("blk.0.ssm_d"); });
  mamba_edit("ssm-with-attention-heads", {"mamba2.attention.head_count is 2; a mamba2 block has no FFN or attention"},
             [](RawGguf& g) { g.set("mamba2.attention.head_count", Value::of_u32(2)); });
  for (MalformedCase& c : granite_hybrid_cases(vocab)) cases.push_back(std::move(c));
  return cases;
}

}  // namespace kiln::test
