// Vocab::from_gguf: the tokenizer.ggml.* keys, with llama.cpp's per-model defaults for
// whatever a file leaves out, validated so that no later lookup can go out of range.
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "kiln/error.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace kiln {
namespace {

constexpr std::string_view kPrefix = "tokenizer.ggml.";

std::string key(std::string_view name) { return std::string(kPrefix) + std::string(name); }

// Defaults a converter relies on when it omits keys; they follow the conventions GGUF
// producers assume for each tokenizer family.
void apply_model_defaults(Vocab& v) {
  if (v.model == "llama") {
    v.bos_id = 1, v.eos_id = 2, v.unk_id = 0;
    v.add_bos = true, v.add_space_prefix = true;
  } else if (v.model == "gpt2") {
    v.bos_id = 11, v.eos_id = 11;
    v.add_bos = default_add_bos(v.model, v.pre), v.add_space_prefix = false;
  } else if (v.model == "bert") {
    v.bos_id = 101, v.unk_id = 100, v.pad_id = 0, v.sep_id = 102;
    v.add_bos = true, v.add_space_prefix = false;
  } else if (v.model == "t5") {
    v.eos_id = 1, v.unk_id = 2, v.pad_id = 0;
    v.add_bos = false, v.add_space_prefix = true;
  } else {
    v.add_bos = false, v.add_space_prefix = false;
  }
}

// A special token id: absent -> keep the default; 0xFFFFFFFF / -1 -> "none" (converters
// write that for unset ids); anything else must index the vocabulary.
void read_special_id(const gguf::File& f, std::string_view name, const Vocab& v, int32_t& id,
                     bool tolerate_out_of_range = false) {
  const std::string k = key(name);
  const gguf::Value* val = f.find(k);
  if (!val) return;
  if (!val->is_integer()) {
    throw Error(f.path() + ": " + k + " has type " + gguf::value_type_name(val->type) +
                ", expected an integer");
  }
  const bool is_signed = val->type == gguf::ValueType::INT8 || val->type == gguf::ValueType::INT16 ||
                         val->type == gguf::ValueType::INT32 || val->type == gguf::ValueType::INT64;
  if ((is_signed && val->i == -1) || (!is_signed && (val->u == 0xFFFFFFFFull || val->u == ~0ull))) {
    id = -1;
    return;
  }
  const bool in_range = is_signed ? (val->i >= 0 && (uint64_t)val->i < v.size()) : val->u < v.size();
  if (in_range) {
    id = is_signed ? (int32_t)val->i : (int32_t)val->u;
    return;
  }
  // Published files exist whose padding id points one past the vocabulary; padding is
  // never used for generation, so such a file stays loadable without it.
  if (tolerate_out_of_range) {
    id = -1;
    return;
  }
  throw Error(f.path() + ": " + k + " is " + (is_signed ? std::to_string(val->i) : std::to_string(val->u)) +
              ", outside the vocabulary of " + std::to_string(v.size()) + " tokens");
}

// Phi-3 (general.name containing "phi-3" or "phi3") was trained with its chat tokens
// eating the whitespace after them ("<|user|>\nHi" is "<|user|>" then "Hi"): llama.cpp
// gives every control, user-defined and unknown token that rstrip, except <unk>, <s> and
// <|endoftext|>; Hugging Face's tokenizer.json states it per added token.
void set_strip_by_model_name(const gguf::File& f, Vocab& v) {
  std::string name = f.get_string("general.name", "");
  for (char& c : name) c = (char)std::tolower((unsigned char)c);
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  v.strip.assign(v.size(), 0);
  for (size_t i = 0; i < v.size() && i < v.types.size(); ++i) {
    const TokenType t = v.types[i];
    const bool special = t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown;
    const std::string& text = v.tokens[i];
    if ((special || text == "</s>") && text != "<unk>" && text != "<s>" && text != "<|endoftext|>")
      v.strip[i] = Vocab::kStripAfter;
  }
}

void check_length(const gguf::File& f, std::string_view name, size_t n, size_t n_tokens) {
  if (n != 0 && n != n_tokens) {
    throw Error(f.path() + ": " + key(name) + " has " + std::to_string(n) + " entries, tokens has " +
                std::to_string(n_tokens));
  }
}

}  // namespace

bool default_add_bos(const std::string& model, const std::string& pre) {
  if (model == "llama" || model == "bert") return true;
  // Not every Llama 3 tokenizer.json has the post-processor that adds BOS (../shared's
  // does not), so converters may write no add_bos_token; llama.cpp then adds it anyway.
  if (model == "gpt2") return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
  return false;
}

