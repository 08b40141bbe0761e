// Hugging Face tokenizer.json files (../shared/tokenizers) through kiln's BPE, against
// the ids the transformers.js tokenizer (@huggingface/tokenizers 0.2.0) gives for the
// strings in tests/data/hf_tokenizer/strings.json (made once by make_reference.mjs there).
// Also the llama2.c tokenizer.bin loader and the CLI's --tokenizer / --parse-special.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "test_util.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

using nlohmann::json;

std::string data_path(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/data/hf_tokenizer/" + name;
}
std::string tokenizer_json(const std::string& family) {
  return test::shared_path("tokenizers/" + family + "-hf/tokenizer.json");
}
std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

struct Reference {
  std::vector<std::string> strings;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;  // transformers.js decode of those ids
};

Reference load_reference(const std::string& family) {
  Reference r;
  r.strings = json::parse(test::read_file(data_path("strings.json"))).get<std::vector<std::string>>();
  for (const json& e : json::parse(test::read_file(data_path(family + ".json")))) {
    r.ids.push_back(e.at("ids").get<std::vector<int32_t>>());
    r.decoded.push_back(e.at("decoded").get<std::string>());
  }
  return r;
}

class HfReference : public ::testing::TestWithParam<const char*> {};

// One test per file: each loads a large tokenizer.json, and ctest runs tests apart.
TEST_P(HfReference, EncodesLikeTransformersJsAndDecodesBack) {
  const std::string family = GetParam();
  const Reference ref = load_reference(family);
  ASSERT_EQ(ref.strings.size(), 35u);
  ASSERT_EQ(ref.ids.size(), ref.strings.size());
  auto tok = Tokenizer::from_file(tokenizer_json(family));
  size_t passed = 0;
  for (size_t i = 0; i < ref.strings.size(); ++i) {
    // transformers.js splits special tokens out of text by default: --parse-special.
    const auto got = tok->encode(ref.strings[i], /*add_bos=*/false, /*parse_special=*/true);
    if (got == ref.ids[i]) ++passed;
    else ADD_FAILURE() << family << " [" << ref.strings[i] << "]\n  expected " << ids_text(ref.ids[i]) << "\n  got      " << ids_text(got);
    // Llama 3 and Gemma 3 are lossless. Qwen3 normalizes to NFC first, so it gives back
    // what transformers.js gives back (Llama 3's decode there also removes spaces
    // before punctuation, a clean-up kiln does not do).
    const std::string expected = family == "qwen3" ? ref.decoded[i] : ref.strings[i];
    EXPECT_EQ(tok->decode(got, /*special=*/true), expected) << family << " [" << ref.strings[i] << "]";
  }
  std::printf("%s: %zu/%zu strings reproduced\n", family.c_str(), passed, ref.strings.size());

  // Without parse_special a special token's text is tokenized as characters (and comes
  // back as that text); added tokens that are not special still count as tokens.
  const std::string text = "<|im_start|><start_of_turn><|begin_of_text|>";
  const auto plain = tok->encode(text, false, /*parse_special=*/false);
  for (int32_t id : plain) EXPECT_NE(tok->vocab().types[(size_t)id], TokenType::control) << family;
  EXPECT_EQ(tok->decode(plain), text);
  EXPECT_LT(tok->encode(text, false, true).size(), plain.size());

  // The vocabulary written out as GGUF metadata (what kiln-gen --vocab-from does with a
  // tokenizer.json) names the pre-tokenizer as llama.cpp's converter does, and encodes the
  // same, except where Qwen's NFC normalization (which GGUF files do not ask for) changes
  // the text. Llama 3's file has no template adding BOS; llama.cpp adds it for llama-bpe.
  if (family != "gemma3") {
    EXPECT_EQ(tok->vocab().pre, family == "llama3" ? "llama-bpe" : "qwen2");
    EXPECT_EQ(tok->vocab().add_bos, family == "llama3");
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::of_string("llama"));
    write_vocab_gguf(w, tok->vocab());
    const std::string path = test::temp_dir() + "/" + family + ".gguf";
    w.write(path);
    auto file = gguf::File::open(path);
    auto from_gguf = Tokenizer::from_gguf(*file);
    EXPECT_EQ(from_gguf->vocab().pre, tok->vocab().pre);
    EXPECT_EQ(from_gguf->vocab().add_bos, tok->vocab().add_bos);
    // Qwen names no BOS, and a GGUF without the key gets GPT-2's 11 (never added) in
    // llama.cpp and kiln alike.
    if (tok->bos() >= 0) {
      EXPECT_EQ(from_gguf->bos(), tok->bos());
    }
    EXPECT_EQ(from_gguf->eos(), tok->eos());
    EXPECT_EQ(from_gguf->vocab().types, tok->vocab().types);
    for (size_t i = 0; i < ref.strings.size(); ++i) {
      if (family == "qwen3" && ref.decoded[i] != ref.strings[i]) continue;
      EXPECT_EQ(from_gguf->encode(ref.strings[i], false, true), ref.ids[i]) << family << " GGUF [" << ref.strings[i] << "]";
    }
  }

  if (family == "gemma3") {
    // Gemma's SentencePiece-style BPE as a GGUF "llama" vocabulary, scores restated from
    // the merge ranks (kiln-gen does this): kiln's SentencePiece tokenizer on those scores
    // must split as transformers.js does with the merges.
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::of_string("gemma3"));
    write_vocab_gguf(w, spm_vocab_from_merges(tok->vocab(), "gemma3"));
    const std::string path = test::temp_dir() + "/gemma3-spm.gguf";
    w.write(path);
    auto file = gguf::File::open(path);
    auto from_gguf = Tokenizer::from_gguf(*file);
    EXPECT_EQ(from_gguf->vocab().model, "llama");
    EXPECT_FALSE(from_gguf->vocab().add_space_prefix);
    EXPECT_EQ(from_gguf->bos(), tok->bos());
    EXPECT_EQ(from_gguf->eos(), tok->eos());
    size_t same = 0;
    for (size_t i = 0; i < ref.strings.size(); ++i) {
      const auto got = from_gguf->encode(ref.strings[i], false, true);
      same += got == ref.ids[i];
      EXPECT_EQ(got, ref.ids[i]) << "gemma3 GGUF [" << ref.strings[i] << "]\n  expected " << ids_text(ref.ids[i])
                                 << "\n  got      " << ids_text(got);
      EXPECT_EQ(from_gguf->decode(got, /*special=*/true), ref.strings[i]);
    }
    std::printf("gemma3 as a SentencePiece GGUF: %zu/%zu strings reproduced\n", same, ref.strings.size());
  }

  if (family == "qwen3") {
    // tokenizer_config.json names EOS and says no BOS is added.
    EXPECT_EQ(tok->vocab().tokens[(size_t)tok->eos()], "<|im_end|>");
    EXPECT_EQ(tok->bos(), -1);
    EXPECT_TRUE(tok->is_eog(tok->eos()));
    const int32_t think = 151667;  // "<think>": an added token that is not special
    ASSERT_EQ(tok->vocab().tokens[think], "<think>");
    EXPECT_EQ(tok->vocab().types[think], TokenType::user_defined);
    EXPECT_EQ(tok->encode("a<think>b", false, false), tok->encode("a<think>b", false, true));
    EXPECT_EQ(tok->encode("<think>", false, false), std::vector<int32_t>{think});
  }
  if (family == "gemma3") {
    EXPECT_EQ(tok->vocab().tokens[(size_t)tok->bos()], "<bos>");
    ASSERT_TRUE(tok->vocab().add_bos);
    const auto ids = tok->encode("Hello", true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], tok->bos());
    // U+10FFFD (private use, plane 16) is not in the vocabulary: its four UTF-8 bytes
    // come out as <0xXX> tokens and decode back.
    const std::string pua = "\xF4\x8F\xBF\xBD";
    const auto b = tok->encode(pua, false);
    ASSERT_EQ(b.size(), 4u);
    for (int32_t id : b) EXPECT_EQ(tok->vocab().types[(size_t)id], TokenType::byte);
    EXPECT_EQ(tok->decode(b), pua);
  }
}

