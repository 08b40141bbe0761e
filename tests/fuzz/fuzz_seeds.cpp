// Seed files that run.sh cannot take from ../shared as they are:
//   fuzz_seeds llama2c MODELS_DIR OUT_DIR
//     llama2.c checkpoints in every layout kiln reads (legacy, version 1, version 2 with
//     shared and separate classifiers), from stories260K.bin's weights and from a tiny
//     model of random weights that stays well under the fuzzer's input size limit, plus
//     tok512.bin; each prefixed with the fuzz_llama2c selector byte.
//   fuzz_seeds tokenizer_json IN.json OUT [CONFIG.json]
//     IN trimmed to a few hundred vocabulary entries and merges (renumbered, still
//     loadable), prefixed with the fuzz_tokenizer_json flags byte, and CONFIG after a NUL.
// The real tokenizer.json files are 9 to 33 MB: libFuzzer would cut them to its maximum
// input length and seed nothing but invalid JSON.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_seeds: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, uint8_t selector, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.put(char(selector));
  out.write(bytes.data(), (std::streamsize)bytes.size());
  if (!out) {
    std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// --- llama2.c ---------------------------------------------------------------------------

struct Shape {
  int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

// A checkpoint's weights by role, each per-layer role holding its layers back to back.
struct Weights {
  Shape s;
  std::map<std::string, std::vector<float>> t;
};

uint64_t count(const Shape& s, const std::string& role) {
  const uint64_t d = s.dim, f = s.hidden, L = s.layers, V = s.vocab, kv = uint64_t(s.kv_heads) * (d / s.heads);
  if (role == "embd" || role == "cls") return V * d;
  if (role == "attn_norm" || role == "ffn_norm") return L * d;
  if (role == "wq" || role == "wo") return L * d * d;
  if (role == "wk" || role == "wv") return L * kv * d;
  if (role == "w1" || role == "w2" || role == "w3") return L * f * d;
  if (role == "final_norm") return d;
  return uint64_t(s.seq_len) * (d / s.heads);  // "rope": both tables
}

const std::vector<std::string> kLegacyOrder = {"embd", "attn_norm", "wq", "wk", "wv", "wo", "ffn_norm",
                                               "w1",   "w2",        "w3", "final_norm", "rope"};
const std::vector<std::string> kExportNorms = {"attn_norm", "ffn_norm", "final_norm"};
const std::vector<std::string> kExportMatrices = {"embd", "wq", "wk", "wv", "wo", "w1", "w2", "w3"};

void put_i32(std::string& b, int32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_f32(std::string& b, const std::vector<float>& v) {
  b.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

Weights read_legacy(const std::string& bytes) {
  Weights w;
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
  w.s = {h[0], h[1], h[2], h[3], h[4], std::abs(h[5]), h[6]};
  size_t pos = 28;
  std::vector<std::string> order = kLegacyOrder;
  if (h[5] < 0) order.push_back("cls");
  for (const std::string& role : order) {
    std::vector<float> v(count(w.s, role));
    if (pos + v.size() * 4 > bytes.size()) {
      std::fprintf(stderr, "fuzz_seeds: legacy checkpoint ends early\n");
      std::exit(1);
    }
    std::memcpy(v.data(), bytes.data() + pos, v.size() * 4);
    pos += v.size() * 4;
    w.t[role] = std::move(v);
  }
  if (!w.t.count("cls")) w.t["cls"] = w.t.at("embd");  // for the layouts with a separate one
  return w;
}

std::string legacy(const Weights& w, bool shared) {
  std::string b;
  for (int32_t v : {w.s.dim, w.s.hidden, w.s.layers, w.s.heads, w.s.kv_heads, shared ? w.s.vocab : -w.s.vocab, w.s.seq_len})
    put_i32(b, v);
  for (const std::string& role : kLegacyOrder) put_f32(b, w.t.at(role));
  if (!shared) put_f32(b, w.t.at("cls"));
  return b;
}

// export.py's layout: version 1 float32; version 2 int8 groups, each followed (per
// tensor) by its float32 scales.
std::string exported(const Weights& w, int version, bool shared, int32_t group) {
  std::string b;
  put_i32(b, 0x616b3432);
  put_i32(b, version);
  for (int32_t v : {w.s.dim, w.s.hidden, w.s.layers, w.s.heads, w.s.kv_heads, w.s.vocab, w.s.seq_len}) put_i32(b, v);
  b.push_back(shared ? 1 : 0);
  if (version == 2) put_i32(b, group);
  b.resize(256, '\0');
  for (const std::string& role : kExportNorms) put_f32(b, w.t.at(role));
  std::vector<std::string> matrices = kExportMatrices;
  if (!shared) matrices.push_back("cls");
  for (const std::string& role : matrices) {
    const std::vector<float>& all = w.t.at(role);
    // Per-layer roles are separate tensors in version 2: each gets its own scales.
    const uint64_t per = role == "embd" || role == "cls" ? all.size() : all.size() / uint64_t(w.s.layers);
    for (uint64_t off = 0; off < all.size(); off += per) {
      const std::vector<float> v(all.begin() + long(off), all.begin() + long(off + per));
      if (version == 1) {
        put_f32(b, v);
        continue;
      }
      std::vector<float> scales;
      for (uint64_t i = 0; i < v.size(); i += uint64_t(group)) {
        float m = 0;
        for (uint64_t k = i; k < i + uint64_t(group); ++k) m = std::max(m, std::fabs(v[k]));
        scales.push_back(m > 0 ? m / 127.0f : 1.0f);
        for (uint64_t k = i; k < i + uint64_t(group); ++k) b.push_back(char(int8_t(std::nearbyint(v[k] / scales.back()))));
      }
      put_f32(b, scales);
    }
  }
  return b;
}

Weights tiny_model() {
  Weights w;
  w.s = {8, 16, 1, 2, 1, 512, 16};  // vocabulary: tok512.bin's
  uint32_t x = 12345;
  std::vector<std::string> roles = kLegacyOrder;
  roles.push_back("cls");
  for (const std::string& role : roles) {
    std::vector<float> v(count(w.s, role));
    for (float& f : v) {
      x = x * 1664525u + 1013904223u;
      f = role.find("norm") != std::string::npos ? 1.0f : float(int32_t(x >> 8) % 2000) / 4000.0f;
    }
    w.t[role] = std::move(v);
  }
  return w;
}

int llama2c(const std::string& models, const std::string& out) {
  // Selector bit 0: checkpoint (0) or tokenizer.bin (1); bit 1: size the file to its header.
  const std::string real = read_file(models + "/stories260K.bin");
  write_file(out + "/stories260K.bin", 0, real);
  write_file(out + "/tok512.bin", 1, read_file(models + "/tok512.bin"));
  const Weights big = read_legacy(real);
  write_file(out + "/stories260K.v1.bin", 0, exported(big, 1, false, 0));
  write_file(out + "/stories260K.v2.bin", 0, exported(big, 2, true, 64));
  Weights tiny = tiny_model();
  write_file(out + "/tiny.legacy.bin", 0, legacy(tiny, true));
  write_file(out + "/tiny.legacy-cls.bin", 2, legacy(tiny, false));
  write_file(out + "/tiny.v1.bin", 0, exported(tiny, 1, true, 0));
  write_file(out + "/tiny.v1-cls.bin", 2, exported(tiny, 1, false, 0));
  write_file(out + "/tiny.v2-g8.bin", 0, exported(tiny, 2, true, 8));
  write_file(out + "/tiny.v2-g4-cls.bin", 2, exported(tiny, 2, false, 4));
  return 0;
}

// --- tokenizer.json ---------------------------------------------------------------------

int tokenizer_json(const std::string& in, const std::string& out, const std::string& config) {
  json j = json::parse(read_file(in));
  json& model = j.at("model");
  const json& vocab = model.at("vocab");
  const json& merges = model.at("merges");
  auto merge_parts = [](const json& m) {
    if (m.is_array()) return std::pair(m.at(0).get<std::string>(), m.at(1).get<std::string>());
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ', 1);
    return std::pair(s.substr(0, sp), s.substr(sp + 1));
  };
  // Kept: the first ids (bytes or specials in every family), byte tokens, and the parts
  // and results of the first merges; then the merges whose three tokens all stay.
  std::set<std::string> keep;
  for (const auto& [text, id] : vocab.items())
    if (id.get<int64_t>() < 300 || (text.size() == 6 && text.compare(0, 3, "<0x") == 0)) keep.insert(text);
  const size_t n_merges = std::min<size_t>(merges.size(), 300);
  for (size_t i = 0; i < n_merges; ++i) {
    const auto [a, b] = merge_parts(merges[i]);
    for (const std::string& t : {a, b, a + b})
      if (vocab.contains(t)) keep.insert(t);
  }
  json kept_merges = json::array();
  for (size_t i = 0; i < n_merges; ++i) {
    const auto [a, b] = merge_parts(merges[i]);
    if (keep.count(a) && keep.count(b) && keep.count(a + b)) kept_merges.push_back(merges[i]);
  }
  // Added tokens: the first few and those the post-processor names; ids renumbered in
  // their old order so that no gap of placeholders is left.
  std::set<std::string> named;
  if (j.contains("post_processor") && j.at("post_processor").is_object())
    for (const json& step : j.at("post_processor").value("single", json::array()))
      if (step.contains("SpecialToken")) named.insert(step.at("SpecialToken").at("id").get<std::string>());
  std::vector<json> added;
  for (const json& a : j.value("added_tokens", json::array()))
    if (added.size() < 8 || named.count(a.at("content").get<std::string>()) || a.at("id").get<int64_t>() < 300)
      added.push_back(a);
  std::map<int64_t, int64_t> renumber;
  for (const auto& [text, id] : vocab.items())
    if (keep.count(text)) renumber[id.get<int64_t>()] = 0;
  for (const json& a : added) renumber[a.at("id").get<int64_t>()] = 0;
  int64_t next = 0;
  for (auto& [old_id, new_id] : renumber) new_id = next++;
  json new_vocab = json::object();
  for (const auto& [text, id] : vocab.items())
    if (keep.count(text)) new_vocab[text] = renumber.at(id.get<int64_t>());
  json new_added = json::array();
  for (json a : added) {
    a["id"] = renumber.at(a.at("id").get<int64_t>());
    new_added.push_back(std::move(a));
  }
  model["vocab"] = std::move(new_vocab);
  model["merges"] = std::move(kept_merges);
  j["added_tokens"] = std::move(new_added);
  std::string bytes = j.dump();
  if (!config.empty()) {
    // Only the keys kiln reads: the real configs carry large chat templates.
    const json c = json::parse(read_file(config));
    json small = json::object();
    for (const char* k : {"bos_token", "eos_token", "pad_token", "add_bos_token", "add_eos_token"})
      if (c.contains(k)) small[k] = c.at(k);
    bytes += '\0';
    bytes += small.dump();
  }
  write_file(out, 0, bytes);
  std::fprintf(stderr, "fuzz_seeds: %s: %zu tokens, %zu merges, %zu bytes\n", out.c_str(), size_t(next),
               model.at("merges").size(), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "llama2c" && argc == 4) return llama2c(argv[2], argv[3]);
  if (mode == "tokenizer_json" && (argc == 4 || argc == 5)) return tokenizer_json(argv[2], argv[3], argc == 5 ? argv[4] : "");
  std::fprintf(stderr, "usage: fuzz_seeds llama2c MODELS_DIR OUT_DIR | tokenizer_json IN.json OUT [CONFIG.json]\n");
  return 2;
}
