// POST /v1/embeddings (OpenAI, as llama-server answers it) and /api/embed (ollama):
// vectors from the EmbeddingService's Embedder, one request at a time, normalised.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>

#include "server/embedding_api.h"
#include "server/routes.h"
#include "util/json_number.h"

namespace kiln::server {

std::vector<std::vector<float>> EmbeddingService::embed(std::span<const std::vector<int32_t>> inputs) {
  struct Waiting {
    std::atomic<int>& n;
    ~Waiting() { --n; }
  };
  // One runs, max_waiting_ wait: as --max-queue bounds the completions waiting for a slot.
  if (++waiting_ > max_waiting_ + 1) {
    --waiting_;
    throw QueueFullError("the server has " + std::to_string(max_waiting_) + " embedding requests waiting (--max-queue)");
  }
  Waiting w{waiting_};
  std::lock_guard<std::mutex> lock(mu_);
  return embedder_.embed_tokens(inputs);
}

namespace {

static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");

// The tokens of a text, or a 400 naming it when it does not fit.
std::vector<int32_t> text_tokens(const Embedder& e, const json& v, const std::string& field) {
  if (!v.is_string()) bad(field, field + " must be a string, got " + v.dump());
  const std::string& text = v.get_ref<const std::string&>();
  if (text.empty()) bad(field, field + " is an empty string");
  return e.tokenize(text);
}

void check_length(const Embedder& e, const std::vector<int32_t>& tokens, const std::string& field) {
  if (tokens.empty()) bad(field, field + " has no tokens");
  if (tokens.size() > e.max_tokens())
    bad(field, field + " is " + std::to_string(tokens.size()) + " tokens, more than the context of " +
                   std::to_string(e.max_tokens()) + " tokens (start the server with a larger -c; texts are never cut)");
}

std::vector<int32_t> token_ids(const json& v, int32_t n_vocab, const std::string& field) {
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    try {
      out.push_back((int32_t)json_integer(v[i], at, 0, n_vocab - 1));
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      bad(at, e.what());
    }
  }
  return out;
}

bool all_numbers(const json& v) {
  for (const json& x : v)
    if (!x.is_number()) return false;
  return true;
}

const json& input_of(const json& body) {
  const json* in = member(body, "input");
  if (!in) bad("input", "input is missing");
  if (in->is_array() && in->empty()) bad("input", "input must not be an empty list");
  if (in->is_array() && in->size() > kMaxEmbeddingInputs)
    bad("input", "input has " + std::to_string(in->size()) + " items, more than " + std::to_string(kMaxEmbeddingInputs));
  return *in;
}

// `text`'s tokens cut to `max`, keeping the special tokens the tokenizer puts at the end of
// every text (BERT's [SEP], an EOS) so that a truncated text ends as a whole one does.
std::vector<int32_t> truncated(const Embedder& e, std::vector<int32_t> tokens) {
  const size_t max = e.max_tokens();
  if (tokens.size() <= max) return tokens;
  const std::vector<int32_t> affixes = e.tokenize("");  // e.g. [CLS] [SEP]: the prefix and the suffix
  // The longest suffix of the affixes that ends the text, whatever precedes it being the prefix.
  size_t suffix = 0;
  for (size_t k = affixes.size(); k > 0 && affixes.size() <= tokens.size(); --k) {
    const bool ends = std::equal(affixes.end() - long(k), affixes.end(), tokens.end() - long(k));
    const bool starts = std::equal(affixes.begin(), affixes.end() - long(k), tokens.begin());
    if (ends && starts) {
      suffix = k;
      break;
    }
  }
  if (suffix >= max) suffix = 0;
  std::vector<int32_t> out(tokens.begin(), tokens.begin() + long(max - suffix));
  out.insert(out.end(), tokens.end() - long(suffix), tokens.end());
  return out;
}

json model_field(const json& body) {
  const json* m = member(body, "model");
  if (m && !m->is_string()) bad("model", "model must be a string, got " + m->dump());
  return m ? *m : json(nullptr);
}

EmbeddingService& embeddings_of(Backend& b) {
  if (!b.embeddings)
    throw ApiError(501, "this server does not compute embeddings: start it with --embeddings", "not_supported_error");
  if (b.embeddings->embedder().pooling() == Pooling::none)
    bad("", "pooling 'none' gives one vector per token, which these endpoints cannot return: start the server with "
            "--pooling mean, cls or last");
  return *b.embeddings;
}

int32_t total_tokens(const EmbeddingRequest& r) {
  size_t n = 0;
  for (const auto& in : r.inputs) n += in.size();
  return int32_t(n);
}

std::vector<std::vector<float>> run(EmbeddingService& svc, const EmbeddingRequest& r) {
  try {
    return svc.embed(r.inputs);
  } catch (const QueueFullError&) {
    throw;
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {  // inputs are checked before: this is the model failing
    throw ApiError(500, e.what(), "server_error");
  }
}

void openai_embeddings(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  Backend& b = state.ready();
  EmbeddingService& svc = embeddings_of(b);
  const json body = parse_body(req.body);
  model_field(body);
  const EmbeddingRequest r = parse_openai_embedding(body, svc.embedder(), b.tokenizer.n_vocab());
  std::vector<std::vector<float>> vectors = run(svc, r);
  finish_vectors(vectors, r.normalize, r.dimensions);
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    item["embedding"] = r.base64 ? json(base64_floats(vectors[i])) : json(vectors[i]);
    data.push_back(std::move(item));
  }
  const int32_t n = total_tokens(r);
  reply_json(res, {{"object", "list"},
                   {"data", std::move(data)},
                   {"model", b.info.name},
                   {"usage", {{"prompt_tokens", n}, {"total_tokens", n}}}});
}

void ollama_embed(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const auto start = std::chrono::steady_clock::now();
  Backend& b = state.ready();
  EmbeddingService& svc = embeddings_of(b);
  const json body = parse_body(req.body);
  const json model = model_field(body);
  const EmbeddingRequest r = parse_ollama_embed(body, svc.embedder());
  std::vector<std::vector<float>> vectors = run(svc, r);
  finish_vectors(vectors, 2, 0);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  reply_json(res, {{"model", model.is_string() ? model.get<std::string>() : b.info.name},
                   {"embeddings", vectors},
                   {"total_duration", ns},
                   {"load_duration", 0},
                   {"prompt_eval_count", total_tokens(r)}});
}

}  // namespace

