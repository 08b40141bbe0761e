// Generic model loading: open the GGUF, let the architecture file fill the config and
// weight views, then check everything the runtime will rely on.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "families/architecture.h"
#include "model/llama2c_checkpoint.h"
#include "util/hash64.h"

namespace kiln {
namespace {

std::string dims_string(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The matrix types the kernel table multiplies, for the error that refuses the others.
std::string supported_weight_types() {
  std::string list = "F32, F16, BF16";
  for (auto* q = kernels::ref::quant_traits_begin(); q != kernels::ref::quant_traits_end(); ++q)
    if (kernels::ops().gemm_supports(q->type)) list += std::string(", ") + q->name;
  return list;
}

uint64_t float_bits(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// Token strings are what give saved token ids their meaning; scores only steer how new
// text is split, so a retuned tokenizer with the same pieces keeps old sessions valid.
uint64_t vocab_hash(const Vocab& v) {
  Hash64 h;
  h.str(v.model);
  h.u64(v.tokens.size());
  for (const std::string& t : v.tokens) h.str(t);
  return h.digest();
}

}  // namespace

WeightView Model::weight(const std::string& name, std::vector<uint64_t> expect_dims, bool required) const {
  const gguf::TensorInfo* t = file_->find_tensor(name);
  if (!t) {
    if (required) throw Error(file_->path() + ": missing tensor '" + name + "'");
    return {};
  }
  bool ok = t->dims.size() == expect_dims.size();
  for (size_t i = 0; ok && i < expect_dims.size(); ++i) ok = expect_dims[i] == 0 || expect_dims[i] == t->dims[i];
  if (!ok) {
    throw Error(file_->path() + ": tensor '" + name + "' has shape " + dims_string(t->dims) +
                ", expected " + dims_string(expect_dims) + " (0 = any) from the metadata");
  }
  if (t->dims.size() == 1 && t->type != TensorType::F32)
    throw Error(file_->path() + ": tensor '" + name + "' is " + type_name(t->type) + "; norm weights must be F32");
  if (t->dims.size() >= 2 && !kernels::ops().gemm_supports(t->type))
    throw Error(file_->path() + ": tensor '" + name + "' has type " + type_name(t->type) +
                ", which kiln cannot compute yet (supported: " + supported_weight_types() + ")");
  WeightView w;
  w.info = t;
  w.type = t->type;
  w.data = t->data;
  w.cols = t->dims[0];
  w.rows = t->rows();
  w.row_bytes = t->row_bytes();
  return w;
}

WeightView row_range(const WeightView& w, uint64_t r0, uint64_t n) {
  WeightView part = w;
  part.data = static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes;
  part.rows = n;
  return part;
}

WeightView element_range(const WeightView& w, uint64_t i0, uint64_t n) {
  WeightView part = w;
  part.data = static_cast<const float*>(w.data) + i0;
  part.cols = n;
  part.row_bytes = n * sizeof(float);
  return part;
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadParams& params) {
  Llama2cHeader l2c;
  if (read_llama2c_header(path, l2c)) {
    throw Error(path + ": a llama2.c checkpoint carries no vocabulary; give its tokenizer with --tokenizer FILE");
  }
  auto model = std::make_unique<Model>();
  model->file_ = gguf::File::open(path);
  const gguf::File& f = *model->file_;
  ModelConfig& c = model->config_;
  c.arch = f.get_string("general.architecture");
  c.name = f.get_string("general.name", std::filesystem::path(path).stem().string());

  const Architecture* arch = find_architecture(c.arch);
  if (!arch) {
    std::string known;
    for (const auto& n : architecture_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(path + ": unsupported architecture '" + c.arch + "' (supported: " + known + ")");
  }
  arch->load(*model);
  const std::string p = c.arch + ".";
  // Every family's, as in llama.cpp: an embedding model's converter writes them whatever
  // its architecture (Qwen3-Embedding is a qwen3 file with pooling_type last).
  c.causal = f.get_bool(p + "attention.causal", true);
  const uint32_t pooling = f.get_u32(p + "pooling_type", 0);
  if (pooling > 3)
    throw Error(path + ": " + p + "pooling_type " + std::to_string(pooling) +
                (pooling == 4 ? " (rank: a reranker's classifier head)" : "") +
                " is not supported (0 none, 1 mean, 2 cls, 3 last)");
  c.pooling = Pooling(pooling);
  c.ignored_keys = f.unread_keys(c.arch + ".");

  if (c.n_layers == 0) throw Error(path + ": " + p + "block_count is 0");
  const bool attends = std::any_of(model->layers.begin(), model->layers.end(), [&](const LayerWeights& L) { return !L.ssm_in; });
  if (attends && (c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads != 0))
    throw Error(path + ": " + p + "attention.head_count " + std::to_string(c.n_heads) +
                " is not a multiple of attention.head_count_kv " + std::to_string(c.n_kv_heads));
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    throw Error(path + ": " + p + "rope.dimension_count " + std::to_string(c.n_rot) +
                " must be even and at most the head size " + std::to_string(c.head_dim));
  if (!(c.rms_eps > 0) || !(c.rope_theta > 0))
    throw Error(path + ": " + p + "layer_norm_rms_epsilon and rope.freq_base must be positive");
  if (c.positions == Positions::alibi && !(c.max_alibi_bias > 0))
    throw Error(path + ": " + p + "attention.max_alibi_bias must be positive for ALiBi");
  if (!(c.clamp_kqv >= 0)) throw Error(path + ": " + p + "attention.clamp_kqv must not be negative");
  if (!(c.attn_softcap >= 0) || !(c.final_softcap >= 0) || !std::isfinite(c.attn_softcap) || !std::isfinite(c.final_softcap))
    throw Error(path + ": " + p + "attn_logit_softcapping and final_logit_softcapping must be positive (or 0: off)");
  if (!(c.rope_theta_swa >= 0) || !std::isfinite(c.rope_theta_swa))
    throw Error(path + ": " + p + "rope.freq_base_swa must be positive");

  model->tokenizer_ = Tokenizer::from_gguf(f);
  if (model->tokenizer_->n_vocab() > (int32_t)c.n_vocab)
    throw Error(path + ": tokenizer has " + std::to_string(model->tokenizer_->n_vocab()) +
                " tokens but token_embd.weight only " + std::to_string(c.n_vocab) + " rows");

  model->vocab_hash_ = vocab_hash(model->tokenizer_->vocab());
  if (params.repack) model->pack_weights(params.repack_experts);

  std::map<TensorType, uint64_t> bytes_by_type;
  for (const auto& t : f.tensors())
    if (t.dims.size() >= 2) bytes_by_type[t.type] += t.n_bytes;
  uint64_t best = 0;
  for (const auto& [type, bytes] : bytes_by_type)
    if (bytes > best) best = bytes, c.weight_type = type;
  if (params.after_read) params.after_read();
  f.check_unchanged();
  return model;
}

void Model::replace_tokenizer(std::unique_ptr<Tokenizer> tokenizer) {
  if (tokenizer->n_vocab() > (int32_t)config_.n_vocab)
    throw Error("tokenizer has " + std::to_string(tokenizer->n_vocab()) + " tokens but the model only " +
                std::to_string(config_.n_vocab));
  tokenizer_ = std::move(tokenizer);
  vocab_hash_ = vocab_hash(tokenizer_->vocab());
}

uint64_t Model::identity() const {
  std::call_once(weights_hash_once_, [this] { weights_hash_ = hash_weights(); });
  const uint64_t parts[2] = {weights_hash_, vocab_hash_};
  return Hash64::of(parts, sizeof parts);
}

// Hashing whole tensors would read the entire file (seconds for GBs); three 4 KiB samples
// per tensor still tell any two independently produced weight files apart, since their
// bytes differ everywhere. The samples are the file's bytes (TensorInfo::data), not the
// packed copies, so packing or not gives the same identity; pages that packing released
// come back from the page cache.
uint64_t Model::hash_weights() const {
  const ModelConfig& c = config_;
  Hash64 h;
  h.str("kiln model identity 1");
  h.str(c.arch);
  for (uint64_t v : {c.n_ctx_train, c.dim, c.n_layers, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim, c.n_rot, c.n_vocab})
    h.u64(v);
  h.u64(float_bits(c.rope_theta));
  h.u64(c.rope_neox);
  h.u64(float_bits(c.rms_eps));
  // Only when present, so that the identity of unscaled models (and their saved sessions)
  // stays what it was; rope_freqs.weight is hashed with the tensors.
  if (c.rope_scaling != RopeScaling::None || c.rope_scale != 1 || c.rope_orig_ctx != 0 || c.rope_attn_factor != 1) {
    h.str(rope_scaling_name(c.rope_scaling));
    for (float v : {c.rope_scale, c.rope_attn_factor}) h.u64(float_bits(v));
    h.u64(c.rope_orig_ctx);
  }
  // Only what departs from Llama's defaults, so that existing identities stay the same.
  if (c.norm != Norm::rms || c.ffn != Ffn::swiglu || c.positions != Positions::rope || c.clamp_kqv != 0) {
    h.u64(static_cast<uint64_t>(c.norm) | static_cast<uint64_t>(c.ffn) << 8 | static_cast<uint64_t>(c.positions) << 16);
    h.u64(float_bits(c.max_alibi_bias));
    h.u64(float_bits(c.clamp_kqv));
  }
  if (c.ffn == Ffn::swiglu_clamped || c.expert_softmax_chosen)
    for (float v : {c.swiglu_alpha, c.swiglu_limit, float(c.expert_softmax_chosen)}) h.u64(float_bits(v));
  if (c.embed_scale != 1 || c.attn_scale != 0 || c.attn_softcap != 0 || c.final_softcap != 0 || c.rope_theta_swa != 0)
    for (float v : {c.embed_scale, c.attn_scale, c.attn_softcap, c.final_softcap, c.rope_theta_swa}) h.u64(float_bits(v));
  if (c.residual_scale != 1 || c.logit_scale != 1 || c.shared_expert_ffn_dim != 0)
    for (float v : {c.residual_scale, c.logit_scale, float(c.shared_expert_ffn_dim)}) h.u64(float_bits(v));
  h.u64(file_->tensors().size());
  constexpr uint64_t kSample = 4096;
  for (const gguf::TensorInfo& t : file_->tensors()) {
    h.str(t.name);
    h.u64(static_cast<uint64_t>(t.type));
    h.u64(t.dims.size());
    for (uint64_t d : t.dims) h.u64(d);
    h.u64(t.n_bytes);
    if (t.n_bytes <= 3 * kSample) {
      h.update(t.data, t.n_bytes);
    } else {
      h.update(t.data, kSample);
      h.update(t.data + (t.n_bytes - kSample) / 2, kSample);
      h.update(t.data + t.n_bytes - kSample, kSample);
    }
  }
  return h.digest();
}

std::string Model::identity_hex() const {
  static const char kDigits[] = "0123456789abcdef";
  const uint64_t id = identity();
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kDigits[(id >> (60 - 4 * i)) & 15];
  return s;
}

Model::PackedArena::~PackedArena() {
  if (base) munmap(base, bytes);
}

// Every matrix the kernels would rather read interleaved is copied into that layout once
// (KILN_PACK=0 keeps every matrix in the file mapping, to measure the difference). The
// file's pages of a moved matrix are then released: the copy replaces them.
void Model::pack_weights(bool experts) {
  const char* env = std::getenv("KILN_PACK");
  if (env && std::string(env) == "0") return;
  const kernels::Ops& ops = kernels::ops();
  std::vector<WeightView*> todo;
  // Float matrices move too, packed where the kernels take them so (AVX-512) and as they
  // are otherwise: from the file's 4 KiB pages into the huge-page arena. Decode streams
  // every weight once per token, and on 4 KiB pages that costs a page walk per 4 KiB (F16 1.1B tg at 2 threads measured 4.3-5.5 -> 11.6 tok/s
  // under the same load).
  // Whether the kernels take a matrix in their packed layout; float matrices they do not
  // take so are copied as they are.
  const auto packs = [&](const WeightView& w) { return ops.packed_bytes(w.type, w.rows, w.cols) > 0; };
  const auto bytes_of = [&](const WeightView& w) -> size_t {
    return packs(w) ? ops.packed_bytes(w.type, w.rows, w.cols) : is_float_type(w.type) ? w.rows * w.row_bytes : 0;
  };
  const auto consider = [&](WeightView& w) {
    if (w && w.info && bytes_of(w) > 0) todo.push_back(&w);
  };
  for (auto& L : layers)
    for (WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.ssm_in, &L.ssm_out, &L.gate_shexp,
                          &L.up_shexp, &L.down_shexp})
      consider(*w);
  if (experts)
    for (auto& L : layers)
      for (auto* matrices : {&L.gate_exps, &L.up_exps, &L.down_exps})
        for (WeightView& w : *matrices) consider(w);
  consider(output);
  if (todo.empty()) return;

  // Memory first (a failure throws here; threads must not), then the copying in parallel.
  std::vector<size_t> offset(todo.size() + 1, 0);
  for (size_t i = 0; i < todo.size(); ++i)
    offset[i + 1] = offset[i] + (bytes_of(*todo[i]) + 63) / 64 * 64;
  constexpr size_t kHugePage = 2 << 20;
  const size_t bytes = (offset.back() + kHugePage - 1) / kHugePage * kHugePage;
  void* base = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    throw Error(file_->path() + ": cannot allocate " + std::to_string(bytes >> 20) + " MiB for the packed weights");
  packed_.base = base, packed_.bytes = bytes + kHugePage;
  // 2 MiB aligned so that transparent huge pages can back it: fewer TLB misses while
  // every token streams all weights, and fewer page faults while packing.
  auto* arena = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage);
  madvise(arena, bytes, MADV_HUGEPAGE);
  std::vector<void*> dst(todo.size());
  for (size_t i = 0; i < todo.size(); ++i) dst[i] = arena + offset[i];
  // A matrix's file pages are released as soon as it is packed (whole pages inside the
  // tensor only: neighbours may still be read), so resident memory never holds both.
  const long page = sysconf(_SC_PAGESIZE);
  const auto release_source = [&](const WeightView& w) {
    if (w.data == token_embd.data) return;  // tied output: the embedding still reads it
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(w.data) + w.rows * w.row_bytes) / page * page;
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  };
  // Work items are row ranges of ~1 MiB of source, so one big matrix (the output
  // projection: a third of the packing time of a Q4_0 file, alone on one thread before)
  // is shared by every thread too. A matrix's source is released by whoever packs its
  // last range.
  struct Piece {
    size_t matrix, r0, r1;
  };
  std::vector<Piece> pieces;
  std::vector<std::atomic<size_t>> rows_left(todo.size());
  for (size_t i = 0; i < todo.size(); ++i) {
    const WeightView& w = *todo[i];
    const size_t step = std::max<size_t>(16, (size_t(1) << 20) / std::max<size_t>(w.row_bytes, 1) / 16 * 16);
    rows_left[i] = w.rows;
    for (size_t r0 = 0; r0 < w.rows; r0 += step) pieces.push_back({i, r0, std::min<size_t>(w.rows, r0 + step)});
  }
  // Mapping a piece's file pages with one call instead of a fault per 64 KiB measured
  // 420-480 -> 370-380 ms for the whole load of a 1.1B Q4_0 (the VM's faults are dear).
  const auto populate = [&](const uint8_t* p, size_t n) {
#ifdef MADV_POPULATE_READ
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
    madvise(reinterpret_cast<void*>(begin), reinterpret_cast<uintptr_t>(p) + n - begin, MADV_POPULATE_READ);
#else
    (void)p, (void)n;
#endif
  };
  std::atomic<size_t> next{0};
  const auto worker = [&] {
    for (size_t p; (p = next.fetch_add(1)) < pieces.size();) {
      const auto [i, r0, r1] = pieces[p];
      const WeightView& w = *todo[i];
      populate(static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes, (r1 - r0) * w.row_bytes);
      if (!packs(w))
        std::memcpy(static_cast<uint8_t*>(dst[i]) + r0 * w.row_bytes, static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes,
                    (r1 - r0) * w.row_bytes);
      else kernels::pack_weights(w.type, w.data, w.row_bytes, w.rows, w.cols, r0, r1, dst[i]);
      if (rows_left[i].fetch_sub(r1 - r0) == r1 - r0) release_source(w);
    }
  };
  const unsigned n_threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();

