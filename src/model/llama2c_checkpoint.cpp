#include "model/llama2c_checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "kiln/error.h"
#include "kiln/model.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"

uint64_t n_weights(const Llama2cHeader& h, bool with_classifier) {
  const uint64_t d = (uint64_t)h.dim, f = (uint64_t)h.hidden_dim, L = (uint64_t)h.n_layers;
  const uint64_t hs = d / (uint64_t)h.n_heads, kv = (uint64_t)h.n_kv_heads * hs;
  uint64_t n = (uint64_t)h.vocab_size * d + L * (2 * d + d * d * 2 + 2 * d * kv + 3 * d * f) + d;
  if (with_classifier) n += (uint64_t)h.vocab_size * d;
  return n;
}

bool plausible(const Llama2cHeader& h) {
  return h.dim > 0 && h.hidden_dim > 0 && h.n_layers > 0 && h.n_heads > 0 && h.n_kv_heads > 0 && h.vocab_size > 0 &&
         h.seq_len > 0 && h.dim % h.n_heads == 0 && h.n_heads % h.n_kv_heads == 0 && h.dim <= (1 << 16) &&
         h.hidden_dim <= (1 << 18) && h.n_layers <= 1024 && h.vocab_size <= (1 << 22) && h.seq_len <= (1 << 24);
}

struct Reader {
  std::ifstream in;
  std::string path;
  void read(void* dst, size_t bytes) {
    in.read(static_cast<char*>(dst), (std::streamsize)bytes);
    if (!in) throw Error(path + ": llama2.c checkpoint ends early");
  }
  std::vector<float> f32(uint64_t n) {
    std::vector<float> v(n);
    read(v.data(), n * 4);
    return v;
  }
};

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

bool parse_llama2c_header(const uint8_t* head, size_t got, Llama2cHeader& h) {
  auto i32 = [&](size_t off) {
    int32_t v;
    std::memcpy(&v, head + off, 4);
    return v;
  };
  if (got < 28) return false;
  uint32_t magic;
  std::memcpy(&magic, head, 4);
  if (magic == kMagic) {
    if (got < 256) return false;
    h.version = i32(4);
    h.dim = i32(8), h.hidden_dim = i32(12), h.n_layers = i32(16), h.n_heads = i32(20);
    h.n_kv_heads = i32(24), h.vocab_size = i32(28), h.seq_len = i32(32);
    h.shared_classifier = head[36] != 0;
    h.group_size = h.version == 2 ? i32(37) : 0;
    h.data_offset = 256;
    if ((h.version != 1 && h.version != 2) || !plausible(h)) return false;
    // Scales are read per matrix, so a group must not straddle two of them: every matrix
    // has dim as a factor (export.py halves its group until it divides dim).
    return h.version == 1 || (h.group_size > 0 && h.dim % h.group_size == 0);
  }
  // Legacy: a negative vocabulary size says the classifier is stored separately; the
  // RoPE tables (seq_len x head_size/2, twice) sit between the weights and it.
  h.version = 0;
  h.dim = i32(0), h.hidden_dim = i32(4), h.n_layers = i32(8), h.n_heads = i32(12);
  h.n_kv_heads = i32(16), h.vocab_size = i32(20), h.seq_len = i32(24);
  h.shared_classifier = h.vocab_size > 0;
  // INT32_MIN has no positive counterpart; no real export writes it.
  if (h.vocab_size == std::numeric_limits<int32_t>::min()) return false;
  if (h.vocab_size < 0) h.vocab_size = -h.vocab_size;
  h.data_offset = 28;
  return plausible(h);
}

uint64_t llama2c_file_size(const Llama2cHeader& h) {
  if (h.version == 1) return 256 + 4 * n_weights(h, !h.shared_classifier);
  if (h.version == 2) {
    // Norm weights in float32, every matrix as int8 plus a float32 scale per group.
    const uint64_t d = (uint64_t)h.dim, L = (uint64_t)h.n_layers;
    const uint64_t norms = L * 2 * d + d, q = n_weights(h, !h.shared_classifier) - norms;
    return q % (uint64_t)h.group_size == 0 ? 256 + 4 * norms + q + 4 * (q / (uint64_t)h.group_size) : 0;
  }
  const uint64_t rope = (uint64_t)h.seq_len * (uint64_t)(h.dim / h.n_heads);
  return 28 + 4 * (n_weights(h, !h.shared_classifier) + rope);
}

bool read_llama2c_header(const std::string& path, Llama2cHeader& h) {
  // POSIX read, not an ifstream: every model load asks this first, and a filebuf would
  // allocate 8 KiB even for a 16-byte file (tests/malformed_gguf_test bounds allocations).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  uint8_t head[256] = {};
  size_t got = 0;
  if (::fstat(fd, &st) == 0)
    while (got < sizeof head) {
      const ssize_t n = ::read(fd, head + got, sizeof head - got);
      if (n <= 0) break;
      got += size_t(n);
    }
  ::close(fd);
  return parse_llama2c_header(head, got, h) && uint64_t(st.st_size) == llama2c_file_size(h);
}

