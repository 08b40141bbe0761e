// Session: the public facade over the forward pass (runtime/forward.h) and the KV cache
// (runtime/kv_store.h). It checks arguments, keeps the RoPE turn-back for shifts and
// eviction and the H2O scores, and leaves every layout question to the KvStore.
#include "kiln/session.h"

#include <algorithm>
#include <cstring>

#include "runtime/forward.h"
#include "runtime/kv_compaction.h"
#include "runtime/kv_store.h"
#include "runtime/memory_limit.h"
#include "runtime/recurrent_state.h"
#include "runtime/sliding_window.h"
#include "runtime/thread_pool.h"

namespace kiln {
namespace {

// Tiled attention when asked for, or when the cache types leave no other way: values
// stored in blocks cannot be kept transposed, and keys in blocks wider than a head cannot
// be sliced per head by the gemm.
bool use_flash(const ModelConfig& c, const SessionParams& p) {
  const bool k_by_head = KvCache::is_one_value(p.kv_type_k) || c.head_dim % 32 == 0;
  const bool needs_tiled = !KvCache::is_one_value(p.kv_type_v) || !k_by_head;
  if (p.flash_attn == FlashAttention::off && needs_tiled)
    throw Error("KV cache types " + KvCache::type_label(p.kv_type_k) + "/" + KvCache::type_label(p.kv_type_v) +
                " with head dimension " +
                std::to_string(c.head_dim) + " need flash attention (-fa on)");
  const bool flash = p.flash_attn == FlashAttention::on || needs_tiled;
  // Non-causal attention (encoders) is written for the direct path only.
  if (flash && !c.causal)
    throw Error("this model's attention is not causal (an encoder), which tiled attention does not support: "
                "use -fa off with f32, f16 or bf16 cache types");
  return flash;
}

int32_t batch_size(const SessionParams& p, int64_t n_ctx) {
  return int32_t(std::max<int64_t>(1, std::min<int64_t>(p.n_batch > 0 ? p.n_batch : 512, n_ctx)));
}

// The cache's shape (sliding-window layers as rings: runtime/sliding_window.h); its size,
// and that of the other buffers that grow with the context, refused with a clear message
// before any allocation when it could not fit in the memory this process may use.
// Layers that attend (the others are recurrent: runtime/recurrent_state.h). The cache
// holds only these, in model order (runtime/kv_store.h): a model of SSM layers only keeps
// a cache of no layers, which still counts each sequence's positions.
size_t attention_layers(const ModelConfig& c) {
  size_t n = 0;
  for (size_t l = 0; l < c.n_layers; ++l) n += !c.is_ssm(l);
  return n;
}

// The sliding window of every layer, 0 on the recurrent ones ([n_layers]).
std::vector<uint32_t> attention_windows(const ModelConfig& c, const SessionParams& p) {
  std::vector<uint32_t> w = layer_windows(c, p);
  if (!c.causal && std::any_of(w.begin(), w.end(), [](uint32_t x) { return x > 0; }))
    throw Error("sliding-window attention does not work with this model's non-causal attention");
  for (size_t l = 0; l < w.size(); ++l)
    if (c.is_ssm(l)) w[l] = 0;
  return w;
}

// The same windows as the cache indexes its layers: the attention layers' only.
std::vector<uint32_t> cache_windows(const ModelConfig& c, const std::vector<uint32_t>& window) {
  std::vector<uint32_t> w;
  for (size_t l = 0; l < window.size(); ++l)
    if (!c.is_ssm(l)) w.push_back(window[l]);
  return w;
}

KvCache::Shape kv_shape(const ModelConfig& c, const SessionParams& p, const std::vector<uint32_t>& windows) {
  const int64_t n_ctx = p.context_for(c);
  if (n_ctx <= 0) throw Error("context size must be positive (the model's context_length is 0: give -c)");
  const size_t n_attn = attention_layers(c);
  KvCache::Shape s{n_attn, size_t(n_ctx), n_attn ? size_t(c.n_kv_heads) * c.head_dim : 0, n_attn ? c.head_dim : 1,
                   p.kv_type_k, p.kv_type_v, KvCache::is_one_value(p.kv_type_v),
                   // Paged blocks have no rings: a window is then a mask over every position held.
                   n_attn ? layer_capacities(windows, size_t(n_ctx), size_t(batch_size(p, n_ctx)),
                                             p.swa_full || p.kv_layout == KvLayout::paged)
                          : std::vector<size_t>{}};
  use_flash(c, p);  // refuses what only tiled attention could run, with -fa off
  KvCache::check(s);
  const double kv_bytes = KvCache::bytes_for(s);
  const double threads = p.n_threads > 0 ? p.n_threads : physical_core_count();
  // The RoPE table, the attention score rows (without tiled attention) and the list of
  // kept positions also hold a float or an int per position.
  const double per_pos = double(c.n_rot) * 4 + (use_flash(c, p) ? 0 : threads * 64 * 4) + 4;
  const double needed = kv_bytes + per_pos * double(n_ctx);
  const MemoryLimit limit = memory_limit();
  if (limit.bytes > 0 && needed > limit.bytes)
    throw Error("a context of " + std::to_string(n_ctx) + " tokens needs " + human_bytes(needed) + " (KV cache " +
                human_bytes(kv_bytes) + "), more than the " + human_bytes(limit.bytes) + " available (" + limit.what +
                "); lower -c or use a smaller cache type (-ctk/-ctv)");
  return s;
}

// Eviction and attention scores assume every cached position is visible to every query.
void refuse_windows(const std::vector<uint32_t>& window, const char* what) {
  for (uint32_t w : window)
    if (w > 0) throw Error(std::string(what) + " does not work with sliding-window layers yet (use --kv-evict shift)");
}

}  // namespace

struct Session::Impl {
  const Model& model;
  const ModelConfig& c;
  std::vector<uint32_t> window;  // [n_layers] sliding window of each layer (0: global)
  std::vector<uint32_t> kv_window;  // [cache layers] the same for the layers that attend
  KvCache::Shape kv_shape_;      // before the cache: checked and sized first
  int32_t n_ctx, n_batch;
  ThreadPool pool;
  std::unique_ptr<KvStore> kv;
  bool flash;
  RecurrentState recurrent;  // the SSM layers' state per sequence (empty without them)
  // Per sequence, its recurrent state at position pos (-1: none), taken by
  // Session::checkpoint(): what a truncation can go back to.
  struct Checkpoint {
    int32_t pos = -1;
    std::vector<float> state;
  };
  std::vector<Checkpoint> checkpoints;
  Checkpoint& checkpoint_of(int32_t seq) {
    if (size_t(seq) >= checkpoints.size()) checkpoints.resize(size_t(seq) + 1);
    return checkpoints[size_t(seq)];
  }
  void forget_checkpoint(int32_t seq) {
    if (size_t(seq) < checkpoints.size()) checkpoints[size_t(seq)].pos = -1;
  }
  Forward forward;
  std::vector<QuerySpan> spans;  // which sequence and position each row of a batch is
  std::vector<int32_t> batch_tokens;  // decode_batch's parts, one after another
  std::vector<float> logits;     // [n_out][n_vocab]
  // Eviction (runtime/kv_compaction.h): kept positions and one turned-back rotation, reused;
  // with track_attention, the attention each cached position of sequence 0 has received.
  std::vector<int32_t> kept;
  std::vector<float> back_rot;
  ScoreTracking scores;

