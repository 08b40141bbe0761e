// Tokenizer behaviour on synthetic vocabularies (written with gguf::Writer) and on the
// shared vocab files: metadata validation, unknown characters, special tokens, UTF-8
// handling and streaming detokenization.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "test_util.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

using gguf::Value;
using gguf::ValueType;

// A tiny SentencePiece-style vocabulary without byte pieces.
struct SyntheticVocab {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b",
                                     "\xE2\x96\x81" "a", "ab", "<|end|>"};
  std::vector<float> scores = {0, 0, 0, -1, -2, -3, -4, -5, 0};
  std::vector<int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1, 3};

  gguf::Writer writer() const {
    gguf::Writer w;
    w.set("general.architecture", Value::of_string("llama"));
    w.set("tokenizer.ggml.model", Value::of_string("llama"));
    std::vector<Value> t, s, y;
    for (const auto& x : tokens) t.push_back(Value::of_string(x));
    for (float x : scores) s.push_back(Value::of_f32(x));
    for (int32_t x : types) y.push_back(Value::of_i32(x));
    w.set("tokenizer.ggml.tokens", Value::of_array(ValueType::STRING, t));
    w.set("tokenizer.ggml.scores", Value::of_array(ValueType::FLOAT32, s));
    w.set("tokenizer.ggml.token_type", Value::of_array(ValueType::INT32, y));
    return w;
  }
  int32_t id(const std::string& text) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == text) return (int32_t)i;
    }
    return -1;
  }
};

std::unique_ptr<gguf::File> write_and_open(const gguf::Writer& w, const std::string& name) {
  const std::string path = test::temp_dir() + "/" + name;
  w.write(path);
  return gguf::File::open(path);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no kiln::Error thrown)";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Vocab, LlamaDefaultsWhenKeysAreAbsent) {
  SyntheticVocab sv;
  auto f = write_and_open(sv.writer(), "defaults.gguf");
  const Vocab v = Vocab::from_gguf(*f);
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.size(), sv.tokens.size());
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.pad_id, -1);
  EXPECT_EQ(v.eot_id, -1);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_TRUE(v.add_space_prefix);
  ASSERT_EQ(v.types.size(), sv.types.size());
  EXPECT_EQ(v.types[0], TokenType::unknown);
  EXPECT_EQ(v.scores[5], -3.0f);
}

TEST(Vocab, ExplicitKeysOverrideDefaults) {
  SyntheticVocab sv;
  auto w = sv.writer();
  w.set("tokenizer.ggml.bos_token_id", Value::of_u32(2));
  w.set("tokenizer.ggml.eos_token_id", Value::of_u32(8));
  w.set("tokenizer.ggml.eot_token_id", Value::of_u32(8));
  w.set("tokenizer.ggml.padding_token_id", Value::of_u32(0xFFFFFFFFu));  // "none"
  w.set("tokenizer.ggml.add_bos_token", Value::of_bool(false));
  w.set("tokenizer.ggml.add_space_prefix", Value::of_bool(false));
  w.set("tokenizer.ggml.pre", Value::of_string("default"));
  auto f = write_and_open(w, "explicit.gguf");
  const Vocab v = Vocab::from_gguf(*f);
  EXPECT_EQ(v.bos_id, 2);
  EXPECT_EQ(v.eos_id, 8);
  EXPECT_EQ(v.eot_id, 8);
  EXPECT_EQ(v.pad_id, -1);
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.add_space_prefix);
  EXPECT_EQ(v.pre, "default");
}

TEST(Vocab, ScoresLengthMismatchNamesFileAndKey) {
  SyntheticVocab sv;
  sv.scores.resize(4);
  auto f = write_and_open(sv.writer(), "short-scores.gguf");
  const std::string msg = error_of([&] { Vocab::from_gguf(*f); });
  EXPECT_TRUE(contains(msg, "short-scores.gguf: tokenizer.ggml.scores has 4 entries, tokens has 9"))
      << msg;
}

