// Tokenization against reference data: the vocab test vectors in ../shared/vocab
// (SentencePiece and byte-level BPE families) and the llama2.c tok512.model that
// stories260K.gguf was converted from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#if __has_include(<sentencepiece_processor.h>)
#include <sentencepiece_processor.h>
#define KILN_TEST_HAVE_SPM 1
#endif

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

struct VocabCase {
  std::string input;
  std::vector<int32_t> expected;
};

// NAME.gguf.inp: inputs each followed by "\n__ggml_vocab_test__\n"; NAME.gguf.out: one
// line of space-separated ids per input.
// `dir`: ../shared, or tests/data for vectors made here (tests/data/vocab/README.md).
std::vector<VocabCase> load_cases(const std::string& gguf_rel, const std::string& dir = test::shared_dir()) {
  const std::string inp = test::read_file(dir + "/" + gguf_rel + ".inp");
  const std::string outp = test::read_file(dir + "/" + gguf_rel + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < inp.size();) {
    size_t end = inp.find(sep, pos);
    if (end == std::string::npos) end = inp.size();
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(outp);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    if (i >= cases.size()) {
      ADD_FAILURE() << gguf_rel << ".out has more lines than inputs";
      break;
    }
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) cases[i].expected.push_back(id);
    ++i;
  }
  EXPECT_EQ(i, cases.size()) << gguf_rel << ": inputs and expected lines differ in number";
  return cases;
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& rel) {
  auto file = gguf::File::open(test::shared_path(rel));
  return Tokenizer::from_gguf(*file);
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class VocabVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabVectors, ReproducesEveryReferenceLine) {
  const std::string rel = std::string("vocab/") + GetParam();
  auto tok = gguf_tokenizer(rel);
  const auto cases = load_cases(rel);
  ASSERT_EQ(cases.size(), 46u);  // guards against a parser that silently reads nothing
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok->encode(cases[i].input, /*add_bos=*/false);
    if (got == cases[i].expected) {
      ++passed;
    } else {
      ADD_FAILURE() << rel << " case " << i << " input [" << cases[i].input << "]\n  expected "
                    << ids_to_string(cases[i].expected) << "\n  got      " << ids_to_string(got);
    }
  }
  EXPECT_EQ(passed, cases.size());
  std::printf("%s: %zu/%zu inputs reproduced\n", GetParam(), passed, cases.size());
}