  Impl(const Model& m, const SessionParams& p)
      : model(m), c(m.config()),
        window(attention_windows(m.config(), p)),
        kv_window(cache_windows(m.config(), window)),
        kv_shape_(kv_shape(m.config(), p, kv_window)),
        n_ctx((int32_t)kv_shape_.n_ctx),
        n_batch(batch_size(p, n_ctx)),
        pool(p.n_threads > 0 ? p.n_threads : physical_core_count()),
        kv(make_kv_store(p.kv_layout, kv_shape_, kv_window, size_t(std::max(p.kv_block, 0)))),
        flash(use_flash(m.config(), p)),
        recurrent(m.config()),
        forward(m, p, kv_window, *kv, pool, n_ctx, n_batch, flash, recurrent) {
    spans.reserve(size_t(n_batch));
    logits.resize(c.n_vocab);
    back_rot.resize(size_t(c.n_rot / 2) * 2);
    kept.reserve(size_t(n_ctx));
  }

  int32_t length(int32_t seq) const { return int32_t(kv->length(seq)); }
  // An encoder (BERT) has no classifier: its sessions give hidden states only
  // (decode_batch_hidden), and asking for logits is an error, not a null matrix.
  void check_classifier() const {
    if (!model.output)
      throw Error(model.file().path() + ": this " + c.arch +
                  " model has no classifier (output.weight) and cannot predict tokens; it computes embeddings "
                  "(kiln embed)");
  }