EmbeddingRequest parse_openai_embedding(const json& body, const Embedder& embedder, int32_t n_vocab) {
  EmbeddingRequest r;
  const json& in = input_of(body);
  if (in.is_string()) {
    r.inputs.push_back(text_tokens(embedder, in, "input"));
    check_length(embedder, r.inputs.back(), "input");
  } else if (in.is_array() && all_numbers(in)) {  // one list of token ids
    r.inputs.push_back(token_ids(in, n_vocab, "input"));
    check_length(embedder, r.inputs.back(), "input");
  } else if (in.is_array()) {
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string field = "input[" + std::to_string(i) + "]";
      if (in[i].is_array()) {
        if (in[i].empty()) bad(field, field + " is an empty list of token ids");
        r.inputs.push_back(token_ids(in[i], n_vocab, field));
      } else if (in[i].is_string()) {
        r.inputs.push_back(text_tokens(embedder, in[i], field));
      } else {
        bad(field, field + " must be a string or a list of token ids, got " + in[i].dump());
      }
      check_length(embedder, r.inputs.back(), field);
    }
  } else {
    bad("input", "input must be a string, a list of strings, a list of token ids or a list of such lists, got " + in.dump());
  }
  if (const json* f = member(body, "encoding_format")) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      bad("encoding_format", "encoding_format must be \"float\" or \"base64\", got " + f->dump());
    r.base64 = *f == "base64";
  }
  const auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t fallback) {
    const json* v = member(body, key);
    if (!v) return fallback;
    try {
      return json_integer(*v, key, lo, hi);
    } catch (const Error& e) {
      bad(key, e.what());
    }
  };
  r.dimensions = size_t(integer("dimensions", 1, int64_t(embedder.dim()), 0));
  r.normalize = int(integer("embd_normalize", -1, 1000, 2));
  return r;
}

EmbeddingRequest parse_ollama_embed(const json& body, const Embedder& embedder) {
  EmbeddingRequest r;
  bool truncate = true;
  if (const json* t = member(body, "truncate")) {
    if (!t->is_boolean()) bad("truncate", "truncate must be a boolean, got " + t->dump());
    truncate = t->get<bool>();
  }
  if (const json* o = member(body, "options"); o && !o->is_object())
    bad("options", "options must be an object, got " + o->dump());
  const json& in = input_of(body);
  const auto add = [&](const json& v, const std::string& field) {
    std::vector<int32_t> tokens = text_tokens(embedder, v, field);
    if (truncate) tokens = truncated(embedder, std::move(tokens));
    else if (tokens.size() > embedder.max_tokens())
      bad(field, field + " is " + std::to_string(tokens.size()) + " tokens, more than the context of " +
                     std::to_string(embedder.max_tokens()) + " tokens, and truncate is false");
    check_length(embedder, tokens, field);
    r.inputs.push_back(std::move(tokens));
  };
  if (in.is_string()) {
    add(in, "input");
  } else if (in.is_array()) {
    for (size_t i = 0; i < in.size(); ++i) add(in[i], "input[" + std::to_string(i) + "]");
  } else {
    bad("input", "input must be a string or a list of strings, got " + in.dump());
  }
  return r;
}

std::string base64_floats(std::span<const float> v) {
  static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = uint32_t(uint8_t(bytes[i])) << 16;
    if (n > 1) w |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (n > 2) w |= uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += n > 1 ? kAlphabet[(w >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[w & 63] : '=';
  }
  return out;
}

void finish_vectors(std::vector<std::vector<float>>& vectors, int normalize, size_t dimensions) {
  for (auto& v : vectors) {
    if (dimensions > 0 && dimensions < v.size()) v.resize(dimensions);
    normalize_embedding(v, normalize);
  }
}

void register_embedding_routes(httplib::Server& svr, ServerState& state) {
  svr.Post("/v1/embeddings", guarded([&state](const auto& req, auto& res) { openai_embeddings(state, req, res); }));
  svr.Post("/api/embed", guarded([&state](const auto& req, auto& res) { ollama_embed(state, req, res); }, true));
}

}  // namespace kiln::server
