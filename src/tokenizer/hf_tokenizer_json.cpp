// Tokenizer::from_hf_json: a Hugging Face tokenizer.json with a BPE model, read into
// kiln's BpeTokenizer. Each component the file names (normalizer, pre-tokenizer, model
// options) is either reproduced or refused with one line naming it, never ignored.
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <optional>
#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/hf_json_reader.h"
#include "util/json_number.h"
#include "tokenizer/vocab_gguf.h"
#include "util/read_whole_file.h"

namespace kiln {
namespace {

using nlohmann::json;

struct Context {
  std::string path;
  [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + what); }
};

json parse_json(const std::string& path) {
  try {
    return json::parse(read_whole_file(path, "tokenizer file"));
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j.at("type").get<std::string>() : "?"; }

// A Split/Replace pattern: {"String": s} or {"Regex": r}, as a PCRE2 pattern.
std::string pattern_of(const Context& cx, const json& p) {
  if (p.contains("String")) return regex_escape(p.at("String").get<std::string>());
  if (p.contains("Regex")) return p.at("Regex").get<std::string>();
  cx.fail("pattern " + p.dump() + " is neither String nor Regex");
}

SplitBehavior behavior_of(const Context& cx, const json& j) {
  const std::string b = j.value("behavior", "Isolated");
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  cx.fail("split behavior '" + b + "' is not supported");
}

// What decides whether the file's text processing has a GGUF name (tokenizer.ggml.pre):
// the split patterns in order, each isolating its matches, and no normalizer but NFC.
struct PreSignature {
  std::vector<std::string> patterns;
  bool nameable = true;
};

void add_normalizer(const Context& cx, const json& n, Normalizer& out, PreSignature& sig) {
  if (n.is_null()) return;
  const std::string t = type_of(n);
  if (t != "Sequence" && t != "NFC") sig.nameable = false;
  if (t == "Sequence") {
    for (const json& step : n.at("normalizers")) add_normalizer(cx, step, out, sig);
  } else if (t == "NFC") {
    out.add_unicode_form(Normalizer::Form::nfc);
  } else if (t == "NFD") {
    out.add_unicode_form(Normalizer::Form::nfd);
  } else if (t == "NFKC") {
    out.add_unicode_form(Normalizer::Form::nfkc);
  } else if (t == "NFKD") {
    out.add_unicode_form(Normalizer::Form::nfkd);
  } else if (t == "Lowercase") {
    out.add_lowercase();
  } else if (t == "Prepend") {
    out.add_prepend(n.at("prepend").get<std::string>());
  } else if (t == "Replace" && n.at("pattern").contains("String")) {
    out.add_replace(n.at("pattern").at("String").get<std::string>(), n.at("content").get<std::string>());
  } else {
    cx.fail("normalizer " + n.dump().substr(0, 120) +
            " is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace of a string)");
  }
}

// `byte_level` is set when a ByteLevel step is present: merging then runs on GPT-2's
// byte alphabet and pieces decode back through it.
void add_pretokenizer(const Context& cx, const json& p, BpeOptions& opt, bool& byte_level, PreSignature& sig) {
  if (p.is_null()) return;
  const std::string t = type_of(p);
  auto stage = [&](const std::string& pattern, SplitBehavior behavior = SplitBehavior::isolated) {
    opt.pretokenizer.add_stage(pattern, behavior);
    sig.patterns.push_back(pattern);
    if (behavior != SplitBehavior::isolated) sig.nameable = false;
  };
  if (t == "Sequence") {
    for (const json& step : p.at("pretokenizers")) add_pretokenizer(cx, step, opt, byte_level, sig);
  } else if (t == "Split") {
    if (p.value("invert", false)) cx.fail("Split pre-tokenizer with invert: true is not supported");
    stage(pattern_of(cx, p.at("pattern")), behavior_of(cx, p));
  } else if (t == "ByteLevel") {
    byte_level = true;
    // A ByteLevel step adds a space before text that lacks one; kiln applies it to each
    // segment between added tokens, which is where it acts when ByteLevel comes first.
    if (p.value("add_prefix_space", false)) {
      opt.normalizer.add_prepend(" ", /*unless_present=*/true);
      sig.nameable = false;
    }
    if (p.value("use_regex", true)) stage(Pretokenizer::gpt2_pattern());
  } else if (t == "Digits") {
    stage(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (t == "Punctuation") {
    stage(R"([\p{P}\$\+<=>\^~\|`])", behavior_of(cx, p));
  } else {
    cx.fail("pre-tokenizer " + p.dump().substr(0, 120) +
            " is not supported (supported: Sequence, Split, ByteLevel, Digits, Punctuation)");
  }
}

// The token a tokenizer_config.json entry names: "text" or {"content": "text"}.
std::string config_token(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}

std::unique_ptr<Tokenizer> load_hf_json(const std::string& path) {
  const Context cx{path};
  HfJsonDocument doc = read_hf_json(read_whole_file(path, "tokenizer file"), path);
  const json& j = doc.rest;
  if (!j.is_object() || !j.contains("model")) cx.fail("no \"model\" object: not a tokenizer.json");
  const json& m = j.at("model");
  static const json kNone, kEmpty = json::array();
  auto member = [](const json& o, const char* k) -> const json& { return o.contains(k) ? o.at(k) : kNone; };
  const std::string model_type = m.value("type", "BPE");
  if (model_type != "BPE") cx.fail("tokenizer model type '" + model_type + "' is not supported (supported: BPE)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(affix) && m.at(affix).is_string() && !m.at(affix).get<std::string>().empty())
      cx.fail(std::string("BPE ") + affix + " is not supported");
  }

  // Ids come from the vocabulary and the added tokens together; gaps (never seen in
  // published files) become unused placeholders so that every id has a token.
  if (!doc.has_vocab) cx.fail("model.vocab is not an object");
  const json& added = j.contains("added_tokens") ? j.at("added_tokens") : kEmpty;
  int64_t max_id = -1;
  for (const auto& [text, id] : doc.vocab) max_id = std::max(max_id, id);
  // An added token's id, range-checked before conversion (a float such as 1.3e92 does not
  // fit an integer).
  const auto added_id = [&](const json& a) -> int64_t {
    try {
      return json_integer(a.at("id"), "added_tokens id", 0, (1 << 24) - 1);
    } catch (const Error& e) {
      cx.fail(e.what());
    }
  };
  for (const json& a : added) max_id = std::max(max_id, added_id(a));
  if (max_id < 0) cx.fail("the vocabulary is empty");
  if (max_id >= (1 << 24)) cx.fail("token id " + std::to_string(max_id) + " is out of range");
  const size_t n = (size_t)max_id + 1;
  // Each gap costs a placeholder token: without a bound, a 50-byte file naming id 2^24-1
  // made kiln build 16M of them (over 2 GB).
  const size_t named = doc.vocab.size() + added.size();
  if (n > 2 * named + 1024)
    cx.fail("token id " + std::to_string(max_id) + " leaves " + std::to_string(n - named) +
            " ids without a token (the file names " + std::to_string(named) + ")");

  Vocab v;
  v.tokens.resize(n);
  v.types.assign(n, TokenType::unused);
  v.pre = "tokenizer.json";
  auto place = [&](int64_t id, std::string text, TokenType type) {
    if (id < 0) cx.fail("negative token id for '" + text + "'");
    v.tokens[(size_t)id] = std::move(text);
    v.types[(size_t)id] = type;
  };
  for (auto& [text, id] : doc.vocab) place(id, std::move(text), TokenType::normal);
  for (const json& a : added) {
    place(added_id(a), a.at("content").get<std::string>(),
          a.value("special", false) ? TokenType::control : TokenType::user_defined);
  }
  for (size_t i = 0; i < n; ++i) {
    if (v.types[i] == TokenType::unused) v.tokens[i] = "[kiln:unused" + std::to_string(i) + "]";
  }
  // Only a handful of names are looked up (unknown, BOS, EOS...): a scan is enough.
  auto find_id = [&](const std::string& text) -> int32_t {
    for (size_t i = 0; i < n; ++i) {
      if (v.tokens[i] == text) return (int32_t)i;
    }
    return -1;
  };

  BpeOptions opt;
  opt.byte_fallback = m.value("byte_fallback", false);
  opt.fuse_unk = m.value("fuse_unk", false);
  opt.ignore_merges = m.value("ignore_merges", false);
  if (opt.byte_fallback) {
    for (size_t i = 0; i < n; ++i) {
      const std::string& t = v.tokens[i];
      if (v.types[i] == TokenType::normal && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>')
        v.types[i] = TokenType::byte;
    }
  }
  if (m.contains("unk_token") && m.at("unk_token").is_string()) {
    v.unk_id = find_id(m.at("unk_token").get<std::string>());
    if (v.unk_id >= 0) v.types[(size_t)v.unk_id] = TokenType::unknown;
  }

  PreSignature sig;
  add_normalizer(cx, member(j, "normalizer"), opt.normalizer, sig);
  bool byte_level = false;
  add_pretokenizer(cx, member(j, "pre_tokenizer"), opt, byte_level, sig);
  if (type_of(member(j, "decoder")) == "ByteLevel") byte_level = true;
  opt.byte_level = byte_level;
  v.model = byte_level ? "gpt2" : "llama";
  v.add_space_prefix = false;
  // A byte-level split that llama.cpp knows by name gets that name, so that the
  // vocabulary written out as a GGUF (write_vocab_gguf) is tokenized the same way there.
  // NFC is dropped on the way, as converters do: GGUF has no key for it.
  if (byte_level && sig.nameable) {
    const std::string name = Pretokenizer::ggml_pre_name(sig.patterns, opt.ignore_merges);
    if (!name.empty()) v.pre = name;
  }

  // BOS/EOS: tokenizer_config.json beside the file names them; the post-processor's
  // template says whether BOS is added (the config's add_bos_token overrides it). When
  // neither says, a byte-level vocabulary follows llama.cpp's default for its GGUF name
  // (Llama 3 files whose template was lost still get BOS); others add none, as
  // transformers does.
  std::optional<bool> add_bos;
  const json& post = member(j, "post_processor");
  if (type_of(post) == "TemplateProcessing" && post.contains("single") && !post.at("single").empty() &&
      post.at("single").at(0).contains("SpecialToken")) {
    v.bos_id = find_id(post.at("single").at(0).at("SpecialToken").at("id").get<std::string>());
    add_bos = v.bos_id >= 0;
  }
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    const json c = parse_json(config.string());
    if (c.contains("bos_token")) v.bos_id = find_id(config_token(c.at("bos_token")));
    if (c.contains("eos_token")) v.eos_id = find_id(config_token(c.at("eos_token")));
    if (c.contains("pad_token")) v.pad_id = find_id(config_token(c.at("pad_token")));
    if (c.contains("add_bos_token") && c.at("add_bos_token").is_boolean()) add_bos = c.at("add_bos_token").get<bool>();
    if (c.contains("add_eos_token") && c.at("add_eos_token").is_boolean()) v.add_eos = c.at("add_eos_token").get<bool>();
  }
  v.add_bos = add_bos.value_or(byte_level && default_add_bos(v.model, v.pre)) && v.bos_id >= 0;

  const auto merges = doc.merges();
  // The vocabulary keeps them as GGUF spells them ("a b"), so it can be written out as one.
  v.merges.reserve(merges.size());
  for (const auto& [a, b] : merges) v.merges.emplace_back(std::string(a).append(" ").append(b));
  return std::make_unique<BpeTokenizer>(std::move(v), merges, std::move(opt), path);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  try {
    return load_hf_json(path);
  } catch (const nlohmann::json::exception& e) {
    // A missing key or a value of the wrong type: the file is not what it claims.
    throw Error(path + ": unexpected tokenizer.json content: " + e.what());
  }
}

}  // namespace kiln