TEST(Vocab, TokenTypeLengthAndRangeAreChecked) {
  SyntheticVocab sv;
  sv.types.pop_back();
  auto f = write_and_open(sv.writer(), "short-types.gguf");
  EXPECT_TRUE(contains(error_of([&] { Vocab::from_gguf(*f); }),
                       "tokenizer.ggml.token_type has 8 entries, tokens has 9"));
  SyntheticVocab bad;
  bad.types[4] = 9;
  auto g = write_and_open(bad.writer(), "bad-type.gguf");
  const std::string msg = error_of([&] { Vocab::from_gguf(*g); });
  EXPECT_TRUE(contains(msg, "bad-type.gguf: tokenizer.ggml.token_type[4] is 9")) << msg;
}

TEST(Vocab, SpecialIdOutsideVocabularyThrows) {
  SyntheticVocab sv;
  auto w = sv.writer();
  w.set("tokenizer.ggml.bos_token_id", Value::of_u32(9));
  auto f = write_and_open(w, "bad-bos.gguf");
  const std::string msg = error_of([&] { Vocab::from_gguf(*f); });
  EXPECT_TRUE(contains(msg, "bad-bos.gguf: tokenizer.ggml.bos_token_id is 9")) << msg;
}

TEST(Vocab, MissingTokensOrModelThrows) {
  gguf::Writer w;
  w.set("tokenizer.ggml.model", Value::of_string("llama"));
  auto f = write_and_open(w, "no-tokens.gguf");
  EXPECT_TRUE(contains(error_of([&] { Vocab::from_gguf(*f); }), "tokenizer.ggml.tokens"));
  gguf::Writer empty;
  empty.set("general.architecture", Value::of_string("llama"));
  auto g = write_and_open(empty, "no-model.gguf");
  EXPECT_TRUE(contains(error_of([&] { Tokenizer::from_gguf(*g); }), "tokenizer.ggml.model"));
}

TEST(Tokenizer, UnsupportedModelNamesFileAndModel) {
  SyntheticVocab sv;
  auto w = sv.writer();
  w.set("tokenizer.ggml.model", Value::of_string("rwkv"));
  auto f = write_and_open(w, "rwkv.gguf");
  const std::string msg = error_of([&] { Tokenizer::from_gguf(*f); });
  EXPECT_TRUE(contains(msg, "rwkv.gguf: tokenizer.ggml.model 'rwkv' is not supported (supported: llama, gpt2, bert)")) << msg;
}

TEST(Tokenizer, UnknownCharactersWithoutBytePiecesBecomeUnk) {
  SyntheticVocab sv;
  auto f = write_and_open(sv.writer(), "no-bytes.gguf");
  auto tok = Tokenizer::from_gguf(*f);
  const int32_t unk = 0, sp_a = sv.id("\xE2\x96\x81" "a"), b = sv.id("b"), ab = sv.id("ab");
  // "▁a€b": ▁a merges (score -4 beats nothing else), € is unknown, b stays alone.
  EXPECT_EQ(tok->encode("a\xE2\x82\xAC" "b", false), (std::vector<int32_t>{sp_a, unk, b}));
  // A run of unknown characters (CJK, emoji) is one unk, as sentencepiece itself does.
  EXPECT_EQ(tok->encode("\xE4\xBD\xA0\xF0\x9F\xA6\x99", false),
            (std::vector<int32_t>{sv.id("\xE2\x96\x81"), unk}));
  EXPECT_EQ(tok->encode("\xE4\xBD\xA0" "a\xF0\x9F\xA6\x99", false),
            (std::vector<int32_t>{sv.id("\xE2\x96\x81"), unk, sv.id("a"), unk}));
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{1, sp_a, b}));
  EXPECT_EQ(tok->encode("bab", false), (std::vector<int32_t>{sv.id("\xE2\x96\x81"), b, ab}));
  EXPECT_EQ(tok->token_to_piece(unk), " \xE2\x81\x87 ");
}

TEST(Tokenizer, NoUnknownTokenStillNeverCrashes) {
  SyntheticVocab sv;
  sv.types[0] = 1;  // "<unk>" is an ordinary token now and no id is named unknown
  auto w = sv.writer();
  w.set("tokenizer.ggml.unknown_token_id", Value::of_i32(-1));
  auto f = write_and_open(w, "no-unk.gguf");
  auto tok = Tokenizer::from_gguf(*f);
  EXPECT_EQ(tok->vocab().unk_id, -1);
  const auto ids = tok->encode("a\xE2\x82\xAC" "b", false);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok->n_vocab());
}

