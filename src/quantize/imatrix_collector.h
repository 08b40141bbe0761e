#pragma once
// Collects an importance matrix (kiln/imatrix.h) from the forward pass, as llama-imatrix
// does: installed as the session's MatmulObserver, it adds up, for every weight matrix
// in a block ("blk.*") and, when asked, the output projection ("output.weight"; a
// classifier tied to token_embd is never collected, as in llama.cpp), the squares of
// each input column over the rows that go in, and counts the rows; a 3-D expert
// tensor's statistics are kept per expert, over the tokens routed to it.
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/imatrix.h"
#include "kiln/matmul_observer.h"

namespace kiln::imatrix {

class Collector : public MatmulObserver {
 public:
  explicit Collector(bool process_output) : process_output_(process_output) {}

  // llama-imatrix ignores products of a 2-D weight with fewer than 16 rows (decoding
  // steps, in the tools that share its callback). When kiln's forward passes are
  // llama.cpp's micro-batches (a chunk cut in pieces), the same rule gives the same
  // statistics; set it then. 0: every product counts.
  void set_min_dense_rows(size_t rows) { min_dense_rows_ = rows; }

  void on_matmul(const gguf::TensorInfo& weight, int64_t expert, const float* x, size_t rows) override;

  // What was collected, with the given datasets and chunk size; the chunk count is, as
  // llama-imatrix counts it, the most rows any matrix received in whole chunks.
  Imatrix result(std::vector<std::string> datasets, int32_t chunk_size) const;

 private:
  Entry* entry_for(const gguf::TensorInfo& weight);

  bool process_output_;
  size_t min_dense_rows_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  // The entry of each tensor seen (nullptr: not collected), so a product costs no
  // string work after the first pass.
  std::unordered_map<const gguf::TensorInfo*, Entry*> by_tensor_;
};

}  // namespace kiln::imatrix
