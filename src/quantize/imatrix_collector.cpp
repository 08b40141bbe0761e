#include "quantize/imatrix_collector.h"

#include <algorithm>
#include <cmath>

#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln::imatrix {

Entry* Collector::entry_for(const gguf::TensorInfo& weight) {
  auto [it, added] = by_tensor_.try_emplace(&weight, nullptr);
  if (!added) return it->second;
  const std::string& name = weight.name;
  if (!(name.starts_with("blk.") || (process_output_ && name == "output.weight"))) return nullptr;
  // Experts: one vector and count per matrix of the 3-D tensor.
  const uint64_t n_mat = weight.dims.size() >= 3 ? weight.dims[2] : 1;
  Entry& e = entries_[name];
  e.sums.assign(weight.dims[0] * n_mat, 0.0f);
  e.counts.assign(n_mat, 0);
  return it->second = &e;
}

void Collector::on_matmul(const gguf::TensorInfo& weight, int64_t expert, const float* x, size_t rows) {
  if (expert < 0 && rows < min_dense_rows_) return;
  Entry* e = entry_for(weight);
  if (!e) return;
  const size_t n = weight.dims[0];
  const size_t mat = expert < 0 ? 0 : size_t(expert);
  if (mat >= e->n_mat()) throw Error("imatrix: expert " + std::to_string(expert) + " of '" + weight.name + "' is out of range");
  float* sums = &e->sums[mat * n];
  // Row after row, each column's sum in float, in the order llama-imatrix adds them.
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    for (size_t j = 0; j < n; ++j) sums[j] += row[j] * row[j];
  }
  for (size_t j = 0; j < n; ++j)
    if (!std::isfinite(sums[j]))
      throw Error("imatrix: the activations into '" + weight.name + "' reached " + std::to_string(sums[j]));
  e->counts[mat] += int64_t(rows);
}

Imatrix Collector::result(std::vector<std::string> datasets, int32_t chunk_size) const {
  Imatrix m;
  m.datasets = std::move(datasets);
  m.chunk_size = chunk_size;
  m.has_metadata = true;
  for (const auto& [name, e] : entries_) {
    m.entries.emplace(name, e);
    for (int64_t c : e.counts) m.chunk_count = std::max<int32_t>(m.chunk_count, int32_t(c / std::max(chunk_size, 1)));
  }
  return m;
}

}  // namespace kiln::imatrix