gguf::Writer llama2c_to_gguf(const std::string& path, const Vocab& vocab) {
  using gguf::Value;
  Llama2cHeader h;
  if (!read_llama2c_header(path, h)) throw Error(path + ": not a llama2.c checkpoint (legacy, version 1 or 2)");
  if ((int64_t)vocab.size() > h.vocab_size) {
    throw Error(path + ": the tokenizer has " + std::to_string(vocab.size()) + " tokens but the checkpoint only " +
                std::to_string(h.vocab_size));
  }
  const uint64_t d = (uint64_t)h.dim, f = (uint64_t)h.hidden_dim, V = (uint64_t)h.vocab_size;
  const uint64_t hs = d / (uint64_t)h.n_heads, kv = (uint64_t)h.n_kv_heads * hs;
  const int L = h.n_layers;

  Reader r{std::ifstream(path, std::ios::binary), path};
  r.in.seekg((std::streamoff)h.data_offset);
  // A matrix of n values: float32, or (version 2) int8 values followed by their scales.
  auto matrix = [&](uint64_t n) {
    if (h.version != 2) return r.f32(n);
    std::vector<int8_t> q(n);
    r.read(q.data(), n);
    const std::vector<float> scale = r.f32(n / (uint64_t)h.group_size);
    std::vector<float> out(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = (float)q[i] * scale[i / (uint64_t)h.group_size];
    return out;
  };
  auto per_layer = [&](uint64_t n, bool is_matrix) {
    std::vector<std::vector<float>> v;
    for (int l = 0; l < L; ++l) v.push_back(is_matrix ? matrix(n) : r.f32(n));
    return v;
  };

  std::vector<float> embd, final_norm;
  std::vector<std::vector<float>> attn_norm, ffn_norm, wq, wk, wv, wo, w1, w2, w3;
  if (h.version == 0) {
    embd = r.f32(V * d);
    attn_norm = per_layer(d, false);
    wq = per_layer(d * d, true), wk = per_layer(kv * d, true), wv = per_layer(kv * d, true);
    wo = per_layer(d * d, true);
    ffn_norm = per_layer(d, false);
    w1 = per_layer(f * d, true), w2 = per_layer(d * f, true), w3 = per_layer(f * d, true);
    final_norm = r.f32(d);
    r.f32((uint64_t)h.seq_len * hs);  // RoPE tables: kiln computes its own
  } else {
    attn_norm = per_layer(d, false);
    ffn_norm = per_layer(d, false);
    final_norm = r.f32(d);
    embd = matrix(V * d);
    wq = per_layer(d * d, true), wk = per_layer(kv * d, true), wv = per_layer(kv * d, true);
    wo = per_layer(d * d, true);
    w1 = per_layer(f * d, true), w2 = per_layer(d * f, true), w3 = per_layer(f * d, true);
  }
  std::vector<float> output = h.shared_classifier ? embd : matrix(V * d);

  gguf::Writer w;
  w.set("general.architecture", Value::of_string("llama"));
  w.set("general.name", Value::of_string(std::filesystem::path(path).stem().string()));
  w.set("llama.context_length", Value::of_u32((uint32_t)h.seq_len));
  w.set("llama.embedding_length", Value::of_u32((uint32_t)d));
  w.set("llama.feed_forward_length", Value::of_u32((uint32_t)f));
  w.set("llama.attention.head_count", Value::of_u32((uint32_t)h.n_heads));
  w.set("llama.attention.head_count_kv", Value::of_u32((uint32_t)h.n_kv_heads));
  w.set("llama.block_count", Value::of_u32((uint32_t)L));
  w.set("llama.rope.dimension_count", Value::of_u32((uint32_t)hs));
  // run.c's constants: RMSNorm epsilon 1e-5, RoPE base 10000.
  w.set("llama.attention.layer_norm_rms_epsilon", Value::of_f32(1e-5f));
  w.set("llama.rope.freq_base", Value::of_f32(10000.0f));
  write_vocab_gguf(w, vocab);

  // PyTorch's [out][in] row-major matrices are ggml's [in, out]: the bytes carry over.
  const auto F32 = TensorType::F32;
  w.add_tensor("token_embd.weight", F32, {d, V}, bytes_of(embd));
  w.add_tensor("output_norm.weight", F32, {d}, bytes_of(final_norm));
  w.add_tensor("output.weight", F32, {d, V}, bytes_of(output));
  for (int l = 0; l < L; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.add_tensor(b + "attn_q.weight", F32, {d, d}, bytes_of(wq[l]));
    w.add_tensor(b + "attn_k.weight", F32, {d, kv}, bytes_of(wk[l]));
    w.add_tensor(b + "attn_v.weight", F32, {d, kv}, bytes_of(wv[l]));
    w.add_tensor(b + "attn_output.weight", F32, {d, d}, bytes_of(wo[l]));
    w.add_tensor(b + "attn_norm.weight", F32, {d}, bytes_of(attn_norm[l]));
    w.add_tensor(b + "ffn_gate.weight", F32, {d, f}, bytes_of(w1[l]));
    w.add_tensor(b + "ffn_down.weight", F32, {f, d}, bytes_of(w2[l]));
    w.add_tensor(b + "ffn_up.weight", F32, {d, f}, bytes_of(w3[l]));
    w.add_tensor(b + "ffn_norm.weight", F32, {d}, bytes_of(ffn_norm[l]));
  }
  return w;
}

}  // namespace kiln

namespace kiln {

bool Model::is_llama2c(const std::string& path) {
  Llama2cHeader h;
  return read_llama2c_header(path, h);
}

std::unique_ptr<Model> Model::load_llama2c(const std::string& path, std::unique_ptr<Tokenizer> tokenizer,
                                           const LoadParams& params) {
  const gguf::Writer w = llama2c_to_gguf(path, tokenizer->vocab());
  // The GGUF loader maps a file: write the conversion to a temporary one, map it, and
  // unlink it at once (the mapping keeps the pages; nothing is left behind on a crash
  // after this point).
  std::string tmp = (std::filesystem::temp_directory_path() / "kiln-llama2c-XXXXXX").string();
  const int fd = mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file to convert the checkpoint");
  close(fd);
  std::unique_ptr<Model> model;
  try {
    w.write(tmp);
    model = Model::load(tmp, params);
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  std::filesystem::remove(tmp);
  model->replace_tokenizer(std::move(tokenizer));
  return model;
}

}  // namespace kiln
