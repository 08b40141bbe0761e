// Embeddings (kiln/embedding.h, kiln embed) against llama.cpp's llama-embedding: a tiny
// random-weight BERT, nomic-bert and Qwen3 embedder from kiln's generator (byte-identical to the file llama.cpp ran: its
// sha256 is committed) must give llama-embedding's vectors for every text and pooling
// (cosine >= 0.9999 after euclidean normalisation), whichever texts share a batch; and
// `kiln embed` must print them in llama-embedding's formats and refuse bad input in one
// line. tests/data/embeddings/README.md says how the references were made.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/embedding.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/model.h"
#include "model_gen/generate_model.h"
#include "sha256.h"
#include "test_util.h"

using namespace kiln::test;

namespace {

std::string data_path(const std::string& name) { return std::string(KILN_SOURCE_DIR) + "/tests/data/embeddings/" + name; }

// The file of one of tests/data/embeddings/README.md's kiln-gen lines (the shape names
// it), written once: the encoders with BGE's WordPiece vocabulary, the decoder with
// Qwen3's own (tied output, as the qwen3-tiny family reference).
const std::string& reference_file(const std::string& shape) {
  static std::map<std::string, std::string> written;
  auto it = written.find(shape);
  if (it == written.end()) {
    std::vector<uint8_t> bytes;
    if (shape.starts_with("qwen3")) {
      const auto tok = kiln::Tokenizer::from_file(shared_path("tokenizers/qwen3-hf/tokenizer.json"));
      bytes = kiln::gen::build_model(kiln::gen::peaky_options(shape, 7, /*tie_output=*/true), tok->vocab()).to_bytes();
    } else {
      const auto vocab = kiln::gguf::File::open(shared_path("vocab/ggml-vocab-bert-bge.gguf"));
      bytes = kiln::gen::build_model(kiln::gen::peaky_options(shape, 7), *vocab).to_bytes();
    }
    EXPECT_EQ(sha256_hex(bytes.data(), bytes.size()), trim(read_file(data_path(shape + ".gguf.sha256"))))
        << "the generator no longer writes the file llama.cpp evaluated";
    const std::string p = temp_dir() + "/" + shape + ".gguf";
    write_file(p, std::string(bytes.begin(), bytes.end()));
    it = written.emplace(shape, p).first;
  }
  return it->second;
}
const std::string& bert_tiny() { return reference_file("bert-tiny"); }

// The texts llama-embedding embedded, one a line.
std::vector<std::string> reference_texts() {
  std::vector<std::string> texts;
  std::string content = read_file(data_path("texts.txt")), line;
  std::istringstream in(content);
  while (std::getline(in, line)) texts.push_back(line);
  return texts;
}

// llama-embedding's --embd-output-format json: data[i].embedding.
std::vector<std::vector<float>> json_vectors(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  std::vector<std::vector<float>> out;
  for (const auto& item : j.at("data")) out.push_back(item.at("embedding").get<std::vector<float>>());
  return out;
}

std::vector<std::vector<float>> normalized(std::vector<std::vector<float>> v, int norm = 2) {
  for (auto& x : v) kiln::normalize_embedding(x, norm);
  return v;
}

struct Case {
  const char* shape;    // kiln-gen --shape, and the stem of the reference files
  const char* pooling;  // llama-embedding --pooling
  kiln::Pooling file_pooling;
  bool causal = false;
};

class EmbeddingReference : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingReference, MatchesLlamaEmbedding) {
  const std::string shape = GetParam().shape, pooling = GetParam().pooling;
  const auto model = kiln::Model::load(reference_file(shape));
  EXPECT_EQ(model->config().pooling, GetParam().file_pooling);  // the file's pooling_type
  EXPECT_EQ(model->config().causal, GetParam().causal);
  const auto reference = json_vectors(read_file(data_path(shape + "." + pooling + ".json")));
  const auto texts = reference_texts();
  kiln::Embedder embedder(*model, {.pooling = kiln::pooling_from_name(pooling)});
  const auto ours = normalized(embedder.embed(texts));
  ASSERT_EQ(ours.size(), reference.size());
  double worst = 1;
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_EQ(ours[i].size(), 64u);
    const double cos = kiln::cosine_similarity(ours[i], reference[i]);
    worst = std::min(worst, cos);
    EXPECT_GE(cos, 0.9999) << pooling << " vector " << i;
  }
  std::printf("[ %s ] pooling %s: %zu vectors, lowest cosine to llama-embedding %.8f\n", shape.c_str(),
              pooling.c_str(), ours.size(), worst);
}

