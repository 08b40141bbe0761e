#pragma once
// A Session runs the forward pass of one Model over a sequence, keeping the KV cache so
// each call only computes the tokens it is given. Buffers are allocated once here; the
// per-token path allocates nothing.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/matmul_observer.h"
#include "kiln/model.h"

namespace kiln {

// How a KV cache state is laid out as bytes (kiln/session_file.h stores it). Only the
// runtime knows what the bytes of a kv_type mean; files store this description and a
// reader compares it with what its own session would write.
struct KvStateDesc {
  uint32_t kv_type = 0;      // the cache's types and layout (0: f32 keys, f32 transposed values)
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;       // key (and value) width per position and layer
  int32_t n_pos = 0;         // positions held
  uint64_t layer_bytes = 0;  // one layer's keys and values
  // A hash of the RoPE settings the keys were rotated with when they differ from the
  // model's unscaled RoPE (--rope-* flags, scaling metadata), else 0: a cache is only
  // reusable under the same angles.
  uint64_t positions = 0;
  // The recurrent (SSM) layers' state after the last position, written after the KV
  // layers: fixed by the model (0 for attention-only models, whose states are as they
  // always were; 0 for an empty state).
  uint64_t recurrent_bytes = 0;
  uint64_t bytes() const { return uint64_t(n_layers) * layer_bytes + recurrent_bytes; }
  bool operator==(const KvStateDesc&) const = default;
};

// Tiled attention with an online softmax (flash-attention style): no score buffer as long
// as the context, keys and values read a block of positions at a time. Needed for
// quantized values; automatic turns it on exactly then.
enum class FlashAttention { automatic, on, off };

// How the KV cache is stored (runtime/kv_store.h). contiguous: one preallocated run of
// n_ctx positions per layer, for one sequence (sequence 0; forks need paged).
// paged: blocks of kv_block positions taken on demand through a block table per
// sequence, so several sequences can share a prefix (copy-on-write when one writes into
// a shared block); same results as contiguous, bit for bit, for every feature
// (truncation, context shifts, eviction, attention scores, saved state, in the same
// bytes). Paged has no sliding-window rings: a model with sliding-window layers is
// refused at construction (kiln::Error).
enum class KvLayout { contiguous, paged };

// Paged KV memory, in blocks (each holds kv_block positions of every layer) and bytes.
// The contiguous cache reports its whole allocation as used and no blocks.
struct KvMemory {
  int64_t blocks_used = 0;      // referenced by some sequence, each counted once
  int64_t blocks_unshared = 0;  // what the same sequences would hold without sharing
  double bytes_used = 0, bytes_unshared = 0;
  double bytes_allocated = 0;   // the pool, free blocks included
};

struct SessionParams {
  int32_t n_ctx = 0;      // 0: the model's context_length capped at 4096
  // The context this asks of model c: n_ctx, or its default.
  int64_t context_for(const ModelConfig& c) const { return n_ctx > 0 ? n_ctx : std::min<int64_t>(c.n_ctx_train, 4096); }
  int32_t n_batch = 512;  // tokens per prefill step (matrix x matrix)
  int32_t n_threads = 0;  // 0: physical cores
  // KV cache storage: F32, F16, BF16, Q8_0 or Q4_0 (quantized values need flash attention).
  TensorType kv_type_k = TensorType::F16;
  TensorType kv_type_v = TensorType::F16;
  FlashAttention flash_attn = FlashAttention::automatic;
  RopeParams rope;        // RoPE scaling overrides (kiln/rope.h); default: the model's
  // Sliding-window attention overrides (default: the model's ModelConfig::swa_window).
  // swa_window >= 0 sets the window of the sliding layers (0: none slides); if the model
  // has no window, every layer slides unless swa_pattern says otherwise. swa_pattern N >= 0
  // picks the sliding layers: all but every Nth (l % N == N - 1 is global; 0: all slide).
  int32_t swa_window = -1;
  int32_t swa_pattern = -1;
  // Sliding layers keep a cache as long as the context, masked, instead of a ring of
  // window + n_batch - 1 slots (llama.cpp's --swa-full): for comparison, and for
  // truncations and context shifts further back than a ring holds.
  bool swa_full = false;
  KvLayout kv_layout = KvLayout::contiguous;
  int32_t kv_block = 16;  // positions per block of the paged layout
};

class Session {
 public:
  Session(const Model& model, const SessionParams& params);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends `tokens` at positions n_past().. and runs them through the model (in batches
  // of n_batch). Returns the logits of the last token, or of every token when all_logits
  // (then row i is tokens[i], n_vocab floats each). Throws kiln::Error if the context
  // would overflow (nothing is appended then), a token id is out of range, or the model
  // has no classifier (an encoder such as BERT, whose output is decode_batch_hidden's);
  // the same from decode_sequence, decode_parallel and decode_batch.
  std::span<const float> decode(std::span<const int32_t> tokens, bool all_logits = false);

  int32_t n_past() const;
  int32_t n_ctx() const;
  int32_t n_batch() const;  // the most tokens one forward pass takes
  int32_t n_threads() const;
  bool flash_attn() const;       // the attention in use
  double kv_cache_bytes() const;  // allocated for the whole context (paged: the pool as it is now)
  double kv_cache_layer_bytes(int32_t layer) const;  // one layer's share: less for a ring
  // The recurrent (SSM) layers' state of one sequence, whatever its length (0 without
  // such layers). Context shifts and eviction leave it as it is: it holds no positions.
  uint64_t recurrent_state_bytes() const;
  uint32_t layer_window(int32_t layer) const;  // sliding window in use (0: global)
  // Forgets positions >= n (the next decode continues from n). A sliding-window layer kept
  // as a ring may no longer hold what position n needs (positions it has overwritten
  // since): then everything is forgotten, n_past() is 0, and the caller runs the tokens
  // again from there (Generator does: it continues from n_past()). Recurrent (SSM)
  // layers cannot go back at all: their state has folded every position in. A truncation
  // to n before n_past() goes back to the sequence's checkpoint() when it lies at or
  // before n, else it forgets everything (n_past() 0).
  void truncate(int32_t n);
  // Recurrent (SSM) layers: remembers a sequence's state at its n_past() (replacing the
  // one remembered before) for truncate() and truncate_sequence() to go back to; a fork
  // gets a copy. The Generator takes one after each prompt (a chat turn re-rendering the
  // reply that followed goes back there, not to the start) and before each speculative
  // verification (rejected drafts then cost a re-run of the accepted ones: cheaper than a
  // state kept per draft position, and as exact); the server's engine after each prompt (a
  // request extending an earlier one's conversation goes back there). A copy of
  // recurrent_state_bytes() per sequence; nothing without recurrent layers. Forgotten by a
  // truncation before it, a context shift, an eviction and a restored state.
  void checkpoint(int32_t seq = 0);
  // Context shift: forgets positions [n_keep, n_keep + n_discard) and moves the later ones
  // back by n_discard, turning their keys' RoPE back instead of recomputing them (the kept
  // tokens still carry what they saw of the forgotten ones: an approximation, as in
  // llama.cpp). n_past() shrinks by n_discard. With sliding-window ring layers, refused
  // (kiln::Error, nothing changed) when a window would reach kept positions the ring has
  // already overwritten (a --keep longer than the context minus the window: use swa_full).
  void shift_context(int32_t n_keep, int32_t n_discard);
  // KV-cache eviction (the general form of a shift): forgets the cached positions listed
  // (strictly ascending, each < n_past(), else kiln::Error and nothing changes) and moves
  // the others down in order, each key turned back by RoPE by the distance it moved.
  // n_past() shrinks by positions.size(). Allocates nothing.
  void evict(std::span<const int32_t> positions);
  // H2O's heavy-hitter scores: while on, each decode adds to every cached position the
  // attention it receives (softmax probabilities summed over layers, heads and the new
  // queries: positions are shared by all layers, so one score per position). New positions
  // start at 0; scores move with evict() and shift_context(). Costs a second Q K^T pass
  // per layer; off by default. Turning it on allocates (n_heads + threads * 64) * n_ctx floats.
  void track_attention(bool on);
  // n_past() scores (empty when not tracking).
  std::span<const float> attention_scores() const;
  void reset() { truncate(0); }

  // Parallel sequences (the paged layout; on the contiguous one, add_sequence and
  // fork_sequence throw kiln::Error). Sequence 0 always exists: it is the one decode(),
  // truncate(), shift_context(), evict(), the attention scores and the saved state work
  // on. A fork holds the same positions as `from` in the same blocks, shared until a
  // sequence writes into one; add_sequence() starts an empty one.
  KvLayout kv_layout() const;
  int32_t fork_sequence(int32_t from = 0);
  int32_t add_sequence();
  // decode() on any sequence: a draft's k + 1 tokens verified in one batch.
  std::span<const float> decode_sequence(int32_t seq, std::span<const int32_t> tokens, bool all_logits = false);
  // Forgets positions >= n of a sequence (rejected draft tokens): the next token of that
  // sequence continues from n, as if the forgotten ones had never been decoded.
  void truncate_sequence(int32_t seq, int32_t n);
  // Its blocks lose a reference (freed when no other sequence holds them); the id may be
  // reused by a later fork. Sequence 0 is only emptied.
  void free_sequence(int32_t seq);
  int32_t n_past(int32_t seq) const;
  // One new token for each listed sequence (distinct), run as one batch: the weights are
  // read once for all of them, and each token attends to its own sequence. Returns the
  // logits, row i for seqs[i] (n_vocab floats each). Throws kiln::Error, nothing
  // appended, for a full sequence, an unknown one or a token outside the vocabulary.
  std::span<const float> decode_parallel(std::span<const int32_t> seqs, std::span<const int32_t> tokens);
  // A mixed batch: each part appends its tokens to its own sequence at that sequence's
  // positions (a server step: one token of each running request beside a chunk of a
  // waiting prompt), all in one forward pass. Returns the logits of each part's last
  // token, or of every token of a part marked all_logits (a draft being verified), in
  // part order. Throws kiln::Error, nothing appended, for an unknown or
  // repeated sequence, a part without tokens, one that overflows the context, a token
  // outside the vocabulary, or more tokens in all than the batch size (n_batch).
  struct BatchPart {
    int32_t seq = 0;
    std::span<const int32_t> tokens;
    bool all_logits = false;
  };
  std::span<const float> decode_batch(std::span<const BatchPart> parts);
  // decode_batch that returns every token's final hidden state instead of logits (after
  // the output norm where the model has one; all_logits is ignored): [tokens][dim], the
  // parts' tokens one after another. What embeddings are pooled from (kiln/embedding.h).
  // With non-causal attention (ModelConfig::causal false) each token of a part sees the
  // whole part and what its sequence held before, nothing of the other parts.
  std::span<const float> decode_batch_hidden(std::span<const BatchPart> parts);
  KvMemory kv_memory() const;

  // Shows every weight product of the following forward passes to `observer` (nullptr:
  // none, the default); the observer must outlive its use (kiln/matmul_observer.h).
  void set_matmul_observer(MatmulObserver* observer);

  const Model& model() const;

  // Saving and restoring the KV cache (the session file, kiln/session_file.h, wraps these
  // with tokens, checks and a checksum). kv_state_desc(n) is what this session writes for
  // n positions (any n >= 0, to check a file before anything is read).
  KvStateDesc kv_state_desc(int32_t n_pos) const;
  // What a KvStateDesc::kv_type means, in words: "f16 keys, q8_0 values by position".
  static std::string kv_type_name(uint32_t kv_type);
  // Calls sink(data, bytes) with the first n_past() positions of every layer, layer after
  // layer: kv_state_desc(n_past()).bytes() bytes in all, in row-sized pieces.
  void write_kv_state(const std::function<void(const void* data, size_t bytes)>& sink) const;
  // Replaces the cache with a state from write_kv_state of a session of the same model
  // (any n_ctx up to this one's) and sets n_past() to desc.n_pos. source(dst, bytes) must
  // fill dst with the next bytes of that state, in order (desc.bytes() in all, in pieces
  // of the same sizes the sink got). A description this session would not write, or too
  // many positions, throws kiln::Error before source is called: the session as it was. If
  // source throws, the cache is partly overwritten: the session is reset (n_past() 0) and
  // the exception propagates.
  void read_kv_state(const KvStateDesc& desc, const std::function<void(void* dst, size_t bytes)>& source);
  // The same from memory; data.size() must be desc.bytes() (else kiln::Error, untouched).
  void read_kv_state(const KvStateDesc& desc, std::span<const uint8_t> data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