// `kiln tokenize` gives the same ids as the library on the family's longest input (one
// process per family keeps this fast; the library test above covers every line).
TEST_P(VocabVectors, KilnTokenizeMatchesTheLongestLine) {
  const std::string rel = std::string("vocab/") + GetParam();
  const auto cases = load_cases(rel);
  size_t longest = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].input.size() > cases[longest].input.size()) longest = i;
  }
  const std::string file = test::temp_dir() + "/input.txt";
  test::write_file(file, cases[longest].input);
  const auto r = test::run_command(test::shell_quote(test::kiln_binary()) + " tokenize " +
                                   test::shell_quote(test::shared_path(rel)) + " -f " + test::shell_quote(file) +
                                   " --ids --no-bos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string want = "[";
  for (size_t i = 0; i < cases[longest].expected.size(); ++i)
    want += (i ? ", " : "") + std::to_string(cases[longest].expected[i]);
  EXPECT_EQ(test::trim(r.out), want + "]");
}

// decode(encode(x)) gives x back (every family here is lossless), with the dummy-prefix
// space in front of non-empty text for SentencePiece.
TEST_P(VocabVectors, DecodeRoundTrips) {
  const std::string rel = std::string("vocab/") + GetParam();
  auto tok = gguf_tokenizer(rel);
  if (tok->vocab().model == "bert") GTEST_SKIP() << "WordPiece lower-cases and strips accents: not lossless";
  const bool spm = tok->vocab().model == "llama";
  ASSERT_EQ(tok->vocab().add_space_prefix, spm);
  for (const auto& c : load_cases(rel)) {
    const std::string expected = c.input.empty() || !spm ? c.input : " " + c.input;
    EXPECT_EQ(tok->decode(tok->encode(c.input, false)), expected) << "input [" << c.input << "]";
    // BOS decodes to nothing unless special tokens are asked for.
    EXPECT_EQ(tok->decode(tok->encode(c.input, true)), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Spm, VocabVectors,
                         ::testing::Values("ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"));
// Byte-level BPE, one pre-tokenizer each (tokenizer.ggml.pre): GPT-2's split (gpt-2,
// mpt with its user-defined runs of spaces), digits first (starcoder, refact), DeepSeek's
// staged splits (deepseek-llm, deepseek-coder), punctuation and groups of three digits
// (falcon).
INSTANTIATE_TEST_SUITE_P(Bpe, VocabVectors,
                         ::testing::Values("ggml-vocab-gpt-2.gguf", "ggml-vocab-mpt.gguf", "ggml-vocab-starcoder.gguf",
                                           "ggml-vocab-refact.gguf", "ggml-vocab-deepseek-llm.gguf",
                                           "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-falcon.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name = name.substr(11, name.size() - 16);  // ggml-vocab-NAME.gguf
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });
// WordPiece (tokenizer.ggml.model bert): BERT's normalizer and split, "▁"-marked word starts.
INSTANTIATE_TEST_SUITE_P(WordPiece, VocabVectors, ::testing::Values("ggml-vocab-bert-bge.gguf"));

// Vocabularies without test vectors still load and split text: gpt-neox (byte-level BPE
// without tokenizer.ggml.pre: llama.cpp's default split) and baichuan (SentencePiece).
TEST(VocabFiles, WithoutVectorsStillLoadAndRoundTrip) {
  const std::string text = "Hello world!  It's 2024: \xE4\xBD\xA0\xE5\xA5\xBD\n\tdone";
  auto neox = gguf_tokenizer("vocab/ggml-vocab-gpt-neox.gguf");
  EXPECT_EQ(neox->vocab().pre, "");
  EXPECT_EQ(neox->decode(neox->encode(text, false)), text);
  auto baichuan = gguf_tokenizer("vocab/ggml-vocab-baichuan.gguf");
  EXPECT_EQ(baichuan->decode(baichuan->encode(text, false)), " " + text);
}

// A byte-level BPE file without tokenizer.ggml.pre (gpt-neox) gets the split llama.cpp
// falls back to for such files (its "default" pre-tokenizer, not GPT-2's own): punctuation
// runs, the GPT-2 split, digit runs apart from the space before them, digits in threes.
// The pieces below are worked out by hand from those four stages; GPT-2's split alone
// would give " ,world" and " 1234567".
TEST(VocabFiles, MissingPreSplitsAsLlamaCppsDefault) {
  const Pretokenizer p = Pretokenizer::for_ggml_pre("", nullptr);
  const auto pieces = [&p](std::string_view text) {
    std::vector<std::string> out;
    for (std::string_view piece : p.split(text)) out.emplace_back(piece);
    return out;
  };
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello ,world"), (Pieces{"Hello", " ", ",", "world"}));
  EXPECT_EQ(pieces("it costs 1234567 dollars"), (Pieces{"it", " costs", " ", "123", "456", "7", " dollars"}));
  EXPECT_EQ(pieces("a+=b... $5"), (Pieces{"a", "+=", "b", "...", " ", "$", "5"}));
  EXPECT_EQ(pieces("x  \ty 42"), (Pieces{"x", "  ", "\t", "y", " ", "42"}));
  // llama.cpp's own ids for gpt-neox on the 46 inputs of its vocabulary tests (made with
  // llama-tokenize: tests/data/vocab/README.md).
  auto neox_file = gguf_tokenizer("vocab/ggml-vocab-gpt-neox.gguf");
  const auto cases = load_cases("vocab/ggml-vocab-gpt-neox.gguf", std::string(KILN_SOURCE_DIR) + "/tests/data");
  ASSERT_EQ(cases.size(), 46u);
  for (const VocabCase& c : cases)
    EXPECT_EQ(ids_to_string(neox_file->encode(c.input, false)), ids_to_string(c.expected)) << "input [" << c.input << "]";
  // The tokens of the file follow those boundaries: no token spans "123|456|7" or the
  // space before the number.
  auto neox = gguf_tokenizer("vocab/ggml-vocab-gpt-neox.gguf");
  std::vector<std::string> token_text;
  for (int32_t id : neox->encode("it costs 1234567 dollars", false)) token_text.push_back(neox->decode({id}));
  std::vector<size_t> ends;
  size_t at = 0;
  for (const std::string& t : token_text) ends.push_back(at += t.size());
  for (size_t boundary : {8u, 9u, 12u, 15u, 16u})
    EXPECT_NE(std::find(ends.begin(), ends.end(), boundary), ends.end()) << "no token ends at byte " << boundary;
}

// gpt-oss's split (tokenizer.ggml.pre "gpt-4o", o200k's pattern as llama.cpp runs it). No
// o200k vocabulary is available here, so Llama 3's tokenizer.json is written as a GGUF
// vocabulary with gpt-oss's pre name, as kiln-gen writes gpt-oss-tiny (whose file
// llama.cpp tokenized): its 58 inputs (the 46 of llama.cpp's vocabulary tests, prompt.txt,
// and contractions in every case, camel case, accented capitals, combining marks, CJK,
// digits, punctuation runs with newlines and slashes, Unicode spaces, emoji sequences)
// must give llama.cpp's ids (tests/data/vocab/README.md). A few pieces worked out by hand
// from the pattern, and Llama 3's split differing on some inputs, show the cases can tell.
TEST(VocabFiles, Gpt4oSplitMatchesLlamaCpp) {
  const Pretokenizer p = Pretokenizer::for_ggml_pre("gpt-4o", nullptr);
  const auto pieces = [&p](std::string_view text) {
    std::vector<std::string> out;
    for (std::string_view piece : p.split(text)) out.emplace_back(piece);
    return out;
  };
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces("HelloWorld XMLHttp"), (Pieces{"Hello", "World", " XMLHttp"}));
  EXPECT_EQ(pieces("I'M they'RE"), (Pieces{"I'M", " they'RE"}));
  EXPECT_EQ(pieces("1234567 a/b x!!\n/y"), (Pieces{"123", "456", "7", " a", "/b", " x", "!!\n/", "y"}));
  const std::string json = test::shared_path("tokenizers/llama3-hf/tokenizer.json");
  const auto with_pre = [&](const std::string& pre) {
    Vocab v = Tokenizer::from_file(json)->vocab();
    v.pre = pre;
    gguf::Writer w;
    write_vocab_gguf(w, v);
    const std::string path = test::temp_dir() + "/llama3-as-" + pre + ".gguf";
    w.write(path);
    return Tokenizer::from_gguf(*gguf::File::open(path));
  };
  const auto tok = with_pre("gpt-4o"), llama3 = with_pre("llama-bpe");
  const auto cases = load_cases("vocab/gpt-4o-llama3", std::string(KILN_SOURCE_DIR) + "/tests/data");
  ASSERT_EQ(cases.size(), 58u);
  const Pretokenizer llama3_split = Pretokenizer::for_ggml_pre("llama-bpe", nullptr);
  size_t ids_differ = 0, pieces_differ = 0;
  for (const VocabCase& c : cases) {
    const auto got = tok->encode(c.input, false);
    EXPECT_EQ(ids_to_string(got), ids_to_string(c.expected)) << "input [" << c.input << "]";
    ids_differ += llama3->encode(c.input, false) != got;
    pieces_differ += p.split(c.input) != llama3_split.split(c.input);
  }
  // Llama 3's vocabulary has few tokens that cross o200k's extra boundaries (case
  // changes, slashes after punctuation), so most differing splits still give the same ids.
  std::printf("gpt-4o split: %zu of %zu inputs split otherwise than Llama 3's, %zu give other ids\n", pieces_differ,
              cases.size(), ids_differ);
  EXPECT_GE(pieces_differ, 5u);
  EXPECT_GE(ids_differ, 1u);
}

// Phi-3's special tokens take the whitespace after them, as llama.cpp sets for files named
// Phi-3 (GGUF has no key for it): every control/user-defined/unknown token except <unk>,
// <s> and <|endoftext|>. Expected ids follow llama.cpp's rules: a special token, then the
// text after it minus its leading whitespace, tokenized as plain text (with SentencePiece's
// space prefix, which llama.cpp gives every text fragment after a special token), and
// llama-tokenize gives the same ids.
TEST(VocabFiles, Phi3SpecialTokensTakeTheWhitespaceAfterThem) {
  auto tok = gguf_tokenizer("vocab/ggml-vocab-phi-3.gguf");
  const auto plain = [&tok](std::string_view text) { return tok->encode(text, false); };
  const auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const int32_t user = 32010, end = 32007, assistant = 32001, endoftext = 32000;
  EXPECT_EQ(tok->encode("<|user|>\nHello<|end|>\n<|assistant|>", false, true),
            cat({{user}, plain("Hello"), {end, assistant}}));
  EXPECT_EQ(tok->encode("<|user|> \t Hi there <|end|>  \n", false, true), cat({{user}, plain("Hi there "), {end}}));
  // <|endoftext|> keeps what follows, and nothing strips the whitespace before a token.
  EXPECT_EQ(tok->encode("Hi <|endoftext|> you", false, true), cat({plain("Hi "), {endoftext}, plain(" you")}));
  // Without special parsing the text is text.
  EXPECT_EQ(tok->encode("<|end|>\nx", false, false), plain("<|end|>\nx"));
  // The same inputs through llama.cpp's llama-tokenize (--ids --no-bos; built as in
  // tests/data/vocab/README.md), 2026-12-03.
  EXPECT_EQ(tok->encode("<|user|>\nHello<|end|>\n<|assistant|>", false, true),
            (std::vector<int32_t>{32010, 15043, 32007, 32001}));
  EXPECT_EQ(tok->encode("<|user|> \t Hi there <|end|>  \n", false, true),
            (std::vector<int32_t>{32010, 6324, 727, 29871, 32007}));
  EXPECT_EQ(tok->encode("Hi <|endoftext|> you", false, true), (std::vector<int32_t>{6324, 29871, 32000, 29871, 366}));
  EXPECT_EQ(tok->encode("<|end|>\nx", false, true), (std::vector<int32_t>{32007, 921}));
}

// tok512.model was trained with remove_extra_whitespaces=true (its default), which GGUF
// conversion does not carry over, so these texts avoid leading/trailing/double spaces.
const std::vector<std::string> kStoryTexts = {
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily.",
    "She liked to play outside in the sun. One day, she saw a big red ball!",
    "\"Mommy, can I have it?\" asked Tom.",
    "The cat's toy was 123 inches long; wow.",
    "Zebras and quixotic jugglers vex the brave xylophone.",
    "caf\xC3\xA9 na\xC3\xAFve \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99 \xD0\x9F\xD1\x80\xD0\xB8",
    "line one\nline two\ttab",
    "a",
    "",
};

TEST(Stories260K, GgufMatchesTok512ModelFile) {
  auto from_gguf = gguf_tokenizer("models/stories260K.gguf");
  auto from_file = Tokenizer::from_spm_file(test::shared_path("models/tok512.model"));
  ASSERT_EQ(from_gguf->n_vocab(), 512);
  ASSERT_EQ(from_file->n_vocab(), 512);
  EXPECT_EQ(from_gguf->vocab().tokens, from_file->vocab().tokens);
  EXPECT_EQ(from_file->bos(), 1);
  EXPECT_EQ(from_file->eos(), 2);
  EXPECT_EQ(from_file->vocab().unk_id, 0);
  for (const std::string& text : kStoryTexts) {
    for (bool bos : {false, true}) {
      EXPECT_EQ(from_gguf->encode(text, bos), from_file->encode(text, bos)) << "text [" << text << "]";
    }
  }
}

TEST(Stories260K, OnceUponATimeKnownIds) {
  // From tok512.model through libsentencepiece alone (a standalone program, outside kiln):
  // <s> ▁Once ▁upon ▁a ▁time
  const std::vector<int32_t> expected = {1, 403, 407, 261, 378};
  auto tok = gguf_tokenizer("models/stories260K.gguf");
  EXPECT_EQ(tok->encode("Once upon a time", true), expected);
  EXPECT_EQ(tok->encode("Once upon a time", false),
            std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(tok->decode(expected), " Once upon a time");
}

#ifdef KILN_TEST_HAVE_SPM
// The same comparison computed at test time by calling libsentencepiece directly.
TEST(Stories260K, MatchesLibsentencepieceDirectly) {
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(test::shared_path("models/tok512.model")).ok());
  auto tok = gguf_tokenizer("models/stories260K.gguf");
  for (const std::string& text : kStoryTexts) {
    std::vector<int> ref;
    ASSERT_TRUE(sp.Encode(text, &ref).ok());
    EXPECT_EQ(tok->encode(text, false), std::vector<int32_t>(ref.begin(), ref.end()))
        << "text [" << text << "]";
  }
}

// A tokenizer.model loaded with from_spm_file behaves exactly like libsentencepiece on
// it, whatever its normalizer settings (openllama strips extra whitespace, llama2 not).
TEST(SpmFile, MatchesLibsentencepieceOnEveryModelFile) {
  const std::vector<std::string> texts = {
      "Hello world", "  leading and  double  spaces ", "tabs\tand\nnewlines\n",
      "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99", "<s> is plain text here", ""};
  for (const char* rel : {"models/tok512.model", "tokenizers/llama2-spm/tokenizer.model",
                          "tokenizers/openllama-spm/tokenizer.model"}) {
    sentencepiece::SentencePieceProcessor sp;
    ASSERT_TRUE(sp.Load(test::shared_path(rel)).ok()) << rel;
    auto tok = Tokenizer::from_spm_file(test::shared_path(rel));
    EXPECT_EQ(tok->n_vocab(), sp.GetPieceSize()) << rel;
    EXPECT_EQ(tok->bos(), sp.bos_id()) << rel;
    EXPECT_EQ(tok->eos(), sp.eos_id()) << rel;
    EXPECT_EQ(tok->vocab().unk_id, sp.unk_id()) << rel;
    for (const std::string& text : texts) {
      std::vector<int> ref;
      ASSERT_TRUE(sp.Encode(text, &ref).ok());
      EXPECT_EQ(tok->encode(text, false), std::vector<int32_t>(ref.begin(), ref.end()))
          << rel << " text [" << text << "]";
    }
  }
}
#endif

// Characters the 512-piece vocabulary lacks come out as their UTF-8 bytes.
TEST(Stories260K, ByteFallbackForEmojiAndCjk) {
  auto tok = gguf_tokenizer("models/stories260K.gguf");
  const auto& v = tok->vocab();
  auto byte_id = [&](int b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v.tokens[i] == name) return (int32_t)i;
    }
    return -1;
  };
  for (const std::string text : {"\xF0\x9F\xA6\x99", "\xE4\xBD\xA0\xE5\xA5\xBD"}) {  // 🦙, 你好
    const auto ids = tok->encode(text, false);
    ASSERT_EQ(ids.size(), text.size() + 1) << "expected ▁ then one token per byte";
    EXPECT_EQ(v.tokens[(size_t)ids[0]], "\xE2\x96\x81");
    for (size_t i = 0; i < text.size(); ++i) {
      EXPECT_EQ(ids[i + 1], byte_id((uint8_t)text[i]));
      EXPECT_EQ(v.types[(size_t)ids[i + 1]], TokenType::byte);
    }
    EXPECT_EQ(tok->decode(ids), " " + text);
  }
}

