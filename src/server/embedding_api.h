#pragma once
// The embedding requests of kiln serve: OpenAI's POST /v1/embeddings and ollama's
// POST /api/embed, parsed and checked (a 400 naming the field), and their responses.
#include <span>
#include <string>
#include <vector>

#include "kiln/embedding.h"
#include "server/openai_api.h"

namespace kiln::server {

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // tokens, specials included, each within the context
  bool base64 = false;                       // encoding_format "base64"
  int normalize = 2;                         // llama-server's embd_normalize (ollama: always 2)
  size_t dimensions = 0;                     // 0: all of them
};

// More inputs than this in one request is a 400 (OpenAI's limit).
constexpr size_t kMaxEmbeddingInputs = 2048;

// OpenAI: input a string, a list of strings, a list of token ids or a list of such lists;
// encoding_format float|base64; dimensions (the first N values, normalised again);
// llama-server's embd_normalize. A text longer than the context is a 400 naming it.
EmbeddingRequest parse_openai_embedding(const json& body, const Embedder& embedder, int32_t n_vocab);
// ollama: input a string or a list of strings; truncate (default true) cuts a text longer
// than the context to it, keeping the special tokens at its end; false makes it a 400.
EmbeddingRequest parse_ollama_embed(const json& body, const Embedder& embedder);

// Base64 of the floats' bytes, little-endian float32 as OpenAI sends them.
std::string base64_floats(std::span<const float> v);

// Each vector normalised (`normalize` as normalize_embedding), after cutting it to
// `dimensions` values when nonzero.
void finish_vectors(std::vector<std::vector<float>>& vectors, int normalize, size_t dimensions);

}  // namespace kiln::server
