// llama2.c checkpoints: ../shared/models/stories260K.bin (legacy header) and the same
// weights re-written here in export.py's version 1 (float32) and version 2 (int8 groups)
// layouts, compared tensor by tensor with stories260K.gguf and by generated text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "kiln/tokenizer.h"
#include "test_util.h"

namespace kiln {
namespace {

std::string gguf_path() { return test::shared_path("models/stories260K.gguf"); }
std::unique_ptr<Tokenizer> tok512() { return Tokenizer::from_file(test::shared_path("models/tok512.bin")); }

std::vector<float> tensor(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw Error("missing " + name);
  std::vector<float> v(t->n_elements);
  std::memcpy(v.data(), t->data, t->n_bytes);
  return v;
}

// The checkpoint's tensors in export.py's order (version 1 and 2).
struct Weights {
  std::vector<std::vector<float>> norms, matrices;  // matrices: embedding first
};

Weights export_order(const gguf::File& f, int n_layers) {
  Weights w;
  auto layers = [&](const char* name, std::vector<std::vector<float>>& out) {
    for (int l = 0; l < n_layers; ++l) out.push_back(tensor(f, "blk." + std::to_string(l) + "." + name + ".weight"));
  };
  layers("attn_norm", w.norms);
  layers("ffn_norm", w.norms);
  w.norms.push_back(tensor(f, "output_norm.weight"));
  w.matrices.push_back(tensor(f, "token_embd.weight"));
  for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up"}) layers(m, w.matrices);
  return w;
}

struct Bytes {
  std::string s;
  template <typename T>
  void put(T v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void put(const std::vector<float>& v) { s.append(reinterpret_cast<const char*>(v.data()), v.size() * 4); }
};

// stories260K: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, vocab 512, seq_len 512.
void header(Bytes& b, int version, bool shared) {
  b.put<uint32_t>(0x616b3432);
  b.put<int32_t>(version);
  for (int32_t v : {64, 172, 5, 8, 4, 512, 512}) b.put(v);
  b.put<uint8_t>(shared ? 1 : 0);
}
void pad_to_256(Bytes& b) { b.s.resize(256, '\0'); }

// Symmetric int8 per group of 64, as export.py's quantize_q80; returns what run.c
// dequantizes (q * scale).
std::vector<float> quantize(Bytes& b, const std::vector<float>& w) {
  const size_t g = 64;
  std::vector<int8_t> q(w.size());
  std::vector<float> scales, back(w.size());
  for (size_t i = 0; i < w.size(); i += g) {
    float wmax = 0;
    for (size_t k = i; k < i + g; ++k) wmax = std::max(wmax, std::fabs(w[k]));
    const float scale = wmax / 127.0f;
    scales.push_back(scale);
    for (size_t k = i; k < i + g; ++k) {
      q[k] = (int8_t)std::nearbyint(w[k] / scale);
      back[k] = (float)q[k] * scale;
    }
  }
  b.s.append(reinterpret_cast<const char*>(q.data()), q.size());
  b.put(scales);
  return back;
}

// Every tensor of the loaded model against `expected` (name -> values).
void expect_tensors(const Model& m, const std::function<std::vector<float>(const std::string&)>& expected) {
  size_t n = 0;
  for (const auto& t : m.file().tensors()) {
    std::vector<float> got(t.n_elements);
    std::memcpy(got.data(), t.data, t.n_bytes);
    EXPECT_EQ(got, expected(t.name)) << t.name;
    ++n;
  }
  EXPECT_EQ(n, 3u + 5u * 9u);
}

TEST(Llama2c, LegacyCheckpointIsTheGgufModel) {
  auto ref = gguf::File::open(gguf_path());
  auto m = Model::load_llama2c(test::shared_path("models/stories260K.bin"), tok512());
  expect_tensors(*m, [&](const std::string& name) { return tensor(*ref, name); });
  auto g = Model::load(gguf_path());
  EXPECT_EQ(m->config().n_layers, g->config().n_layers);
  EXPECT_EQ(m->config().n_heads, g->config().n_heads);
  EXPECT_EQ(m->config().n_kv_heads, g->config().n_kv_heads);
  EXPECT_EQ(m->config().n_rot, g->config().n_rot);
  EXPECT_EQ(m->config().rms_eps, g->config().rms_eps);
  EXPECT_EQ(m->tokenizer().vocab().tokens, g->tokenizer().vocab().tokens);
}

TEST(Llama2c, WithoutATokenizerTheErrorSaysWhatToGive) {
  try {
    Model::load(test::shared_path("models/stories260K.bin"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama2.c checkpoint carries no vocabulary"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos) << e.what();
  }
}

// Writes the version 1 (unshared classifier) and version 2 (int8) files the test needs.
struct Exports {
  std::string v1, v2;
  std::map<std::string, std::vector<float>> v2_values;  // what the v2 loader must produce
};

const Exports& exports() {
  static const Exports e = [] {
    Exports e;
    auto f = gguf::File::open(gguf_path());
    const Weights w = export_order(*f, 5);
    const std::string dir = test::temp_dir();

    Bytes v1;
    header(v1, 1, /*shared=*/false);
    pad_to_256(v1);
    for (const auto& t : w.norms) v1.put(t);
    for (const auto& t : w.matrices) v1.put(t);
    v1.put(tensor(*f, "output.weight"));
    e.v1 = dir + "/stories260K.v1.bin";
    test::write_file(e.v1, v1.s);

    Bytes v2;
    header(v2, 2, /*shared=*/true);
    v2.put<int32_t>(64);
    pad_to_256(v2);
    for (const auto& t : w.norms) v2.put(t);
    std::vector<std::vector<float>> back;
    for (const auto& t : w.matrices) back.push_back(quantize(v2, t));
    e.v2 = dir + "/stories260K.v2.bin";
    test::write_file(e.v2, v2.s);
    // Norms stay float32; matrices in export order map back to their names.
    for (const auto& t : f->tensors()) e.v2_values[t.name] = tensor(*f, t.name);
    size_t i = 0;
    e.v2_values["token_embd.weight"] = e.v2_values["output.weight"] = back[i++];
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up"})
      for (int l = 0; l < 5; ++l) e.v2_values["blk." + std::to_string(l) + "." + m + ".weight"] = back[i++];
    return e;
  }();
  return e;
}

TEST(Llama2c, Version1CheckpointIsTheGgufModel) {
  auto ref = gguf::File::open(gguf_path());
  auto m = Model::load_llama2c(exports().v1, tok512());
  expect_tensors(*m, [&](const std::string& name) { return tensor(*ref, name); });
}

TEST(Llama2c, Version2CheckpointDequantizesItsGroups) {
  auto m = Model::load_llama2c(exports().v2, tok512());
  expect_tensors(*m, [&](const std::string& name) { return exports().v2_values.at(name); });
}

std::string golden(const std::string& name) {
  return test::trim(test::read_file(test::shared_path("models/expected/" + name)));
}

// kiln run on each checkpoint gives the GGUF's golden text.
TEST(Llama2c, RunGivesTheGoldenText) {
  const std::string kiln = test::shell_quote(test::kiln_binary());
  const std::string tok = " --tokenizer " + test::shell_quote(test::shared_path("models/tok512.bin"));
  for (const std::string& bin : {test::shared_path("models/stories260K.bin"), exports().v1}) {
    auto r = test::run_command(kiln + " run " + test::shell_quote(bin) + " 'Once upon a time' -n 100 --temp 0 --quiet" + tok);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(test::trim(r.out), golden("stories260K.once-upon-a-time.greedy100.txt")) << bin;
  }
  auto bos = test::run_command(kiln + " run " + test::shell_quote(test::shared_path("models/stories260K.bin")) +
                               " '' -n 200 --temp 0 --quiet" + tok);
  ASSERT_EQ(bos.exit_code, 0) << bos.err;
  EXPECT_EQ(test::trim(bos.out), golden("stories260K.bos.greedy200.txt"));
  auto none = test::run_command(kiln + " run " + test::shell_quote(test::shared_path("models/stories260K.bin")) + " hi");
  test::expect_one_line_error(none, 1, "--tokenizer");
}

}  // namespace
}  // namespace kiln