TEST(Stories260K, FromSpmFileHonoursItsOwnNormalizer) {
  // tok512.model collapses runs of spaces (remove_extra_whitespaces defaults to true in
  // its normalizer spec); the GGUF conversion keeps them, as llama.cpp does.
  auto from_file = Tokenizer::from_spm_file(test::shared_path("models/tok512.model"));
  auto from_gguf = gguf_tokenizer("models/stories260K.gguf");
  EXPECT_EQ(from_file->encode("a  b", false), from_file->encode("a b", false));
  EXPECT_NE(from_gguf->encode("a  b", false), from_gguf->encode("a b", false));
}

TEST(SpmFile, MissingFileThrowsNamingIt) {
  try {
    Tokenizer::from_spm_file("/nonexistent/tokenizer.model");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.model"), std::string::npos);
  }
}

TEST(SpmFile, Llama2ModelMatchesLlamaSpmGguf) {
  auto from_file = Tokenizer::from_spm_file(test::shared_path("tokenizers/llama2-spm/tokenizer.model"));
  auto from_gguf = gguf_tokenizer("vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_EQ(from_file->n_vocab(), from_gguf->n_vocab());
  EXPECT_EQ(from_file->vocab().types, from_gguf->vocab().types);
  for (const auto& c : load_cases("vocab/ggml-vocab-llama-spm.gguf")) {
    EXPECT_EQ(from_file->encode(c.input, false), c.expected) << "input [" << c.input << "]";
  }
}

}  // namespace
}  // namespace kiln