void write_vocab_gguf(gguf::Writer& w, const Vocab& v) {
  using gguf::Value;
  using gguf::ValueType;
  std::vector<Value> token_values, score_values, type_values;
  token_values.reserve(v.tokens.size());
  for (const auto& t : v.tokens) token_values.push_back(Value::of_string(t));
  for (float s : v.scores) score_values.push_back(Value::of_f32(s));
  for (TokenType t : v.types) type_values.push_back(Value::of_i32((int32_t)t));
  w.set(key("model"), Value::of_string(v.model));
  if (!v.pre.empty() && v.pre != "tokenizer.json") w.set(key("pre"), Value::of_string(v.pre));
  w.set(key("tokens"), Value::of_array(ValueType::STRING, std::move(token_values)));
  if (!score_values.empty()) w.set(key("scores"), Value::of_array(ValueType::FLOAT32, std::move(score_values)));
  if (!type_values.empty()) w.set(key("token_type"), Value::of_array(ValueType::INT32, std::move(type_values)));
  if (!v.merges.empty()) {
    std::vector<Value> merge_values;
    merge_values.reserve(v.merges.size());
    for (const auto& m : v.merges) merge_values.push_back(Value::of_string(m));
    w.set(key("merges"), Value::of_array(ValueType::STRING, std::move(merge_values)));
  }
  const std::pair<const char*, int32_t> ids[] = {{"bos_token_id", v.bos_id},     {"eos_token_id", v.eos_id},
                                                 {"unknown_token_id", v.unk_id}, {"padding_token_id", v.pad_id},
                                                 {"eot_token_id", v.eot_id},     {"eom_token_id", v.eom_id}};
  for (const auto& [name, id] : ids) {
    if (id >= 0) w.set(key(name), Value::of_u32((uint32_t)id));
  }
  w.set(key("add_bos_token"), Value::of_bool(v.add_bos));
  if (v.add_eos) w.set(key("add_eos_token"), Value::of_bool(true));
  w.set(key("add_space_prefix"), Value::of_bool(v.add_space_prefix));
}

Vocab Vocab::from_gguf(const gguf::File& f) {
  Vocab v;
  v.model = f.get_string(key("model"));
  v.pre = f.get_string(key("pre"), "");
  apply_model_defaults(v);
  // "none"/"no_vocab" files (embedding-only models) legitimately carry no tokens.
  if (v.model == "none" || v.model == "no_vocab") {
    if (!f.has(key("tokens"))) return v;
  }

  v.tokens = f.get_string_array(key("tokens"));
  v.scores = f.get_float_array(key("scores"));
  check_length(f, "scores", v.scores.size(), v.tokens.size());

  const std::vector<int32_t> types = f.get_int_array(key("token_type"));
  check_length(f, "token_type", types.size(), v.tokens.size());
  v.types.reserve(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] < 0 || types[i] > (int32_t)TokenType::byte) {
      throw Error(f.path() + ": " + key("token_type") + "[" + std::to_string(i) + "] is " +
                  std::to_string(types[i]) + ", not a known token type (0..6)");
    }
    v.types.push_back((TokenType)types[i]);
  }
  if (f.has(key("merges"))) v.merges = f.get_string_array(key("merges"));

  read_special_id(f, "bos_token_id", v, v.bos_id);
  read_special_id(f, "eos_token_id", v, v.eos_id);
  read_special_id(f, "unknown_token_id", v, v.unk_id);
  read_special_id(f, "padding_token_id", v, v.pad_id, /*tolerate_out_of_range=*/true);
  read_special_id(f, "eot_token_id", v, v.eot_id);
  read_special_id(f, "eom_token_id", v, v.eom_id);
  read_special_id(f, "seperator_token_id", v, v.sep_id);
  // Defaults may not fit a small vocabulary (bert's 101 in a 50-token test vocab).
  for (int32_t* id : {&v.bos_id, &v.eos_id, &v.unk_id, &v.pad_id, &v.eot_id, &v.eom_id, &v.sep_id}) {
    if (*id >= (int32_t)v.size()) *id = -1;
  }

  v.add_bos = f.get_bool(key("add_bos_token"), v.add_bos);
  v.add_eos = f.get_bool(key("add_eos_token"), v.add_eos);
  v.add_space_prefix = f.get_bool(key("add_space_prefix"), v.add_space_prefix);
  set_strip_by_model_name(f, v);
  return v;
}

}  // namespace kiln
