#pragma once
// One KV-cache interface under every feature: the forward pass, attention, truncation,
// context shifts, eviction, attention scores (H2O), session files and parallel sequences
// all go through KvStore, whichever layout holds the rows (make_kv_store picks it):
//
//   contiguous  KvCache: one preallocated run of n_ctx positions per layer (rings for
//               sliding-window layers), one sequence (0); fork refuses.
//   paged       PagedKv: blocks of positions taken on demand through a block table per
//               sequence, shared by forks (copy-on-write); no sliding-window rings (a
//               window is a mask over every position held, as with --swa-full).
//
// Why an abstract class and not a variant: the callers (Session, Attention, the score
// pass) then hold one reference and never switch on the layout, and a third layout (a
// server's prefix cache) is one more subclass. The price is a virtual call per *run* of
// positions stored contiguously (one per range on the contiguous layout, two when a ring
// wraps, one per block when paged), never per key row: Attention's gemms, the score pass
// and the state copies work on whole runs.
//
// Layers are the model's attention layers, in order, and only those: a hybrid's recurrent
// (Mamba-2) layers keep their state beside the cache (runtime/recurrent_state.h) and have
// no cache layer, so cache layer i is the i-th layer that attends (Forward::model_layer
// maps back). A model of recurrent layers only has a cache of 0 layers that still counts
// each sequence's positions. Why not a cache layer per model layer left empty: every
// loop over layers (shifts, compaction, state files, paged blocks) would have to skip
// them, and the paged blocks would reserve room for them.
//
// Rows are in the same byte format on both layouts (KvCache::encode_row): keys by
// position, values transposed per dimension (one-value types) or by position (quantized).
// The saved state of a sequence (session files) is therefore the same bytes on both, and
// a file saved by one layout loads in the other.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/session.h"
#include "kiln/tensor_type.h"
#include "runtime/kv_cache.h"
#include "runtime/thread_pool.h"

namespace kiln {

class KvStore {
 public:
  struct Format {
    size_t n_layers = 0, kv_dim = 0, head_dim = 0;
    size_t n_ctx = 0;  // positions one sequence may hold
    TensorType k_type = TensorType::F32, v_type = TensorType::F32;
    bool v_transposed = true;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    size_t elem = 0;  // bytes of one value when transposed, else 0
  };
  // A run of positions stored contiguously: (first position, its key row, its values,
  // length). Key row i at k + i * k_row_bytes; values transposed: dimension d of position
  // i at v + d * v_stride(layer) + i * elem, else value row i at v + i * v_row_bytes.
  using Run = FunctionRef<void(size_t pos, const uint8_t* k, const uint8_t* v, size_t n)>;
  // Turns a moved key row's RoPE back by the distance it moved (Session knows the tables).
  using Rerotate = FunctionRef<void(size_t layer, float* k_row, size_t delta)>;
  using Sink = FunctionRef<void(const void* data, size_t bytes)>;
  using Source = FunctionRef<void(void* dst, size_t bytes)>;

  virtual ~KvStore() = default;
  const Format& format() const { return f_; }
  virtual KvLayout layout() const = 0;

  // Sequences. 0 always exists; the contiguous layout has no other (add_sequence and
  // fork throw kiln::Error naming the paged layout). fork() holds the same positions as `from` (paged: in
  // the same blocks); release() frees a sequence (0 is only emptied).
  virtual bool alive(int32_t seq) const = 0;
  virtual size_t length(int32_t seq) const = 0;
  virtual int32_t add_sequence() = 0;  // empty
  virtual int32_t fork(int32_t from) = 0;
  virtual void release(int32_t seq) = 0;
  // Keeps positions [0, n) (n <= length). Returns the length kept: less (0) only when a
  // ring no longer holds what position n's window needs.
  virtual size_t truncate(int32_t seq, size_t n) = 0;
  // Makes positions [length, length + n) writable (paged: blocks taken, a shared last
  // block copied) and counts them held. Throws kiln::Error past n_ctx.
  virtual void append(int32_t seq, size_t n) = 0;
  virtual void store(size_t layer, int32_t seq, size_t pos, const float* k, const float* v) = 0;

  // Reading (attention): positions [p0, p1) of a sequence as runs, in order.
  virtual void for_each_run(size_t layer, int32_t seq, size_t p0, size_t p1, Run f) const = 0;
  virtual size_t v_stride(size_t layer) const = 0;
  // Positions from p on stored in one run.
  virtual size_t run_room(size_t layer, int32_t seq, size_t p) const = 0;
  // Positions from p on before a ring wraps (tiles of tiled attention never cross it).
  virtual size_t wrap_room(size_t layer, size_t p) const = 0;
  virtual bool has_rings() const = 0;
  // Values spread over several runs are gathered into one row per dimension before P V
  // (paged) rather than added run by run (a ring's wrap): the sums then run in the
  // contiguous layout's order.
  bool gathers_runs() const { return layout() == KvLayout::paged; }
  // Keys [e0, e0 + n) of positions [p0, p0 + np) as floats, to out[j][.] (row stride ld).
  void keys_to_f32(size_t layer, int32_t seq, size_t p0, size_t np, size_t e0, size_t n, float* out, size_t ld) const;

  // Editing a sequence of `len` positions; shift() and compact() leave its length at
  // what is kept. Context shift: [n_keep, n_keep + n_discard) forgotten, the later ones
  // moved back by n_discard with their keys turned back (throws kiln::Error, nothing
  // changed, when a ring no longer holds what a window would reach). Compaction:
  // position kept[i] moves to i (kept ascending), the others are forgotten.
  virtual void shift(int32_t seq, size_t n_keep, size_t n_discard, Rerotate rerotate) = 0;
  virtual void compact(int32_t seq, const int32_t* kept, size_t n_kept, Rerotate rerotate) = 0;

  // Saved state of a sequence's first n positions, layer after layer: keys by position,
  // then values as stored (transposed: each dimension's n values), whatever the layout.
  uint32_t state_type() const;
  uint64_t state_layer_bytes(size_t n) const { return uint64_t(n) * (f_.k_row_bytes + f_.v_row_bytes); }
  virtual void write_state(int32_t seq, size_t n, Sink sink) const;
  // Replaces the sequence with n saved positions (n <= n_ctx).
  virtual void read_state(int32_t seq, size_t n, Source source);

  virtual KvMemory memory() const = 0;
  virtual double bytes() const = 0;  // allocated now (contiguous: the whole context)
  virtual double layer_bytes(size_t layer) const = 0;

 protected:
  explicit KvStore(const Format& f) : f_(f) {}
  // The shared paths of write_state/read_state, over the runs of a sequence.
  void write_runs(size_t layer, int32_t seq, size_t n, Sink sink) const;
  Format f_;
};

// The session's cache: KvCache.Shape `s` (contiguous: rings where `windows` slide) in
// `layout`, with paged blocks of `block` positions (sliding-window layers keep every
// position there, as with --swa-full: the window is attention's mask).
std::unique_ptr<KvStore> make_kv_store(KvLayout layout, const KvCache::Shape& s, const std::vector<uint32_t>& windows,
                                       size_t block);

}  // namespace kiln
