#include "tokenizer/hf_json_reader.h"

#include "kiln/error.h"

namespace kiln {
namespace {

using nlohmann::json;

// SAX events build a tree for everything but model.vocab / model.merges, whose entries
// go to the document's vectors.
class Handler : public nlohmann::json_sax<json> {
 public:
  Handler(HfJsonDocument& doc, const std::string& origin) : doc_(doc), origin_(origin) {}

  bool null() override { return value(json()); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return integer((int64_t)v); }
  // Above INT64_MAX only outside the vocabulary (no id is that large): kept unsigned.
  bool number_unsigned(number_unsigned_t v) override {
    if (v <= number_unsigned_t(INT64_MAX)) return integer(int64_t(v));
    if (mode_ == Mode::vocab) return fail("model.vocab id " + std::to_string(v) + " is out of range");
    return value(v);
  }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool string(string_t& s) override {
    if (mode_ == Mode::merges) return merge_string(s);
    if (mode_ == Mode::merge_pair) {
      if (++parts_ > 2) return fail("a merge has more than two parts");
      add_part(s);
      return true;
    }
    if (mode_ == Mode::vocab) return fail("model.vocab maps tokens to ids, not to strings");
    return value(std::move(s));
  }

  bool key(string_t& k) override {
    if (mode_ == Mode::vocab) {
      key_ = std::move(k);
      return true;
    }
    keys_.back() = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::normal && in_model() && keys_.back() == "vocab") {
      mode_ = Mode::vocab;
      doc_.has_vocab = true;
      return true;
    }
    if (mode_ != Mode::normal) return fail("unexpected object inside model.vocab or model.merges");
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::vocab) {
      mode_ = Mode::normal;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::normal && in_model() && keys_.back() == "merges") {
      mode_ = Mode::merges;
      return true;
    }
    if (mode_ == Mode::merges) {
      mode_ = Mode::merge_pair;
      parts_ = 0;
      return true;
    }
    if (mode_ != Mode::normal) return fail("unexpected array inside model.vocab or a merge");
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::merge_pair) {
      if (parts_ != 2) return fail("a merge is not a pair");
      mode_ = Mode::merges;
      return true;
    }
    if (mode_ == Mode::merges) {
      mode_ = Mode::normal;
      return true;
    }
    return close();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw Error(origin_ + ": not valid JSON: " + e.what());
  }

 private:
  enum class Mode { normal, vocab, merges, merge_pair };

  [[noreturn]] bool fail(const std::string& what) { throw Error(origin_ + ": " + what); }

  // Directly inside the top-level "model" object.
  bool in_model() const { return stack_.size() == 2 && keys_[0] == "model" && stack_[1]->is_object(); }

  json* place(json v) {
    if (stack_.empty()) {
      doc_.rest = std::move(v);
      return &doc_.rest;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[keys_.back()];
    slot = std::move(v);
    return &slot;
  }
  bool value(json v) {
    if (mode_ != Mode::normal) return fail("unexpected value inside model.vocab or model.merges");
    place(std::move(v));
    return true;
  }
  bool integer(int64_t v) {
    if (mode_ == Mode::vocab) {
      doc_.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return value(v);
  }
  bool merge_string(std::string& s) {
    // "a b": byte-level and "▁" tokens never contain a space, so the first one after
    // the first character separates the parts.
    const size_t sp = s.find(' ', 1);
    if (sp == std::string::npos) return fail("merge '" + s + "' has no space");
    add_part(std::string_view(s).substr(0, sp));
    add_part(std::string_view(s).substr(sp + 1));
    return true;
  }
  void add_part(std::string_view part) {
    doc_.merge_chars.append(part);
    if (doc_.merge_chars.size() > UINT32_MAX) fail("model.merges is too large");
    doc_.merge_ends.push_back((uint32_t)doc_.merge_chars.size());
  }
  bool open(json container) {
    stack_.push_back(place(std::move(container)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  HfJsonDocument& doc_;
  const std::string& origin_;
  Mode mode_ = Mode::normal;
  std::vector<json*> stack_;         // open containers, outermost first
  std::vector<std::string> keys_;    // the current key of each open object
  std::string key_;                  // current vocabulary token
  int parts_ = 0;                    // parts of the merge being read
};

}  // namespace

std::vector<std::pair<std::string_view, std::string_view>> HfJsonDocument::merges() const {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  out.reserve(merge_ends.size() / 2);
  const std::string_view all = merge_chars;
  uint32_t begin = 0;
  for (size_t i = 0; i + 1 < merge_ends.size(); i += 2) {
    const uint32_t mid = merge_ends[i], end = merge_ends[i + 1];
    out.emplace_back(all.substr(begin, mid - begin), all.substr(mid, end - mid));
    begin = end;
  }
  return out;
}

HfJsonDocument read_hf_json(const std::string& text, const std::string& origin) {
  HfJsonDocument doc;
  Handler h(doc, origin);
  json::sax_parse(text, &h);
  return doc;
}

}  // namespace kiln
