#include "runtime/recurrent_state.h"

#include <algorithm>

namespace kiln {

RecurrentState::RecurrentState(const ModelConfig& c) {
  slot_.assign(c.n_layers, 0);
  for (size_t l = 0; l < c.n_layers; ++l)
    if (c.is_ssm(l)) slot_[l] = n_ssm_layers_++;
  if (n_ssm_layers_ == 0) return;
  conv_floats_ = size_t(c.ssm_conv_dim()) * (c.ssm_d_conv - 1);
  ssm_floats_ = size_t(c.ssm_d_inner) * c.ssm_d_state;
  prepare(0);
}

void RecurrentState::prepare(int32_t seq) {
  if (empty()) return;
  if (size_t(seq) >= seqs_.size()) seqs_.resize(size_t(seq) + 1);
  if (seqs_[size_t(seq)].empty()) seqs_[size_t(seq)].assign(n_ssm_layers_ * per_layer(), 0.0f);
}

void RecurrentState::clear(int32_t seq) {
  if (empty()) return;
  prepare(seq);
  std::fill(seqs_[size_t(seq)].begin(), seqs_[size_t(seq)].end(), 0.0f);
}

void RecurrentState::copy(int32_t from, int32_t to) {
  if (empty() || from == to) return;
  prepare(from);
  prepare(to);
  seqs_[size_t(to)] = seqs_[size_t(from)];
}

void RecurrentState::write(int32_t seq, Sink sink) const {
  if (empty()) return;
  const std::vector<float>& s = seqs_.at(size_t(seq));
  for (size_t i = 0; i < n_ssm_layers_; ++i) {
    sink(&s[i * per_layer()], conv_floats_ * sizeof(float));
    sink(&s[i * per_layer() + conv_floats_], ssm_floats_ * sizeof(float));
  }
}

void RecurrentState::read(int32_t seq, Source source) {
  if (empty()) return;
  prepare(seq);
  std::vector<float>& s = seqs_[size_t(seq)];
  for (size_t i = 0; i < n_ssm_layers_; ++i) {
    source(&s[i * per_layer()], conv_floats_ * sizeof(float));
    source(&s[i * per_layer() + conv_floats_], ssm_floats_ * sizeof(float));
  }
}

double RecurrentState::bytes() const {
  double n = 0;
  for (const std::vector<float>& s : seqs_) n += double(s.size()) * sizeof(float);
  return n;
}

}  // namespace kiln
