// kiln serve's request parsing (src/server/openai_api, ollama_api, embedding_api): a body
// from the input through parse_body and one of the six request readers (four completion
// routes, two embedding routes), with stories260K's tokenizer and the Qwen2.5 chat template
// (embeddings: stories260K as an embedder with a context of 64 tokens). Input: [route] body. Everything a client can send must end
// as a parsed request or an ApiError (the server's 4xx), never as another exception, a
// crash or undefined behaviour; a parsed request must be one the engine accepts.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "kiln/chat_template.h"
#include "kiln/model.h"
#include "kiln/embedding.h"
#include "server/embedding_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Fixture {
  std::unique_ptr<kiln::Model> model = kiln::Model::load(kiln::fuzz::shared_dir() + "/models/stories260K.gguf");
  kiln::server::ChatFormatter chat{
      kiln::ChatTemplate(slurp(kiln::fuzz::shared_dir() + "/templates/Qwen-Qwen2.5-7B-Instruct.jinja")),
      model->tokenizer()};
  kiln::Embedder embedder{*model, {.pooling = kiln::Pooling::last, .n_ctx = 64, .n_threads = 1}};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static Fixture fx;
  const kiln::Tokenizer& tok = fx.model->tokenizer();
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  kiln::server::Defaults defaults;
  try {
    const kiln::server::json j = kiln::server::parse_body(body);
    if (data[0] % 6 >= 4) {  // embeddings: every input a non-empty list of vocabulary ids within the context
      const kiln::server::EmbeddingRequest r = data[0] % 6 == 4
                                                   ? kiln::server::parse_openai_embedding(j, fx.embedder, tok.n_vocab())
                                                   : kiln::server::parse_ollama_embed(j, fx.embedder);
      if (r.inputs.empty() || r.dimensions > fx.embedder.dim()) __builtin_trap();
      for (const auto& in : r.inputs) {
        if (in.empty() || in.size() > fx.embedder.max_tokens()) __builtin_trap();
        for (int32_t t : in)
          if (t < 0 || t >= tok.n_vocab()) __builtin_trap();
      }
      return 0;
    }
    kiln::server::ParsedRequest p;
    switch (data[0] % 6) {
      case 0: p = kiln::server::parse_completion(j, tok, defaults); break;
      case 1: p = kiln::server::parse_chat(j, tok, fx.chat, defaults); break;
      case 2: p = kiln::server::parse_ollama_generate(j, tok, fx.chat, defaults); break;
      default: p = kiln::server::parse_ollama_chat(j, tok, fx.chat, defaults); break;
    }
    for (int32_t t : p.request.prompt)
      if (t < 0 || t >= tok.n_vocab()) __builtin_trap();  // a parsed prompt holds only vocabulary ids
    kiln::validate(p.request.sampling);  // and sampling settings in range (throws otherwise)
  } catch (const kiln::server::ApiError&) {
  }
  return 0;
}