TEST(Tokenizer, InvalidUtf8ThrowsWithOffset) {
  SyntheticVocab sv;
  auto f = write_and_open(sv.writer(), "utf8.gguf");
  auto tok = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(contains(error_of([&] { tok->encode("ab\xC3(", false); }), "byte offset 2"));
  EXPECT_TRUE(contains(error_of([&] { tok->encode("\x80", false); }), "byte offset 0"));
  // Truncated at the end, an encoded surrogate, an overlong '/'.
  EXPECT_TRUE(contains(error_of([&] { tok->encode("abc\xE2\x82", false); }), "byte offset 3"));
  EXPECT_TRUE(contains(error_of([&] { tok->encode("a\xED\xA0\x80", false); }), "byte offset 1"));
  EXPECT_TRUE(contains(error_of([&] { tok->encode("\xC0\xAF", false); }), "byte offset 0"));
}

TEST(Utf8, Validation) {
  size_t off = 99;
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\xA6\x99 \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_valid_utf8("ok\xF4\x90\x80\x80", &off));  // above U+10FFFF
  EXPECT_EQ(off, 2u);
  EXPECT_FALSE(is_valid_utf8("\xFF", &off));
  EXPECT_EQ(off, 0u);
}

TEST(Tokenizer, ParseSpecialSplitsControlTokens) {
  auto f = gguf::File::open(test::shared_path("vocab/ggml-vocab-phi-3.gguf"));
  auto tok = Tokenizer::from_gguf(*f);
  const int32_t user = 32010, end = 32007;
  ASSERT_EQ(tok->vocab().tokens[(size_t)user], "<|user|>");
  const auto with = tok->encode("<|user|>\nHi<|end|>", true, /*parse_special=*/true);
  ASSERT_GE(with.size(), 4u);
  EXPECT_EQ(with[0], tok->bos());
  EXPECT_EQ(with[1], user);
  EXPECT_EQ(with.back(), end);
  // The text between follows the same rule as any text (dummy prefix included), less the
  // newline: Phi-3's <|user|> takes the whitespace after it, as in llama.cpp (ids checked
  // with llama-tokenize in tokenizer_test's Phi3SpecialTokensTakeTheWhitespaceAfterThem).
  const auto hi = tok->encode("Hi", false);
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 2, with.end() - 1), hi);
  // User text must never smuggle control tokens in.
  const auto without = tok->encode("<|user|>\nHi<|end|>", true);
  for (int32_t id : without) {
    EXPECT_NE(id, user);
    EXPECT_NE(id, end);
  }
  EXPECT_EQ(tok->decode(without), " <|user|>\nHi<|end|>");
  EXPECT_EQ(tok->decode(with), " Hi");
  EXPECT_EQ(tok->decode(with, /*special=*/true), "<s><|user|> Hi<|end|>");
}

TEST(Tokenizer, TokenToPiece) {
  auto f = gguf::File::open(test::shared_path("vocab/ggml-vocab-llama-spm.gguf"));
  auto tok = Tokenizer::from_gguf(*f);
  const auto& v = tok->vocab();
  EXPECT_EQ(v.tokens[15043], "\xE2\x96\x81" "Hello");
  EXPECT_EQ(tok->token_to_piece(15043), " Hello");
  EXPECT_EQ(v.tokens[13], "<0x0A>");
  EXPECT_EQ(tok->token_to_piece(13), "\n");
  EXPECT_EQ(tok->token_to_piece(3), std::string(1, '\0'));
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok->token_to_piece(2, true), "</s>");
  EXPECT_THROW(tok->token_to_piece(32000), Error);
  EXPECT_THROW(tok->token_to_piece(-1), Error);
}

TEST(Tokenizer, EndOfGeneration) {
  auto phi = Tokenizer::from_gguf(*gguf::File::open(test::shared_path("vocab/ggml-vocab-phi-3.gguf")));
  EXPECT_TRUE(phi->is_eog(32000));   // <|endoftext|>, the EOS
  EXPECT_TRUE(phi->is_eog(32007));   // <|end|>: control, an end-of-turn marker
  EXPECT_FALSE(phi->is_eog(32010));  // <|user|>
  EXPECT_FALSE(phi->is_eog(1));      // <s>
  EXPECT_FALSE(phi->is_eog(2));      // "</s>" is user-defined in phi-3, not control
  EXPECT_FALSE(phi->is_eog(15043));
  EXPECT_FALSE(phi->is_eog(-1));
  EXPECT_FALSE(phi->is_eog(1 << 20));
  auto llama = Tokenizer::from_gguf(*gguf::File::open(test::shared_path("vocab/ggml-vocab-llama-spm.gguf")));
  EXPECT_TRUE(llama->is_eog(2));
  EXPECT_FALSE(llama->is_eog(1));
}