  for (size_t i = 0; i < todo.size(); ++i) {
    todo[i]->data = dst[i];
    todo[i]->packed = packs(*todo[i]);
  }
}

uint64_t Model::packed_bytes() const { return packed_.bytes; }

uint64_t Model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : file_->tensors()) n += t.n_elements;
  return n;
}

uint64_t Model::weight_bytes() const {
  uint64_t n = 0;
  for (const auto& t : file_->tensors()) n += t.n_bytes;
  return n;
}

uint64_t Model::decode_bytes_per_token() const {
  uint64_t n = weight_bytes();
  // Counting the whole embedding table would overstate a small model's bandwidth several
  // times over: a token reads one row of it, unless it is the classifier too.
  if (token_embd.info && output.info != token_embd.info) n = n - token_embd.info->n_bytes + token_embd.row_bytes;
  for (const LayerWeights& l : layers)
    for (const auto* experts : {&l.gate_exps, &l.up_exps, &l.down_exps})
      if (!experts->empty()) {
        const uint64_t all = experts->front().info->n_bytes;
        n = n - all + all / config_.n_experts * config_.n_experts_used;
      }
  return n;
}

void check_layer_count(const gguf::File& f, const ModelConfig& c) {
  if (c.n_layers > f.tensors().size())
    throw Error(f.path() + ": " + c.arch + ".block_count " + std::to_string(c.n_layers) +
                " is more layers than the file's " + std::to_string(f.tensors().size()) + " tensors could hold");
}

void resize_layers(Model& model) {
  check_layer_count(model.file(), model.config());
  model.layers.resize(model.config().n_layers);
}

void read_block_shape(const gguf::File& f, const std::string& p, ModelConfig& c) {
  c.n_ctx_train = f.get_u32(p + "context_length");
  c.dim = f.get_u32(p + "embedding_length");
  c.n_layers = f.get_u32(p + "block_count");
  c.ffn_dim = f.get_u32(p + "feed_forward_length");
  c.n_heads = f.get_u32(p + "attention.head_count");
  c.n_kv_heads = f.get_u32(p + "attention.head_count_kv", c.n_heads);
  for (const auto& [value, key] : {std::pair{c.dim, "embedding_length"}, {c.ffn_dim, "feed_forward_length"}})
    if (value == 0) throw Error(f.path() + ": " + p + key + " is 0");
}

}  // namespace kiln
