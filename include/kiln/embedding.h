#pragma once
// Text embeddings: one vector per text from a model's final hidden states (BERT-style
// encoders, or decoders with last-token pooling), as llama.cpp's llama-embedding computes
// them. Many texts run in one forward pass, each its own sequence of a paged session, so
// that a text's vector does not depend on which texts share its batch.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/model.h"
#include "kiln/session.h"

namespace kiln {

// "none", "mean", "cls", "last"; nullopt for another name.
std::optional<Pooling> pooling_from_name(std::string_view name);
const char* pooling_name(Pooling p);

struct EmbedParams {
  std::optional<Pooling> pooling;  // default: the model's pooling_type
  int32_t n_ctx = 0;      // 0: the model's context_length capped at 4096; also the batch size
  int32_t n_threads = 0;  // 0: physical cores
};

class Embedder {
 public:
  // Throws kiln::Error for a model that cannot embed (recurrent layers; a context a text
  // cannot fit in).
  Embedder(const Model& model, const EmbedParams& params = {});
  ~Embedder();
  Embedder(const Embedder&) = delete;
  Embedder& operator=(const Embedder&) = delete;

  Pooling pooling() const { return pooling_; }
  size_t dim() const { return model_.config().dim; }
  // The most tokens a text may have (the context: a text runs in one forward pass, so
  // that non-causal attention sees all of it).
  size_t max_tokens() const;

  // A text's tokens as the model sees them: with the vocabulary's BOS/CLS and EOS/SEP
  // (llama-embedding's tokenization, special tokens parsed).
  std::vector<int32_t> tokenize(std::string_view text) const;

  // Embeddings of token lists, not normalised: one vector (dim floats) per input, or with
  // Pooling::none one per token, inputs one after another. Inputs are packed in order into
  // forward passes of at most max_tokens() tokens. Throws kiln::Error (naming the input)
  // for an empty input or one longer than max_tokens().
  std::vector<std::vector<float>> embed_tokens(std::span<const std::vector<int32_t>> inputs);
  std::vector<std::vector<float>> embed(std::span<const std::string> texts);

 private:
  const Model& model_;
  Pooling pooling_;
  Session session_;
};

// llama.cpp's common_embd_normalize: norm -1 none, 0 scaled so that the largest |value|
// is 32760 (an int16 range), 1 taxicab, 2 euclidean, p > 2 the p-norm. A zero vector stays zero.
void normalize_embedding(std::span<float> v, int norm);

// Cosine similarity as llama.cpp computes it (sums in double; two zero vectors give 1,
// one zero vector 0).
double cosine_similarity(std::span<const float> a, std::span<const float> b);

}  // namespace kiln
