// The GGUF reader (header, metadata, tensor table) and everything Model::load does with
// what it read (hyperparameters, tensor shapes, the tokenizer's vocabulary). Any outcome
// but a model or a kiln::Error is a finding; a model that loads must also run a token.
#include <cstdint>

#include "fuzz_util.h"
#include "kiln/model.h"
#include "kiln/session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  fuzz::MemFile file(data, size);
  try {
    auto f = gguf::File::open(file.path());
    size_t sum = 0;
    for (const auto& [key, value] : f->metadata()) sum += value.to_string().size();
    // Every tensor's bytes must lie inside the mapping: touch both ends.
    for (const gguf::TensorInfo& t : f->tensors()) sum += t.data[0] + t.data[t.n_bytes - 1];
    LoadParams lp;
    lp.repack = size % 2 == 0;  // both the packed and the mapped weights
    auto model = Model::load(file.path(), lp);
    SessionParams sp;
    sp.n_ctx = 8;
    sp.n_threads = 1;
    Session session(*model, sp);
    const std::vector<int32_t> ids = model->tokenizer().encode("Once upon a time", true);
    if (!ids.empty()) session.decode(std::span(ids.data(), std::min<size_t>(ids.size(), 8)));
    (void)sum;
  } catch (const Error&) {
  }
  return 0;
}
