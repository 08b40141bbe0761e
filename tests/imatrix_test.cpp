// kiln imatrix against llama-imatrix, kiln quantize --imatrix against llama-quantize, and
// the importance-matrix files (include/kiln/imatrix.h): references in tests/data/imatrix
// (its README says how they were made), models rebuilt as tests/data/families describes.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/quant_iq.h"
#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/imatrix.h"
#include "kiln/tokenizer.h"
#include "model_gen/generate_model.h"
#include "perplexity_reference.h"
#include "quantize/mix.h"
#include "sha256.h"
#include "test_util.h"

using namespace kiln::test;
namespace imatrix = kiln::imatrix;

namespace {

const std::string kData = std::string(KILN_SOURCE_DIR) + "/tests/data";
const std::string kRefs = kData + "/imatrix";

// The F32 file tests/data/families/README.md's kiln-gen line writes for `shape` (experts
// `expert_ffn` wide when not 0), checked against the sha256 llama.cpp's run was made on.
std::string model_file(const std::string& shape, uint32_t expert_ffn = 0, uint32_t layers = 0) {
  const bool qwen = shape.starts_with("qwen3"), tied = qwen;
  kiln::gen::GenerateOptions o = kiln::gen::peaky_options(shape, 7, tied);
  if (expert_ffn) o.shape.expert_ffn_dim = expert_ffn;
  if (layers) o.shape.n_layers = layers;
  const std::string name =
      shape + (expert_ffn ? "-e" + std::to_string(expert_ffn) : "") + (layers ? "-" + std::to_string(layers) : "");
  const std::string path = temp_dir() + "/" + name + ".gguf";
  std::vector<uint8_t> bytes;
  if (shape == "phi3-tiny") {
    bytes = kiln::gen::build_model(o, *kiln::gguf::File::open(shared_path("vocab/ggml-vocab-phi-3.gguf"))).to_bytes();
  } else {
    const std::string json = qwen ? "tokenizers/qwen3-hf/tokenizer.json" : "tokenizers/llama3-hf/tokenizer.json";
    bytes = kiln::gen::build_model(o, kiln::Tokenizer::from_file(shared_path(json))->vocab()).to_bytes();
  }
  const std::string sha = name != shape ? kRefs + "/" + name + ".gguf.sha256" : kData + "/families/" + shape + ".gguf.sha256";
  EXPECT_EQ(sha256_hex(bytes.data(), bytes.size()), trim(read_file(sha))) << name << " is not the file llama.cpp read";
  write_file(path, std::string(bytes.begin(), bytes.end()));
  return path;
}

// kiln imatrix on tests/data/story.txt, run from tests/data so that the dataset is
// "story.txt" as in the references, with the references' -c and cache settings.
std::string run_imatrix(const std::string& model, const std::string& out, const std::string& extra) {
  const auto r = run_command("cd " + shell_quote(kData) + " && " + shell_quote(kiln_binary()) + " imatrix -m " +
                             shell_quote(model) + " -f story.txt -o " + shell_quote(out) +
                             " -c 64 -ctk f32 -ctv f32 -fa off -t 2 " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

// The same entries with equal counts, sums within a relative 1e-5 of the largest sum of
// their matrix (kiln's and ggml's products round differently, and every layer's input
// carries that difference: seen up to 9e-7), and the same metadata.
void expect_same_statistics(const imatrix::Imatrix& got, const imatrix::Imatrix& want) {
  EXPECT_EQ(got.legacy, want.legacy);
  EXPECT_EQ(got.datasets, want.datasets);
  EXPECT_EQ(got.chunk_count, want.chunk_count);
  EXPECT_EQ(got.chunk_size, want.chunk_size);
  ASSERT_EQ(got.entries.size(), want.entries.size());
  double worst = 0;
  for (const auto& [name, w] : want.entries) {
    SCOPED_TRACE(name);
    const auto it = got.entries.find(name);
    ASSERT_NE(it, got.entries.end());
    const imatrix::Entry& g = it->second;
    EXPECT_EQ(g.counts, w.counts);
    ASSERT_EQ(g.sums.size(), w.sums.size());
    const size_t n = w.n_per_row();
    for (size_t k = 0; k < w.n_mat(); ++k) {
      float scale = 0;
      for (size_t j = 0; j < n; ++j) scale = std::max(scale, w.sums[k * n + j]);
      for (size_t j = 0; j < n; ++j) {
        const double diff = std::fabs(double(g.sums[k * n + j]) - w.sums[k * n + j]) / std::max(scale, 1e-30f);
        worst = std::max(worst, diff);
        ASSERT_LE(diff, 1e-5) << "column " << j << " of matrix " << k << ": " << g.sums[k * n + j] << " vs "
                              << w.sums[k * n + j];
      }
    }
  }
  std::printf("[ imatrix ] worst relative difference %.3g over %zu entries\n", worst, want.entries.size());
}

TEST(Imatrix, FusedTensorsAsLlamaImatrix) {
  const std::string out = temp_dir() + "/phi3.imatrix.gguf";
  const std::string said = run_imatrix(model_file("phi3-tiny"), out, "");
  EXPECT_NE(said.find("Final estimate: PPL = "), std::string::npos) << said;
  const imatrix::Imatrix got = imatrix::read(out), want = imatrix::read(kRefs + "/phi3-tiny.imatrix.gguf");
  EXPECT_TRUE(got.entries.count("blk.0.attn_qkv.weight") && got.entries.count("blk.1.ffn_up.weight"));
  expect_same_statistics(got, want);
}

TEST(Imatrix, BosAndOutputAsLlamaImatrix) {
  const std::string out = temp_dir() + "/llama3.imatrix.gguf";
  run_imatrix(model_file("llama3-tiny"), out, "--process-output --no-ppl");
  const imatrix::Imatrix got = imatrix::read(out), want = imatrix::read(kRefs + "/llama3-tiny.imatrix.gguf");
  ASSERT_TRUE(got.entries.count("output.weight"));
  expect_same_statistics(got, want);
  // Without --process-output the classifier is not collected.
  run_imatrix(model_file("llama3-tiny"), out, "--no-ppl --chunks 2");
  const imatrix::Imatrix two = imatrix::read(out);
  EXPECT_FALSE(two.entries.count("output.weight"));
  EXPECT_EQ(two.chunk_count, 2);
  EXPECT_EQ(two.entries.at("blk.0.attn_q.weight").counts, std::vector<int64_t>{2 * 64});
}

TEST(Imatrix, PerExpertCountsAsLlamaImatrix) {
  const std::string out = temp_dir() + "/qwen3moe.imatrix.gguf";
  run_imatrix(model_file("qwen3moe-tiny"), out, "--no-ppl");
  const imatrix::Imatrix got = imatrix::read(out), want = imatrix::read(kRefs + "/qwen3moe-tiny.imatrix.gguf");
  const imatrix::Entry& gate = got.entries.at("blk.0.ffn_gate_exps.weight");
  ASSERT_EQ(gate.n_mat(), 8u);
  int64_t routed = 0;
  for (int64_t c : gate.counts) routed += c;
  EXPECT_EQ(routed, 2 * got.entries.at("blk.0.ffn_gate_inp.weight").counts[0]);  // two experts per token
  expect_same_statistics(got, want);
}

// Chunks evaluated in batches of 20 rows: the last 4 of each chunk are left out of the
// 2-D products, as llama-imatrix leaves them; and the legacy format.
TEST(Imatrix, SmallBatchesAndDatAsLlamaImatrix) {
  const std::string out = temp_dir() + "/phi3-b20.imatrix.dat";
  run_imatrix(model_file("phi3-tiny"), out, "-b 20 --output-format dat --no-ppl");
  expect_same_statistics(imatrix::read(out), imatrix::read(kRefs + "/phi3-tiny-b20.imatrix.dat"));
}

// kiln's GGUF writer gives llama-imatrix's bytes for the same statistics.
TEST(ImatrixFile, GgufRoundTripIsByteExact) {
  for (const char* name : {"qwen3moe-tiny.imatrix.gguf", "llama3-tiny.imatrix.gguf"}) {
    SCOPED_TRACE(name);
    const std::string ref = kRefs + "/" + name, out = temp_dir() + "/" + name;
    const imatrix::Imatrix m = imatrix::read(ref);
    EXPECT_TRUE(m.has_metadata);
    imatrix::write_gguf(m, out);
    EXPECT_EQ(read_file(out), read_file(ref));
  }
}

imatrix::Imatrix small_imatrix() {
  imatrix::Imatrix m;
  m.datasets = {"a.txt"};
  m.chunk_size = 10;
  m.chunk_count = 3;
  m.entries["blk.0.attn_q.weight"] = {{4, 8, 12, 16}, {30}};
  m.entries["blk.0.ffn_up_exps.weight"] = {{1, 2, 0, 0, 9, 18}, {5, 0, 3}};  // expert 1 never chosen
  m.entries["blk.0.ffn_down_exps.weight"] = {{0, 0, 0, 0}, {0, 0}};           // no expert ever chosen
  return m;
}

TEST(ImatrixFile, GgufRoundTripKeepsEverything) {
  const imatrix::Imatrix m = small_imatrix();
  const std::string path = temp_dir() + "/small.gguf";
  imatrix::write_gguf(m, path);
  const imatrix::Imatrix r = imatrix::read(path);
  EXPECT_FALSE(r.legacy);
  EXPECT_EQ(r.datasets, m.datasets);
  EXPECT_EQ(r.chunk_count, 3);
  EXPECT_EQ(r.chunk_size, 10);
  ASSERT_EQ(r.entries.size(), 3u);
  for (const auto& [name, e] : m.entries) {
    EXPECT_EQ(r.entries.at(name).sums, e.sums) << name;
    EXPECT_EQ(r.entries.at(name).counts, e.counts) << name;
  }
  // llama-quantize's vectors: sums / count per expert, 1 for an expert without tokens.
  EXPECT_EQ(imatrix::importance(r.entries.at("blk.0.ffn_up_exps.weight"), false),
            (std::vector<float>{1.0f / 5, 2.0f / 5, 1, 1, 3, 6}));
}

TEST(ImatrixFile, DatRoundTripGivesTheSameImportance) {
  const imatrix::Imatrix m = small_imatrix();
  const std::string path = temp_dir() + "/small.dat";
  imatrix::write_dat(m, path);
  const imatrix::Imatrix r = imatrix::read(path);
  EXPECT_TRUE(r.legacy);
  EXPECT_EQ(r.datasets, m.datasets);
  EXPECT_EQ(r.chunk_count, 3);
  ASSERT_EQ(r.entries.size(), 2u);  // the entry without any tokens is left out
  EXPECT_EQ(r.entries.at("blk.0.attn_q.weight").counts, std::vector<int64_t>{3});  // 30 rows / 10 per chunk
  EXPECT_EQ(r.entries.at("blk.0.ffn_up_exps.weight").counts, std::vector<int64_t>{1});  // ceil(5 / 10)
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight"}) {
    const std::vector<float> want = imatrix::importance(m.entries.at(name), false);
    const std::vector<float> got = imatrix::importance(r.entries.at(name), true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << name << " " << i;
  }
  // A legacy file's values are not raw sums: writing them again is refused.
  EXPECT_THROW(imatrix::write_gguf(r, path + ".gguf"), kiln::Error);
}

// A bad file is one kiln::Error naming the file and what is wrong with it.
void expect_bad(const std::string& bytes, const std::string& fragment) {
  const std::string path = temp_dir() + "/bad.imatrix";
  write_file(path, bytes);
  try {
    imatrix::read(path);
    ADD_FAILURE() << "accepted; wanted an error with '" << fragment << "'";
  } catch (const kiln::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

std::string i32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string gguf_bytes(const std::function<void(kiln::gguf::Writer&)>& fill) {
  kiln::gguf::Writer w;
  fill(w);
  const auto b = w.to_bytes();
  return std::string(b.begin(), b.end());
}
std::vector<uint8_t> f32s(std::vector<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(ImatrixFile, BadFilesAreOneLineErrors) {
  using kiln::TensorType;
  expect_bad("", "entry count");
  expect_bad(i32(0), "no importance matrix entries");
  expect_bad(i32(1) + i32(1000), "name length");
  expect_bad(i32(1) + i32(3) + "abc" + i32(1) + i32(4) + std::string(8, '\0'), "entry 'abc''s value count is 4");
  expect_bad(i32(1) + i32(3) + "abc" + i32(1) + i32(-2), "entry 'abc''s value count");
  const std::string ref = read_file(kRefs + "/phi3-tiny.imatrix.gguf");
  expect_bad(ref.substr(0, ref.size() / 2), "");  // the GGUF reader's own message, with the path
  expect_bad(gguf_bytes([](auto& w) { w.set("general.type", kiln::gguf::Value::of_string("model")); }), "general.type");
  expect_bad(gguf_bytes([](auto&) {}), "no importance matrix entries");
  expect_bad(gguf_bytes([](auto& w) { w.add_tensor("blk.0.x.weight.in_sum2", TensorType::F32, {4}, f32s({1, 2, 3, 4})); }),
             "'blk.0.x.weight.in_sum2' has no 'blk.0.x.weight.counts'");
  expect_bad(gguf_bytes([](auto& w) {
               w.add_tensor("a.in_sum2", TensorType::F32, {3}, f32s({1, 2, 3}));
               w.add_tensor("a.counts", TensorType::F32, {2}, f32s({1, 1}));
             }),
             "entry 'a': 2 counts do not divide its 3 sums");
  expect_bad(gguf_bytes([](auto& w) {
               w.add_tensor("a.in_sum2", TensorType::F32, {2}, f32s({1, NAN}));
               w.add_tensor("a.counts", TensorType::F32, {1}, f32s({1}));
             }),
             "entry 'a': a sum of squares");
  expect_bad(gguf_bytes([](auto& w) {
               w.add_tensor("a.in_sum2", TensorType::F16, {2}, {0, 0, 0, 0});
               w.add_tensor("a.counts", TensorType::F32, {1}, f32s({1}));
             }),
             "tensor 'a.in_sum2' is F16");
  EXPECT_THROW(imatrix::read(temp_dir() + "/missing.gguf"), kiln::Error);
}

// quantize --imatrix refuses a bad file in one line, and a GGUF without the metadata
// llama-quantize requires.
TEST(ImatrixQuantize, BadImatrixIsOneLine) {
  const std::string model = model_file("phi3-tiny"), out = temp_dir() + "/q.gguf";
  const std::string bad = temp_dir() + "/bad.dat";
  write_file(bad, i32(1) + i32(50));
  auto r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(model) + " " + shell_quote(out) +
                       " Q8_0 --quiet --imatrix " + shell_quote(bad));
  expect_one_line_error(r, 1, bad);
  const std::string bare = temp_dir() + "/bare.gguf";
  write_file(bare, gguf_bytes([](auto& w) {
               w.add_tensor("a.in_sum2", kiln::TensorType::F32, {1}, f32s({1}));
               w.add_tensor("a.counts", kiln::TensorType::F32, {1}, f32s({1}));
             }));
  r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(model) + " " + shell_quote(out) +
                  " Q8_0 --quiet --imatrix " + shell_quote(bare));
  expect_one_line_error(r, 1, "imatrix.datasets");
  // An entry of another size than its tensor: an imatrix of another model.
  r = run_command(shell_quote(kiln_binary()) + " quantize " + shell_quote(model) + " " + shell_quote(out) +
                  " Q8_0 --quiet --imatrix " + shell_quote(kRefs + "/llama3-tiny.imatrix.gguf"));
  expect_one_line_error(r, 1, "has 192 values; the tensor needs 160");
}

// Whether kernels::ref::quantize_chunk writes `type` with importance weights yet.
bool weighted_quantizer_exists(kiln::TensorType type) {
  std::vector<float> x(256, 0.5f), w(256, 1.0f);
  std::vector<uint8_t> out(1024);
  try {
    kiln::kernels::ref::quantize_chunk(type, x.data(), out.data(), 1, 256, w.data());
    return true;
  } catch (const kiln::Error&) {
    return false;
  }
}

// kiln quantize --imatrix writes llama-quantize's tensors (its digest) and metadata
// (quantize.txt) with the same imatrix file, passed by the same name.
TEST(ImatrixQuantize, SameTensorsAndKeysAsLlamaQuantize) {
  const std::string model = model_file("qwen3moe-tiny", 256);
  std::istringstream refs(read_file(kRefs + "/quantize.txt"));
  std::vector<std::pair<std::string, std::string>> presets;
  std::vector<std::vector<std::string>> keys;
  for (std::string line; std::getline(refs, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string a, b, c, d;
    ls >> a >> b >> c >> d;
    if (a == "key") keys.push_back({b, c, d});
    else presets.emplace_back(a, b);
  }
  ASSERT_EQ(presets.size(), 3u);
  ASSERT_EQ(keys.size(), 4u);
  std::vector<std::string> skipped;
  for (const auto& [preset, digest] : presets) {
    SCOPED_TRACE(preset);
    const std::string out = temp_dir() + "/e256-" + preset + ".gguf";
    const auto r = run_command("cd " + shell_quote(kRefs) + " && " + shell_quote(kiln_binary()) + " quantize " +
                               shell_quote(model) + " " + shell_quote(out) + " " + preset +
                               " --quiet --imatrix qwen3moe-tiny-e256.imatrix.gguf");
    if (r.exit_code != 0) {
      std::string missing;
      for (auto t : {kiln::TensorType::Q4_0, kiln::TensorType::Q4_1, kiln::TensorType::Q5_0, kiln::TensorType::Q5_1,
                     kiln::TensorType::Q8_0, kiln::TensorType::Q2_K, kiln::TensorType::Q3_K, kiln::TensorType::Q4_K,
                     kiln::TensorType::Q5_K, kiln::TensorType::Q6_K})
        if (!weighted_quantizer_exists(t)) missing += " " + kiln::type_name(t);
      ASSERT_FALSE(missing.empty()) << r.err;
      skipped.push_back(preset + " (no weighted" + missing + " yet)");
      continue;
    }
    EXPECT_EQ(tensor_digest(out), digest) << "not the tensors llama-quantize wrote";
    auto f = kiln::gguf::File::open(out);
    for (const auto& k : keys) {
      const kiln::gguf::Value* v = f->find(k[0]);
      ASSERT_NE(v, nullptr) << k[0];
      std::string type = kiln::gguf::value_type_name(v->type);
      for (char& ch : type) ch = char(std::toupper(static_cast<unsigned char>(ch)));
      EXPECT_EQ(type, k[1]) << k[0];
      EXPECT_EQ(v->type == kiln::gguf::ValueType::STRING ? v->s : std::to_string(v->u), k[2]) << k[0];
    }
  }
  if (!skipped.empty()) {
    std::string all;
    for (const std::string& s : skipped) all += " " + s;
    GTEST_SKIP() << "skipped:" << all;
  }
}

// With an importance matrix llama-quantize gives some tensors other types (Q4_0's and
// Q5_0's first ffn_down layers): the types it chose for a 16-layer file.
TEST(ImatrixQuantize, TypesWithAnImatrixAsLlamaQuantize) {
  using namespace kiln::quantize;
  auto f = kiln::gguf::File::open(model_file("phi3-tiny", 0, 16));
  std::vector<TensorDesc> tensors;
  for (const kiln::gguf::TensorInfo& t : f->tensors()) tensors.push_back({t.name, t.dims, t.type});
  const ModelFacts facts{"phi3", f->get_u32("phi3.block_count"), f->get_u32("phi3.attention.head_count"),
                         f->get_u32("phi3.attention.head_count_kv"), 0};
  std::map<std::string, std::map<std::string, std::string>> want;  // preset -> tensor -> type
  std::istringstream in(read_file(kRefs + "/phi3-tiny-16.types.txt"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string preset, name, type;
    ls >> preset >> name >> type;
    want[preset][name] = type;
  }
  ASSERT_EQ(want.size(), 2u);
  for (const auto& [preset, types] : want) {
    const auto got = choose_types(*find_preset(preset), facts, tensors, true);
    ASSERT_EQ(types.size(), tensors.size());
    size_t changed = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(kiln::type_name(got[i].type), types.at(tensors[i].name)) << preset << " " << tensors[i].name;
      changed += got[i].type != choose_types(*find_preset(preset), facts, tensors, false)[i].type;
    }
    EXPECT_EQ(changed, 2u) << preset;  // blk.0 and blk.1's ffn_down (16 / 8)
  }
}

}  // namespace