INSTANTIATE_TEST_SUITE_P(Files, HfReference, ::testing::Values("llama3", "qwen3", "gemma3"));

TEST(HfTokenizer, RefusesWhatItCannotReproduce) {
  const std::string dir = test::temp_dir();
  auto error_for = [&](const std::string& content) {
    const std::string path = dir + "/tokenizer.json";
    test::write_file(path, content);
    try {
      Tokenizer::from_hf_json(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string vocab = R"("vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"])";
  EXPECT_NE(error_for(R"({"model": {"type": "Unigram", "vocab": []}})").find("model type 'Unigram' is not supported"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", )" + vocab + R"(}, "pre_tokenizer": {"type": "Metaspace"}})")
                .find("pre-tokenizer {\"type\":\"Metaspace\"} is not supported"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", )" + vocab + R"(}, "normalizer": {"type": "Strip"}})")
                .find("normalizer {\"type\":\"Strip\"} is not supported"),
            std::string::npos);
  EXPECT_NE(error_for("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}}})").find("model.vocab maps tokens to ids"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": "one", "content": "b"}]})")
                .find("added_tokens id must be an integer in [0, 16777215], got \"one\""),
            std::string::npos);
  // Numbers are range-checked before conversion (fuzz_tokenizer_json found 1.3e92 read
  // with get<long>(): undefined behaviour), and the error names the field.
  const std::string added = R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": )";
  EXPECT_NE(error_for(added + R"(1.33333e+92, "content": "b"}]})").find("added_tokens id must be an integer in [0, 16777215]"),
            std::string::npos);
  EXPECT_NE(error_for(added + R"(-1e300, "content": "b"}]})").find("added_tokens id must be"), std::string::npos);
  EXPECT_NE(error_for(added + R"(1.5, "content": "b"}]})").find("added_tokens id must be"), std::string::npos);
  EXPECT_NE(error_for(added + R"(18446744073709551615, "content": "b"}]})").find("added_tokens id must be"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 18446744073709551615}}})").find("model.vocab id"),
            std::string::npos);
  EXPECT_NE(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 1e92}}})").find("model.vocab"), std::string::npos);
  // An integral float is that integer, as JSON does not tell 1 from 1.0.
  test::write_file(dir + "/tokenizer.json", added + R"(1.0, "content": "b"}]})");
  EXPECT_EQ(Tokenizer::from_hf_json(dir + "/tokenizer.json")->vocab().tokens.at(1), "b");
  // A minimal valid file: merges apply, in rank order.
  const std::string path = dir + "/tokenizer.json";
  test::write_file(path, R"({"model": {"type": "BPE", )" + vocab + "}}");
  EXPECT_EQ(Tokenizer::from_hf_json(path)->encode("abba", false), (std::vector<int32_t>{2, 1, 0}));
}

