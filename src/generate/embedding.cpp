// kiln::Embedder (kiln/embedding.h): texts packed into forward passes, each text its own
// sequence of a paged session (so that attention, causal or not, stays within the text),
// the final hidden states pooled per text.
#include "kiln/embedding.h"

#include <algorithm>
#include <cmath>

#include "kiln/error.h"

namespace kiln {
namespace {

SessionParams embedding_session(const Model& model, const EmbedParams& p) {
  const ModelConfig& c = model.config();
  for (size_t l = 0; l < c.n_layers; ++l)
    if (c.is_ssm(l))
      throw Error(model.file().path() + ": embeddings need attention in every layer; this " + c.arch +
                  " model has recurrent (Mamba-2) layers");
  SessionParams s;
  s.n_ctx = p.n_ctx;
  // A text runs in one forward pass: a non-causal model's tokens must all see each other.
  s.n_batch = int32_t(std::max<int64_t>(1, s.context_for(c)));
  s.n_threads = p.n_threads;
  // F32 keys and values: the cache only ever holds the batch being run, and llama.cpp
  // computes an encoder's attention without a cache, in F32.
  s.kv_type_k = s.kv_type_v = TensorType::F32;
  s.flash_attn = FlashAttention::off;
  s.kv_layout = KvLayout::paged;  // one sequence per text
  return s;
}

}  // namespace

std::optional<Pooling> pooling_from_name(std::string_view name) {
  if (name == "none") return Pooling::none;
  if (name == "mean") return Pooling::mean;
  if (name == "cls") return Pooling::cls;
  if (name == "last") return Pooling::last;
  return std::nullopt;
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::none: return "none";
    case Pooling::mean: return "mean";
    case Pooling::cls: return "cls";
    case Pooling::last: return "last";
  }
  return "?";
}

Embedder::Embedder(const Model& model, const EmbedParams& params)
    : model_(model), pooling_(params.pooling.value_or(model.config().pooling)),
      session_(model, embedding_session(model, params)) {}

Embedder::~Embedder() = default;

size_t Embedder::max_tokens() const { return size_t(session_.n_batch()); }

std::vector<int32_t> Embedder::tokenize(std::string_view text) const {
  // true: the special tokens the vocabulary adds (BOS or [CLS] when it asks for one,
  // EOS when add_eos_token says so, [SEP] after WordPiece's [CLS]).
  return model_.tokenizer().encode(text, /*add_bos=*/true, /*parse_special=*/true);
}

std::vector<std::vector<float>> Embedder::embed(std::span<const std::string> texts) {
  std::vector<std::vector<int32_t>> inputs;
  inputs.reserve(texts.size());
  for (const std::string& t : texts) inputs.push_back(tokenize(t));
  return embed_tokens(inputs);
}

std::vector<std::vector<float>> Embedder::embed_tokens(std::span<const std::vector<int32_t>> inputs) {
  const size_t max = max_tokens(), dim = this->dim();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) throw Error("input " + std::to_string(i) + " has no tokens");
    if (inputs[i].size() > max)
      throw Error("input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                  " tokens, more than the context of " + std::to_string(max) + " (a text must fit in one batch)");
  }
  std::vector<std::vector<float>> out;
  std::vector<Session::BatchPart> parts;
  std::vector<int32_t> seqs;
  for (size_t i = 0; i < inputs.size();) {
    // The next inputs, in order, as many as fit (llama-embedding packs them the same way).
    size_t j = i, total = 0;
    parts.clear(), seqs.clear();
    while (j < inputs.size() && total + inputs[j].size() <= max) {
      const int32_t seq = parts.empty() ? 0 : session_.add_sequence();
      parts.push_back({seq, inputs[j], false});
      seqs.push_back(seq);
      total += inputs[j++].size();
    }
    std::span<const float> hidden;
    try {
      hidden = session_.decode_batch_hidden(parts);
    } catch (...) {
      for (int32_t seq : seqs) session_.free_sequence(seq);
      throw;
    }
    size_t row = 0;
    for (const Session::BatchPart& part : parts) {
      const size_t n = part.tokens.size();
      const float* h = hidden.data() + row * dim;
      switch (pooling_) {
        case Pooling::none:
          for (size_t t = 0; t < n; ++t) out.emplace_back(h + t * dim, h + (t + 1) * dim);
          break;
        case Pooling::cls: out.emplace_back(h, h + dim); break;
        case Pooling::last: out.emplace_back(h + (n - 1) * dim, h + n * dim); break;
        case Pooling::mean: {
          std::vector<float> mean(dim, 0.0f);
          for (size_t t = 0; t < n; ++t)
            for (size_t d = 0; d < dim; ++d) mean[d] += h[t * dim + d];
          for (float& v : mean) v /= float(n);
          out.push_back(std::move(mean));
          break;
        }
      }
      row += n;
    }
    for (int32_t seq : seqs) session_.free_sequence(seq);
    i = j;
  }
  return out;
}

void normalize_embedding(std::span<float> v, int norm) {
  // The arithmetic of llama.cpp's common_embd_normalize: products in float, sums in double.
  double sum = 0.0;
  if (norm == -1) {
    sum = 1.0;
  } else if (norm == 0) {
    for (float x : v) sum = std::max(sum, double(std::abs(x)));
    sum /= 32760.0;
  } else if (norm == 2) {
    for (float x : v) sum += x * x;
    sum = std::sqrt(sum);
  } else {
    for (float x : v) sum += std::pow(std::abs(x), norm);
    sum = std::pow(sum, 1.0 / norm);
  }
  const float scale = sum > 0.0 ? float(1.0 / sum) : 0.0f;
  for (float& x : v) x *= scale;
}

double cosine_similarity(std::span<const float> a, std::span<const float> b) {
  // As llama.cpp's common_embd_similarity_cos: products in float, sums in double; two zero
  // vectors are alike (1), a zero vector and another are not (0).
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  if (aa == 0 || bb == 0) return aa == 0 && bb == 0 ? 1.0 : 0.0;
  return ab / (std::sqrt(aa) * std::sqrt(bb));
}

}  // namespace kiln