// bert: learned positions, GELU with biases; nomic-bert: rotary positions, fused QKV,
// SwiGLU; qwen3 (Qwen3-Embedding's kind): a causal decoder pooled at its last token.
INSTANTIATE_TEST_SUITE_P(Files, EmbeddingReference,
                         ::testing::Values(Case{"bert-tiny", "cls", kiln::Pooling::cls},
                                           Case{"bert-tiny", "mean", kiln::Pooling::cls},
                                           Case{"bert-tiny", "last", kiln::Pooling::cls},
                                           Case{"bert-tiny", "none", kiln::Pooling::cls},
                                           Case{"nomic-bert-tiny", "mean", kiln::Pooling::mean},
                                           Case{"nomic-bert-tiny", "cls", kiln::Pooling::mean},
                                           Case{"nomic-bert-tiny", "none", kiln::Pooling::mean},
                                           // A decoder embedder: causal attention, output norm, EOS last.
                                           Case{"qwen3-embedding-tiny", "last", kiln::Pooling::last, true},
                                           Case{"qwen3-embedding-tiny", "mean", kiln::Pooling::last, true}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.shape) + "_" + info.param.pooling;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

// The same tokens as llama.cpp (llama-embedding --verbose-prompt): WordPiece's [CLS] ...
// [SEP]; Qwen's BPE without BOS and with EOS (add_eos_token).
TEST(Embedding, TokenizesAsLlamaCpp) {
  for (const char* shape : {"bert-tiny", "qwen3-embedding-tiny"}) {
    const auto model = kiln::Model::load(reference_file(shape));
    kiln::Embedder embedder(*model);
    const auto texts = reference_texts();
    std::istringstream in(read_file(data_path(std::string(shape) + ".tokens.txt")));
    std::string line;
    size_t i = 0;
    for (; std::getline(in, line); ++i) {
      ASSERT_LT(i, texts.size());
      std::vector<int32_t> expect;
      std::istringstream ids(line);
      for (int32_t id; ids >> id;) expect.push_back(id);
      EXPECT_EQ(embedder.tokenize(texts[i]), expect) << shape << ": " << texts[i];
    }
    EXPECT_EQ(i, texts.size()) << shape;
  }
}

// A text's vector is the same bits alone, among others, or batched with others in
// another order: each text is its own sequence, attending only to itself.
TEST(Embedding, BatchInvariant) {
  const auto texts = reference_texts();
  for (const char* shape : {"bert-tiny", "qwen3-embedding-tiny"}) {
    const auto m = kiln::Model::load(reference_file(shape));
    for (const char* pooling : {"mean", "none"}) {
      kiln::Embedder embedder(*m, {.pooling = kiln::pooling_from_name(pooling)});
      const auto together = embedder.embed(texts);
      std::vector<std::vector<float>> alone;
      for (const std::string& t : texts)
        for (auto& v : embedder.embed(std::span(&t, 1))) alone.push_back(std::move(v));
      EXPECT_EQ(together, alone) << shape << " " << pooling;
    }
  }
  const auto model = kiln::Model::load(bert_tiny());
  // A context of 32 tokens (the longest text has 31): the texts split over several
  // forward passes.
  kiln::Embedder small(*model, {.pooling = kiln::Pooling::mean, .n_ctx = 32});
  kiln::Embedder large(*model, {.pooling = kiln::Pooling::mean});
  EXPECT_EQ(small.embed(texts), large.embed(texts));
}

TEST(Embedding, NormalizeAsLlamaCpp) {
  const auto norm = [](std::vector<float> v, int n) {
    kiln::normalize_embedding(v, n);
    return v;
  };
  EXPECT_EQ(norm({3, -4}, 2), (std::vector<float>{0.6f, -0.8f}));
  EXPECT_EQ(norm({3, -4}, -1), (std::vector<float>{3, -4}));
  EXPECT_EQ(norm({1, -3}, 1), (std::vector<float>{0.25f, -0.75f}));
  EXPECT_EQ(norm({1, -2}, 0), (std::vector<float>{16380, -32760}));
  const auto p3 = norm({1, 2}, 3);
  EXPECT_NEAR(std::cbrt(std::pow(p3[0], 3) + std::pow(p3[1], 3)), 1.0, 1e-6);
  EXPECT_EQ(norm({0, 0}, 2), (std::vector<float>{0, 0}));
}

TEST(Embedding, RefusesTextsLongerThanTheContext) {
  const auto model = kiln::Model::load(bert_tiny());
  kiln::Embedder embedder(*model, {.pooling = std::nullopt, .n_ctx = 8});
  const std::vector<std::string> texts = {"short", "a text of many more words than the eight tokens allowed here"};
  try {
    embedder.embed(texts);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 1 has"), std::string::npos) << e.what();
  }
  // Learned positions end at context_length (512).
  EXPECT_THROW(kiln::Embedder(*model, {.pooling = std::nullopt, .n_ctx = 1024}), kiln::Error);
}

// kiln embed prints llama-embedding's formats, with the vectors the API gives.
TEST(EmbedCommand, FormatsAndValues) {
  const std::string m = shell_quote(bert_tiny());
  const auto texts = reference_texts();
  const auto model = kiln::Model::load(bert_tiny());
  kiln::Embedder embedder(*model);
  const auto expect = normalized(embedder.embed(std::vector<std::string>(texts.begin(), texts.begin() + 2)));

  const CommandResult json = run_command(kiln_binary() + " embed " + m + " " + shell_quote(texts[0]) + " " +
                                         shell_quote(texts[1]) + " --embd-output-format json --quiet");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_TRUE(json.out.starts_with("{\n  \"object\": \"list\",\n  \"data\": [\n    {\n      \"object\": \"embedding\",\n"
                                   "      \"index\": 0,\n      \"embedding\": ["))
      << json.out.substr(0, 200);
  const auto got = json_vectors(json.out);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    for (size_t d = 0; d < expect[i].size(); ++d) EXPECT_NEAR(got[i][d], expect[i][d], 1e-7);

  // -f: one text a line; array and raw formats.
  write_file(temp_dir() + "/texts.txt", texts[0] + "\n" + texts[1] + "\n");
  const CommandResult array =
      run_command(kiln_binary() + " embed " + m + " -f " + shell_quote(temp_dir() + "/texts.txt") + " --embd-output-format array -q");
  ASSERT_EQ(array.exit_code, 0) << array.err;
  EXPECT_EQ(nlohmann::json::parse(array.out).get<std::vector<std::vector<float>>>(), got);
  const CommandResult raw = run_command(kiln_binary() + " embed " + m + " -p " + shell_quote(texts[0] + "\n" + texts[1]) +
                                        " --embd-output-format raw -q");
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  std::istringstream lines(raw.out);
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    ASSERT_LT(i, 2u);
    std::istringstream values(line);
    std::vector<float> v;
    for (float x; values >> x;) v.push_back(x);
    EXPECT_EQ(v, got[i]);
  }
  // json+: the same vectors and their cosine similarity matrix.
  const CommandResult plus = run_command(kiln_binary() + " embed " + m + " " + shell_quote(texts[0]) + " " +
                                         shell_quote(texts[1]) + " --embd-output-format json+ -q");
  ASSERT_EQ(plus.exit_code, 0) << plus.err;
  EXPECT_EQ(json_vectors(plus.out), got);
  const auto sim = nlohmann::json::parse(plus.out).at("cosineSimilarity").get<std::vector<std::vector<float>>>();
  ASSERT_EQ(sim.size(), 2u);
  EXPECT_EQ(sim[0][0], 1.0f);
  EXPECT_NEAR(sim[0][1], kiln::cosine_similarity(got[0], got[1]), 0.006);
  // --embd-normalize 0: integers scaled to the int16 range.
  const CommandResult ints = run_command(kiln_binary() + " embed " + m + " " + shell_quote(texts[0]) +
                                         " --embd-normalize 0 --embd-output-format raw -q");
  ASSERT_EQ(ints.exit_code, 0) << ints.err;
  EXPECT_EQ(ints.out.find('.'), std::string::npos);
  EXPECT_NE(ints.out.find("32760"), std::string::npos);
}