  // Keeps positions [0, n) of a sequence; recurrent layers go back to its checkpoint
  // when that lies in [.., n], else to nothing (Session::truncate).
  void truncate(int32_t seq, int32_t n) {
    const int32_t len = length(seq);
    if (!recurrent.empty() && n < len) {
      Checkpoint& cp = checkpoint_of(seq);
      if (cp.pos >= 0 && cp.pos <= n) {
        recurrent.restore(seq, cp.state);
        n = cp.pos;
      } else {
        n = 0;
      }
    }
    if (size_t(seq) < checkpoints.size() && n < checkpoints[size_t(seq)].pos) forget_checkpoint(seq);
    kv->truncate(seq, size_t(n));
    if (n == 0) recurrent.clear(seq);
  }

  // Turns a moved key row back by `delta` positions with its layer's table: the pair
  // angles are linear in the position (with every scaling kiln knows), so the table's
  // entry for delta, scaled back to unit length (YaRN folds its magnitude in) and
  // mirrored, undoes it. Rows moving the same distance in layers of the same table share
  // one turn-back. ALiBi and NoPE models need nothing turned. `l` is a cache layer.
  struct TurnBack {
    Impl& s;
    size_t turned_for = 0;
    const std::vector<float>* turned_table = nullptr;
    void operator()(size_t l, float* k_row, size_t delta) {
      if (s.c.positions != Positions::rope || s.c.n_rot == 0) return;
      const size_t half = s.c.n_rot / 2;
      const std::vector<float>& table = s.forward.rope_table(s.forward.model_layer(l));
      if (delta != turned_for || &table != turned_table)
        turn_back(&table[delta * half * 2], half, s.back_rot.data()), turned_for = delta, turned_table = &table;
      kernels::ops().rope(k_row, s.c.n_kv_heads, s.c.head_dim, s.c.n_rot, s.back_rot.data(), s.c.rope_neox);
    }
  };
};

Session::Session(const Model& model, const SessionParams& params) : impl_(std::make_unique<Impl>(model, params)) {}
Session::~Session() = default;

std::span<const float> Session::decode(std::span<const int32_t> tokens, bool all_logits) {
  return decode_sequence(0, tokens, all_logits);
}

std::span<const float> Session::decode_sequence(int32_t seq, std::span<const int32_t> tokens, bool all_logits) {
  Impl& s = *impl_;
  s.check_classifier();
  const size_t n_vocab = s.c.n_vocab;
  if (tokens.empty()) return {};
  const int32_t n_past = s.length(seq);
  if (n_past + tokens.size() > size_t(s.n_ctx))
    throw Error("context is full: " + std::to_string(n_past) + " + " + std::to_string(tokens.size()) +
                " tokens exceed the context size " + std::to_string(s.n_ctx) + " (use -c to raise it)");
  for (int32_t t : tokens)
    if (t < 0 || size_t(t) >= n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");

  s.logits.resize(all_logits ? tokens.size() * n_vocab : n_vocab);
  for (size_t start = 0; start < tokens.size(); start += s.n_batch) {
    const size_t B = std::min<size_t>(s.n_batch, tokens.size() - start);
    const bool last_batch = start + B == tokens.size();
    // Batches before the last only fill the cache unless every row's logits are wanted.
    float* out = all_logits ? &s.logits[start * n_vocab] : last_batch ? s.logits.data() : nullptr;
    s.spans.assign(1, QuerySpan{0, B, s.kv->length(seq), seq});
    // The attention scores are sequence 0's (H2O runs on the one sequence of decode()).
    const auto rows = all_logits ? Forward::LogitRows::all : Forward::LogitRows::last;
    s.forward.run(&tokens[start], s.spans, B, out, rows, seq == 0 && s.scores.on() ? &s.scores : nullptr);
  }
  return {s.logits.data(), s.logits.size()};
}

int32_t Session::n_past() const { return impl_->length(0); }
int32_t Session::n_ctx() const { return impl_->n_ctx; }
int32_t Session::n_batch() const { return impl_->n_batch; }
int32_t Session::n_threads() const { return impl_->pool.size(); }
bool Session::flash_attn() const { return impl_->flash; }
double Session::kv_cache_bytes() const { return impl_->kv->bytes(); }
double Session::kv_cache_layer_bytes(int32_t layer) const { return impl_->kv->layer_bytes(size_t(layer)); }
uint64_t Session::recurrent_state_bytes() const { return impl_->recurrent.sequence_bytes(); }
uint32_t Session::layer_window(int32_t layer) const { return impl_->window.at(size_t(layer)); }
const Model& Session::model() const { return impl_->model; }
KvLayout Session::kv_layout() const { return impl_->kv->layout(); }
KvMemory Session::kv_memory() const { return impl_->kv->memory(); }

void Session::set_matmul_observer(MatmulObserver* observer) { impl_->forward.set_observer(observer); }

// Bits 8..31 of a KV type name the sliding windows (runtime/sliding_window.h): a state
// saved with windows only loads where the same windows mask it, ring or full-size.
std::string Session::kv_type_name(uint32_t kv_type) {
  std::string name = KvCache::state_type_name(kv_type & 0xff);
  if (kv_type >> 8) name += ", sliding windows #" + std::to_string(kv_type >> 8);
  return name;
}

KvStateDesc Session::kv_state_desc(int32_t n_pos) const {
  const KvStore& kv = *impl_->kv;
  KvStateDesc d;
  d.kv_type = kv.state_type() | windows_code(impl_->window) << 8;
  d.n_layers = (uint32_t)kv.format().n_layers;
  d.kv_dim = (uint32_t)kv.format().kv_dim;
  d.n_pos = n_pos;
  d.layer_bytes = n_pos > 0 ? kv.state_layer_bytes(size_t(n_pos)) : 0;
  d.positions = impl_->forward.positions_id();
  d.recurrent_bytes = n_pos > 0 ? impl_->recurrent.sequence_bytes() : 0;
  return d;
}

void Session::write_kv_state(const std::function<void(const void*, size_t)>& sink) const {
  impl_->kv->write_state(0, impl_->kv->length(0), [&](const void* data, size_t bytes) { sink(data, bytes); });
  if (impl_->kv->length(0) > 0) impl_->recurrent.write(0, [&](const void* data, size_t bytes) { sink(data, bytes); });
}

void Session::read_kv_state(const KvStateDesc& desc, const std::function<void(void*, size_t)>& source) {
  Impl& s = *impl_;
  if (desc.n_pos < 0 || desc.n_pos > s.n_ctx)
    throw Error("a saved KV cache of " + std::to_string(desc.n_pos) + " positions does not fit a context of " +
                std::to_string(s.n_ctx));
  if (!(desc == kv_state_desc(desc.n_pos)))
    throw Error("the saved KV cache (" + kv_type_name(desc.kv_type) + ", " + std::to_string(desc.n_layers) +
                " layers of width " + std::to_string(desc.kv_dim) + ") does not match this session's (" +
                kv_type_name(kv_state_desc(0).kv_type) + ", " + std::to_string(s.kv->format().n_layers) +
                " layers of width " + std::to_string(s.kv->format().kv_dim) + "; see -ctk, -ctv, -fa, --swa-*)");
  try {
    s.forget_checkpoint(0);
    s.kv->read_state(0, size_t(desc.n_pos), [&](void* dst, size_t bytes) { source(dst, bytes); });
    if (desc.n_pos > 0) s.recurrent.read(0, [&](void* dst, size_t bytes) { source(dst, bytes); });
    else s.recurrent.clear(0);
    std::fill(s.scores.total.begin(), s.scores.total.end(), 0.0f);  // what the saved tokens received is not saved
  } catch (...) {
    s.truncate(0, 0);
    throw;
  }
}

void Session::read_kv_state(const KvStateDesc& desc, std::span<const uint8_t> data) {
  if (data.size() != desc.bytes())
    throw Error("the saved KV cache has " + std::to_string(data.size()) + " bytes, expected " +
                std::to_string(desc.bytes()));
  size_t at = 0;
  read_kv_state(desc, [&](void* dst, size_t bytes) {
    std::memcpy(dst, data.data() + at, bytes);
    at += bytes;
  });
}

void Session::shift_context(int32_t n_keep, int32_t n_discard) {
  Impl& s = *impl_;
  const int32_t n_past = s.length(0);
  if (n_keep < 0 || n_discard < 0 || int64_t(n_keep) + n_discard > n_past)
    throw Error("cannot shift the context: keep " + std::to_string(n_keep) + ", discard " + std::to_string(n_discard) +
                " of " + std::to_string(n_past) + " positions");
  if (n_discard == 0) return;
  s.forget_checkpoint(0);  // recurrent layers keep their state: it holds no positions to move
  Impl::TurnBack turn{s};
  s.kv->shift(0, size_t(n_keep), size_t(n_discard), [&](size_t l, float* row, size_t delta) { turn(l, row, delta); });
  std::vector<float>& score = s.scores.total;
  if (!score.empty()) std::copy(score.begin() + n_keep + n_discard, score.begin() + n_past, score.begin() + n_keep);
}

void Session::evict(std::span<const int32_t> positions) {
  Impl& s = *impl_;
  refuse_windows(s.window, "KV eviction (sink, h2o)");
  kept_positions(s.length(0), positions, s.kept);
  if (positions.empty()) return;
  s.forget_checkpoint(0);
  Impl::TurnBack turn{s};
  s.kv->compact(0, s.kept.data(), s.kept.size(), [&](size_t l, float* row, size_t delta) { turn(l, row, delta); });
  std::vector<float>& score = s.scores.total;
  if (!score.empty())
    for (size_t i = 0; i < s.kept.size(); ++i) score[i] = score[size_t(s.kept[i])];
}

void Session::track_attention(bool on) {
  Impl& s = *impl_;
  if (on == s.scores.on()) return;
  if (!on) {
    s.scores = {};
    return;
  }
  refuse_windows(s.window, "attention scores (h2o)");
  if (!s.recurrent.empty()) throw Error("attention scores (h2o) need a model whose layers all attend");
  const size_t n_ctx = size_t(s.n_ctx);
  s.scores.total.assign(n_ctx, 0.0f);  // what the cached positions received before is unknown: 0
  s.scores.head_acc.resize(size_t(s.c.n_heads) * n_ctx);
  s.scores.scratch.resize(size_t(s.pool.size()) * attention_score_scratch_floats(n_ctx, s.c.head_dim));
}

std::span<const float> Session::attention_scores() const {
  if (!impl_->scores.on()) return {};
  return {impl_->scores.total.data(), size_t(impl_->length(0))};
}

void Session::truncate(int32_t n) {
  Impl& s = *impl_;
  const int32_t n_past = s.length(0);
  if (n < 0 || n > n_past)
    throw Error("cannot truncate a session of " + std::to_string(n_past) + " tokens to " + std::to_string(n));
  s.truncate(0, n);
}

void Session::checkpoint(int32_t seq) {
  Impl& s = *impl_;
  if (s.recurrent.empty()) return;
  if (!s.kv->alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
  Impl::Checkpoint& cp = s.checkpoint_of(seq);
  s.recurrent.save(seq, cp.state);
  cp.pos = s.length(seq);
}

int32_t Session::fork_sequence(int32_t from) {
  Impl& s = *impl_;
  const int32_t seq = s.kv->fork(from);
  s.recurrent.copy(from, seq);
  // The fork holds the same positions: it can go back where `from` could.
  if (size_t(from) < s.checkpoints.size() && s.checkpoints[size_t(from)].pos >= 0) {
    Impl::Checkpoint& copy = s.checkpoint_of(seq);  // may grow the vector: index `from` after it
    copy = s.checkpoints[size_t(from)];
  } else {
    s.forget_checkpoint(seq);
  }
  return seq;
}
int32_t Session::add_sequence() {
  const int32_t seq = impl_->kv->add_sequence();
  impl_->recurrent.clear(seq);
  impl_->forget_checkpoint(seq);
  return seq;
}

void Session::free_sequence(int32_t seq) {
  impl_->kv->release(seq);
  if (size_t(seq) < impl_->checkpoints.size()) impl_->checkpoints[size_t(seq)] = {};
}

int32_t Session::n_past(int32_t seq) const { return impl_->length(seq); }

void Session::truncate_sequence(int32_t seq, int32_t n) {
  Impl& s = *impl_;
  const int32_t len = s.length(seq);
  if (n < 0 || n > len)
    throw Error("cannot truncate KV sequence " + std::to_string(seq) + " of " + std::to_string(len) + " tokens to " +
                std::to_string(n));
  s.truncate(seq, n);
}

std::span<const float> Session::decode_parallel(std::span<const int32_t> seqs, std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  s.check_classifier();
  const size_t n_vocab = s.c.n_vocab, n = seqs.size();
  if (tokens.size() != n)
    throw Error("decode_parallel: " + std::to_string(n) + " sequences but " + std::to_string(tokens.size()) + " tokens");
  for (size_t i = 0; i < n; ++i) {
    const int32_t seq = seqs[i], t = tokens[i];
    if (!s.kv->alive(seq)) throw Error("KV sequence " + std::to_string(seq) + " does not exist");
    if (std::find(seqs.begin(), seqs.begin() + ptrdiff_t(i), seq) != seqs.begin() + ptrdiff_t(i))
      throw Error("decode_parallel: sequence " + std::to_string(seq) + " is listed twice");
    if (s.kv->length(seq) >= size_t(s.n_ctx))
      throw Error("context is full: sequence " + std::to_string(seq) + " holds " + std::to_string(s.n_ctx) +
                  " tokens, the context size (use -c to raise it)");
    if (t < 0 || size_t(t) >= n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
  }
  s.logits.resize(n * n_vocab);
  for (size_t start = 0; start < n; start += size_t(s.n_batch)) {
    const size_t B = std::min<size_t>(size_t(s.n_batch), n - start);
    s.spans.clear();
    for (size_t i = 0; i < B; ++i) {
      const int32_t seq = seqs[start + i];
      s.spans.push_back({i, 1, s.kv->length(seq), seq});
    }
    s.forward.run(&tokens[start], s.spans, B, &s.logits[start * n_vocab], Forward::LogitRows::all, nullptr);
  }
  return {s.logits.data(), s.logits.size()};
}

namespace {

// decode_batch's checks, then the parts' tokens and spans laid out in `s`; returns the
// batch's token count.
template <typename Impl>
size_t lay_out_batch(Impl& s, std::span<const Session::BatchPart> parts) {
  using BatchPart = Session::BatchPart;
  const size_t n_vocab = s.c.n_vocab;
  size_t B = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const BatchPart& part = parts[i];
    if (!s.kv->alive(part.seq)) throw Error("KV sequence " + std::to_string(part.seq) + " does not exist");
    for (size_t j = 0; j < i; ++j)
      if (parts[j].seq == part.seq) throw Error("decode_batch: sequence " + std::to_string(part.seq) + " is listed twice");
    if (part.tokens.empty()) throw Error("decode_batch: no tokens for sequence " + std::to_string(part.seq));
    if (s.kv->length(part.seq) + part.tokens.size() > size_t(s.n_ctx))
      throw Error("context is full: sequence " + std::to_string(part.seq) + " holds " +
                  std::to_string(s.kv->length(part.seq)) + " tokens and " + std::to_string(part.tokens.size()) +
                  " more exceed the context size " + std::to_string(s.n_ctx));
    for (int32_t t : part.tokens)
      if (t < 0 || size_t(t) >= n_vocab)
        throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
    B += part.tokens.size();
  }
  if (B > size_t(s.n_batch))
    throw Error("decode_batch: " + std::to_string(B) + " tokens exceed the batch size " + std::to_string(s.n_batch));
  s.batch_tokens.clear();
  s.spans.clear();
  for (const BatchPart& part : parts) {
    s.spans.push_back({s.batch_tokens.size(), part.tokens.size(), s.kv->length(part.seq), part.seq, part.all_logits});
    s.batch_tokens.insert(s.batch_tokens.end(), part.tokens.begin(), part.tokens.end());
  }
  return B;
}

}  // namespace

std::span<const float> Session::decode_batch(std::span<const BatchPart> parts) {
  Impl& s = *impl_;
  s.check_classifier();
  const size_t B = lay_out_batch(s, parts);
  if (parts.empty()) return {};
  size_t n_rows = 0;
  for (const BatchPart& part : parts) n_rows += part.all_logits ? part.tokens.size() : 1;
  s.logits.resize(n_rows * s.c.n_vocab);
  s.forward.run(s.batch_tokens.data(), s.spans, B, s.logits.data(), Forward::LogitRows::span_ends, nullptr);
  return {s.logits.data(), s.logits.size()};
}

std::span<const float> Session::decode_batch_hidden(std::span<const BatchPart> parts) {
  Impl& s = *impl_;
  const size_t B = lay_out_batch(s, parts);
  if (parts.empty()) return {};
  s.logits.resize(B * s.c.dim);  // the logits' buffer, which no one reads meanwhile
  s.forward.run(s.batch_tokens.data(), s.spans, B, s.logits.data(), Forward::LogitRows::hidden, nullptr);
  return {s.logits.data(), s.logits.size()};
}

}  // namespace kiln
