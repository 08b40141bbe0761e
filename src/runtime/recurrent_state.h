#pragma once
// The per-sequence state of a model's recurrent (Mamba-2) layers, kept beside the KV
// cache: what attention layers look up in the cache, an SSM layer has folded into a
// fixed-size state. Per sequence and SSM layer:
//   conv  [conv_dim][d_conv - 1]           the last d_conv - 1 inputs of the causal conv, oldest first
//   ssm   [n_heads][head_dim][d_state]     h of the selective scan
// Its size does not grow with the context. A state cannot be cut back to an earlier
// position (it has forgotten what it folded in), so the Session forgets it (zero, position
// 0) on a truncation to anywhere but its end, and callers run the tokens again from there.
// Storage grows with the highest sequence id in use; nothing is allocated per token.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/model.h"
#include "runtime/thread_pool.h"  // FunctionRef

namespace kiln {

class RecurrentState {
 public:
  explicit RecurrentState(const ModelConfig& c);

  bool empty() const { return n_ssm_layers_ == 0; }  // no recurrent layer: nothing is kept
  size_t n_layers() const { return n_ssm_layers_; }
  size_t conv_floats() const { return conv_floats_; }  // of one layer
  size_t ssm_floats() const { return ssm_floats_; }    // of one layer
  uint64_t sequence_bytes() const { return uint64_t(n_ssm_layers_) * (conv_floats_ + ssm_floats_) * sizeof(float); }

  // Layer l of the model (an SSM layer) for a sequence; the sequence's storage must exist
  // (prepare()).
  float* conv(size_t l, int32_t seq) { return &seqs_[size_t(seq)][slot_[l] * per_layer()]; }
  float* ssm(size_t l, int32_t seq) { return conv(l, seq) + conv_floats_; }

  // Makes a sequence's storage exist (zero for a new one); the one place that allocates.
  void prepare(int32_t seq);
  void clear(int32_t seq);                 // the state of no tokens at all
  void copy(int32_t from, int32_t to);     // a fork: `to` continues where `from` is
  // A snapshot of a sequence's state, and putting one back (the Session keeps one to
  // return to after a truncation). `out` keeps its capacity from one save to the next.
  void save(int32_t seq, std::vector<float>& out) const { out = seqs_.at(size_t(seq)); }
  void restore(int32_t seq, const std::vector<float>& in) {
    prepare(seq);
    seqs_[size_t(seq)] = in;
  }
  // The saved state: every SSM layer's conv then ssm floats, layer after layer.
  using Sink = FunctionRef<void(const void* data, size_t bytes)>;
  using Source = FunctionRef<void(void* dst, size_t bytes)>;
  void write(int32_t seq, Sink sink) const;
  void read(int32_t seq, Source source);
  double bytes() const;  // allocated now, over all sequences

 private:
  size_t per_layer() const { return conv_floats_ + ssm_floats_; }
  size_t n_ssm_layers_ = 0, conv_floats_ = 0, ssm_floats_ = 0;
  std::vector<size_t> slot_;              // [n_layers]: the SSM layer's index among them
  std::vector<std::vector<float>> seqs_;  // [sequence][n_ssm_layers * per_layer]
};

}  // namespace kiln
