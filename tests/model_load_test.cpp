// Model-level validation: a GGUF that parses can still describe a model that cannot run;
// each such file must end in one kiln::Error naming the file and what is wrong.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/model.h"
#include "kiln/session.h"
#include "model_gen/generate_model.h"
#include "test_util.h"

using namespace kiln;

namespace {

gguf::Writer tiny_writer() {
  static std::unique_ptr<gguf::File> vocab = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  gen::GenerateOptions o;
  o.shape = *gen::find_shape("tiny");
  o.type = TensorType::F16;
  return gen::build_model(o, *vocab);
}

std::string save(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = test::temp_dir() + "/" + name;
  test::write_file(path, std::string(bytes.begin(), bytes.end()));
  return path;
}

// Rewrites the type field of tensor `name` in the serialized file.
std::vector<uint8_t> with_tensor_type(std::vector<uint8_t> bytes, const std::string& name, TensorType type) {
  std::string needle(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle += name;
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end());
  size_t at = size_t(it - bytes.begin()) + needle.size();
  uint32_t n_dims;
  std::memcpy(&n_dims, &bytes[at], 4);
  at += 4 + 8 * n_dims;
  const uint32_t raw = static_cast<uint32_t>(type);
  std::memcpy(&bytes[at], &raw, 4);
  return bytes;
}

void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    Model::load(path);
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  }
}

}  // namespace

TEST(ModelLoad, TinyModelLoads) {
  auto m = Model::load(save("ok.gguf", tiny_writer().to_bytes()));
  EXPECT_EQ(m->config().arch, "llama");
  EXPECT_EQ(m->config().n_heads % m->config().n_kv_heads, 0u);
  EXPECT_EQ(m->layers.size(), m->config().n_layers);
  EXPECT_NE(m->output.data, m->token_embd.data);  // untied
}

TEST(ModelLoad, UnknownArchitecture) {
  auto w = tiny_writer();
  w.set("general.architecture", gguf::Value::of_string("mamba9"));
  expect_load_error(save("arch.gguf", w.to_bytes()), "unsupported architecture 'mamba9' (supported: llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, phi3, mpt, gpt-oss, mamba2, granitehybrid, bert, nomic-bert)");
}

TEST(ModelLoad, HyperparametersThatContradictTheTensors) {
  auto w = tiny_writer();
  w.set("llama.embedding_length", gguf::Value::of_u32(80));
  expect_load_error(save("dim.gguf", w.to_bytes()), "tensor 'token_embd.weight' has shape [72, 512], expected [80, 0]");

  auto h = tiny_writer();
  h.set("llama.attention.head_count", gguf::Value::of_u32(5));
  expect_load_error(save("heads.gguf", h.to_bytes()), "not a multiple of attention.head_count 5");

  auto s = tiny_writer();
  s.set("llama.block_count", gguf::Value::of_string("four"));
  expect_load_error(save("type.gguf", s.to_bytes()), "metadata 'llama.block_count' is string, expected an integer");

  auto l = tiny_writer();
  l.set("llama.block_count", gguf::Value::of_u32(7));
  expect_load_error(save("layers.gguf", l.to_bytes()), "missing tensor 'blk.");

  auto r = tiny_writer();
  r.set("llama.rope.dimension_count", gguf::Value::of_u32(17));
  expect_load_error(save("rope.gguf", r.to_bytes()), "rope.dimension_count 17");
}

TEST(ModelLoad, TensorTypesTheRuntimeCannotUse) {
  const auto bytes = tiny_writer().to_bytes();
  // I8 has one byte per element, so the patched tensor still lies inside the file.
  expect_load_error(save("i8.gguf", with_tensor_type(bytes, "blk.0.attn_q.weight", TensorType::I8)),
                    "tensor 'blk.0.attn_q.weight' has type I8, which kiln cannot compute yet");
  expect_load_error(save("norm.gguf", with_tensor_type(bytes, "blk.0.attn_norm.weight", TensorType::F16)),
                    "tensor 'blk.0.attn_norm.weight' is F16; norm weights must be F32");
}

TEST(ModelLoad, SessionRejectsBadTokensAndOverflowWithoutChangingState) {
  auto m = Model::load(save("ok2.gguf", tiny_writer().to_bytes()));
  SessionParams p;
  p.n_ctx = 8;
  Session s(*m, p);
  const int32_t ok[3] = {1, 2, 3};
  s.decode(ok);
  EXPECT_EQ(s.n_past(), 3);
  const int32_t bad[2] = {4, (int32_t)m->config().n_vocab};
  EXPECT_THROW(s.decode(bad), Error);
  const int32_t negative[1] = {-1};
  EXPECT_THROW(s.decode(negative), Error);
  const int32_t six[6] = {1, 2, 3, 4, 5, 6};
  try {
    s.decode(six);
    FAIL() << "context overflow not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context is full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.n_past(), 3);  // nothing was appended by the failed calls
  const int32_t five[5] = {1, 2, 3, 4, 5};
  EXPECT_EQ(s.decode(five).size(), m->config().n_vocab);
  EXPECT_EQ(s.n_past(), 8);
}