// llama2.c's tokenizer.bin holds the same vocabulary as stories260K.gguf.
TEST(Llama2cTokenizer, MatchesTheGgufVocabulary) {
  auto bin = Tokenizer::from_file(test::shared_path("models/tok512.bin"));
  auto file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  auto gguf_tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(bin->vocab().tokens, gguf_tok->vocab().tokens);
  EXPECT_EQ(bin->vocab().scores, gguf_tok->vocab().scores);
  EXPECT_EQ(bin->vocab().types, gguf_tok->vocab().types);
  EXPECT_EQ(bin->bos(), 1);
  EXPECT_EQ(bin->eos(), 2);
  for (const char* text : {"Once upon a time, there was a little girl named Lily.", "caf\xC3\xA9 \xF0\x9F\xA6\x99\n", ""}) {
    EXPECT_EQ(bin->encode(text, true), gguf_tok->encode(text, true)) << text;
  }
}

// The CLI: --tokenizer without a model, --parse-special, and unknown tokenizer names.
// A small tokenizer.json keeps this fast; the real files are checked above.
TEST(TokenizeCli, TokenizerFileAndParseSpecial) {
  const std::string path = test::temp_dir() + "/tokenizer.json";
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"<": 0, "s": 1, ">": 2, "a": 3, "b": 4, "ab": 5},
                                       "merges": ["a b"]},
                             "added_tokens": [{"id": 6, "content": "<s>", "special": true}]})");
  const std::string cmd =
      test::shell_quote(test::kiln_binary()) + " tokenize --tokenizer " + test::shell_quote(path) + " '<s>ab' --ids";
  auto special = test::run_command(cmd + " --parse-special");
  ASSERT_EQ(special.exit_code, 0) << special.err;
  EXPECT_EQ(test::trim(special.out), "[6, 5]");
  auto literal = test::run_command(cmd);
  ASSERT_EQ(literal.exit_code, 0) << literal.err;
  EXPECT_EQ(test::trim(literal.out), "[0, 1, 2, 5]");
  auto missing = test::run_command(test::shell_quote(test::kiln_binary()) + " tokenize --tokenizer /nonexistent.json hi");
  test::expect_one_line_error(missing, 1, "/nonexistent.json: cannot open tokenizer file");
}