// gpt-oss (harmony): a reply ends at <|return|> or, for a tool call, <|call|>; <|end|>
// closes the chain-of-thought message before the final one and ends nothing there. A
// vocabulary without both (Phi-3's) keeps <|end|> as the end of a turn.
TEST(Tokenizer, HarmonyEndsAtReturnOrCallNotEnd) {
  const auto tokenizer = [](std::vector<std::string> specials) {
    Vocab v;
    v.model = "gpt2", v.pre = "gpt-4o", v.add_bos = false;
    v.tokens = {"a", "b"};
    v.types = {TokenType::normal, TokenType::normal};
    for (const std::string& s : specials) v.tokens.push_back(s), v.types.push_back(TokenType::control);
    v.eos_id = 0;  // an id that is not one of the markers
    gguf::Writer w;
    write_vocab_gguf(w, v);
    const std::string path = test::temp_dir() + "/harmony.gguf";
    w.write(path);
    return Tokenizer::from_gguf(*gguf::File::open(path));
  };
  const auto harmony = tokenizer({"<|start|>", "<|end|>", "<|return|>", "<|call|>"});
  EXPECT_FALSE(harmony->is_eog(2));  // <|start|>
  EXPECT_FALSE(harmony->is_eog(3));  // <|end|>
  EXPECT_TRUE(harmony->is_eog(4));   // <|return|>
  EXPECT_TRUE(harmony->is_eog(5));   // <|call|>
  const auto no_call = tokenizer({"<|start|>", "<|end|>", "<|return|>"});
  EXPECT_TRUE(no_call->is_eog(3));
}

TEST(Detokenizer, HoldsPartialCharactersUntilComplete) {
  auto tok = Tokenizer::from_gguf(*gguf::File::open(test::shared_path("models/stories260K.gguf")));
  const std::string llama_emoji = "\xF0\x9F\xA6\x99";
  auto ids = tok->encode("x" + llama_emoji + "y", false);
  // ▁x? then the four byte tokens, then y: find the byte tokens.
  std::vector<int32_t> bytes;
  for (int32_t id : ids) {
    if (tok->vocab().types[(size_t)id] == TokenType::byte) bytes.push_back(id);
  }
  ASSERT_EQ(bytes.size(), 4u);

  Detokenizer d(*tok);
  EXPECT_EQ(d.push(bytes[0]), "");
  EXPECT_EQ(d.push(bytes[1]), "");
  EXPECT_EQ(d.push(bytes[2]), "");
  EXPECT_EQ(d.push(bytes[3]), llama_emoji);
  EXPECT_EQ(d.flush(), "");

  // The streamed text equals the whole decode.
  Detokenizer all(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += all.push(id);
  streamed += all.flush();
  EXPECT_EQ(streamed, tok->decode(ids));

  // A dangling partial character becomes U+FFFD at flush, never raw bytes.
  Detokenizer partial(*tok);
  EXPECT_EQ(partial.push(bytes[0]), "");
  EXPECT_EQ(partial.push(bytes[1]), "");
  EXPECT_EQ(partial.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(partial.flush(), "");
}

TEST(Detokenizer, InvalidByteSequencesBecomeReplacementCharacters) {
  auto tok = Tokenizer::from_gguf(*gguf::File::open(test::shared_path("models/stories260K.gguf")));
  auto byte_token = [&](int b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto& t = tok->vocab().tokens;
    return (int32_t)(std::find(t.begin(), t.end(), name) - t.begin());
  };
  Detokenizer d(*tok);
  // A lead byte followed by a non-continuation byte: the lead can never complete.
  EXPECT_EQ(d.push(byte_token(0xE4)), "");
  EXPECT_EQ(d.push(byte_token(0x41)), "\xEF\xBF\xBD" "A");
  // A stray continuation byte is shown at once as U+FFFD, not held forever.
  EXPECT_EQ(d.push(byte_token(0xA0)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
}

}  // namespace
}  // namespace kiln