// kiln info names what sets an encoder apart.
TEST(EmbedCommand, InfoDescribesTheEncoder) {
  const CommandResult r = run_command(kiln_binary() + " info " + shell_quote(bert_tiny()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* part : {"architecture: bert", "positions:    learned (position_embd, 512)", "GELU MLP",
                           "post-norm blocks", "non-causal attention", "token type embeddings",
                           "output:       hidden states", "pooling:      cls"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  EXPECT_EQ(r.out.find("ignored:"), std::string::npos) << r.out;
}

TEST(EmbedCommand, BadInputIsOneLine) {
  const std::string m = shell_quote(bert_tiny());
  expect_one_line_error(run_command(kiln_binary() + " embed " + m + " hello --pooling max"), 2, "--pooling");
  expect_one_line_error(run_command(kiln_binary() + " embed " + m + " hello --embd-output-format xml"), 2,
                        "--embd-output-format");
  expect_one_line_error(run_command(kiln_binary() + " embed " + m + " hello --embd-normalize -2"), 2, "--embd-normalize");
  expect_one_line_error(run_command(kiln_binary() + " embed " + m), 2, "texts");
  expect_one_line_error(run_command(kiln_binary() + " embed " + m + " -c 4 'more than four tokens here'"), 1,
                        "more than the context");
  expect_one_line_error(run_command(kiln_binary() + " embed " + m + " -f /nonexistent/texts.txt"), 1, "/nonexistent/texts.txt");
  // An encoder has no classifier to generate with.
  expect_one_line_error(run_command(kiln_binary() + " run " + m + " hello -n 4"), 1, "no classifier");
  // A recurrent model has no attention to embed with.
  const auto vocab = kiln::gguf::File::open(shared_path("vocab/ggml-vocab-gpt-neox.gguf"));
  auto o = kiln::gen::peaky_options("mamba2-tiny", 1, true);
  o.shape.n_layers = 1;
  const std::string mamba = temp_dir() + "/mamba2.gguf";
  kiln::gen::build_model(o, *vocab).write(mamba);
  expect_one_line_error(run_command(kiln_binary() + " embed " + shell_quote(mamba) + " hello --pooling cls"), 1,
                        "recurrent");
}

}  // namespace