gguf::Writer bpe_vocab(const std::string& model, const std::string& pre) {
  using gguf::Value;
  gguf::Writer w;
  w.set("general.architecture", Value::of_string("gpt2"));
  w.set("tokenizer.ggml.model", Value::of_string(model));
  w.set("tokenizer.ggml.pre", Value::of_string(pre));
  std::vector<Value> tokens;
  for (const char* t : {"a", "b", "ab"}) tokens.push_back(Value::of_string(t));
  w.set("tokenizer.ggml.tokens", Value::of_array(gguf::ValueType::STRING, tokens));
  w.set("tokenizer.ggml.merges", Value::of_array(gguf::ValueType::STRING, {Value::of_string("a b")}));
  return w;
}

TEST(TokenizeCli, UnknownPreOrModelIsOneLineNamingTheSupportedOnes) {
  const std::string dir = test::temp_dir();
  bpe_vocab("gpt2", "nonesuch").write(dir + "/pre.gguf");
  auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " tokenize " + dir + "/pre.gguf hi");
  test::expect_one_line_error(r, 1, "tokenizer.ggml.pre 'nonesuch' is not supported (supported: gpt-2, ");
  EXPECT_NE(r.err.find("llama-bpe"), std::string::npos) << r.err;
  bpe_vocab("rwkv", "default").write(dir + "/model.gguf");
  r = test::run_command(test::shell_quote(test::kiln_binary()) + " tokenize " + dir + "/model.gguf hi");
  test::expect_one_line_error(r, 1, "tokenizer.ggml.model 'rwkv' is not supported (supported: llama, gpt2, bert)");
  // The same vocabulary with a known pre-tokenizer works.
  bpe_vocab("gpt2", "gpt-2").write(dir + "/ok.gguf");
  r = test::run_command(test::shell_quote(test::kiln_binary()) + " tokenize " + dir + "/ok.gguf abba --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::trim(r.out), "[2, 1, 0]");
}

// A file that does not say whether BOS is added gets llama.cpp's default: Llama 3's
// pre-tokenizer adds it, other byte-level BPE does not.
TEST(BpeVocab, AddBosDefaultFollowsThePreTokenizer) {
  for (const auto& [pre, add_bos] : {std::pair{"llama-bpe", true}, {"llama3", true}, {"qwen2", false}, {"gpt-2", false}}) {
    const std::string path = test::temp_dir() + "/bos-" + pre + ".gguf";
    bpe_vocab("gpt2", pre).write(path);
    EXPECT_EQ(Vocab::from_gguf(*gguf::File::open(path)).add_bos, add_bos) << pre;
    gguf::Writer w = bpe_vocab("gpt2", pre);
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::of_bool(!add_bos));
    w.write(path);
    EXPECT_EQ(Vocab::from_gguf(*gguf::File::open(path)).add_bos, !add_bos) << pre << ", stated";
  }
}

// A tokenizer.json split gets a GGUF name only when it is exactly a known one: a Split
// that is not Isolated, or a normalizer GGUF cannot state, leaves it unnamed.
TEST(BpeVocab, PreTokenizerNameOnlyForAnExactMatch) {
  const std::string gpt2 = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  const auto pre_of = [](const std::string& normalizer, const std::string& pre_tokenizer) {
    const std::string path = test::temp_dir() + "/tokenizer.json";
    test::write_file(path, R"({"normalizer": )" + normalizer + R"(, "pre_tokenizer": )" + pre_tokenizer +
                               R"(, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
    return Tokenizer::from_file(path)->vocab().pre;
  };
  EXPECT_EQ(pre_of("null", gpt2), "gpt-2");
  EXPECT_EQ(pre_of(R"({"type": "NFC"})", gpt2), "gpt-2");
  EXPECT_EQ(pre_of(R"({"type": "Lowercase"})", gpt2), "tokenizer.json");
  EXPECT_EQ(pre_of("null", R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, )" +
                               gpt2 + "]}"),
            "starcoder");
  EXPECT_EQ(pre_of("null", R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{N}"},
                               "behavior": "MergedWithNext"}, )" + gpt2 + "]}"),
            "tokenizer.json");
}

}  // namespace
}  // namespace kiln
