// The Python methods templates call on values: message.content.startswith('<think>'),
// text.split('</think>')[-1].lstrip('\n'), d.items(), list.append(x)... Indexes count code
// points, as Python's do.
#include <algorithm>
#include <unordered_map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/unicode.h"

namespace kiln::jinja {
namespace {

using Method = Value (*)(const Value& self, const CallArgs& args);

std::string arg_string(const Value& v, const char* function, const char* what = "argument") {
  if (!v.is_string())
    throw TemplateError(std::string(function) + "() " + what + " must be str, not " + v.type_name());
  return v.str();
}

// Python's optional start/end arguments of find/count/startswith, as a code point range.
std::u32string substring(const std::u32string& s, const Arguments& a, size_t start_index) {
  const int64_t n = (int64_t)s.size();
  auto bound = [&](size_t i, int64_t fallback) {
    if (!a.has(i) || a.get(i).is_none()) return fallback;
    int64_t v = a.get(i).as_int();
    if (v < 0) v = std::max<int64_t>(0, v + n);
    return std::min(v, n);
  };
  const int64_t b = bound(start_index, 0), e = bound(start_index + 1, n);
  return b >= e ? std::u32string() : s.substr((size_t)b, (size_t)(e - b));
}

Value str_upper(const Value& self, const CallArgs&) { return Value(unicode::upper(self.str())); }
Value str_lower(const Value& self, const CallArgs&) { return Value(unicode::lower(self.str())); }
Value str_title(const Value& self, const CallArgs&) { return Value(python_title(self.str())); }
Value str_capitalize(const Value& self, const CallArgs&) { return Value(python_capitalize(self.str())); }

template <bool Left, bool Right>
Value str_strip(const Value& self, const CallArgs& args) {
  Arguments a(args, "strip", {"chars"});
  if (!a.has(0) || a.get(0).is_none()) return Value(unicode::strip(self.str(), nullptr, Left, Right));
  const std::string chars = arg_string(a.get(0), "strip");
  return Value(unicode::strip(self.str(), &chars, Left, Right));
}

template <bool Start>
Value str_affix(const Value& self, const CallArgs& args) {
  const char* name = Start ? "startswith" : "endswith";
  Arguments a(args, name, {"prefix", "start", "end"}, 1);
  std::vector<std::string> candidates;
  if (a.get(0).is_list()) {
    for (const Value& v : a.get(0).list_ref().items) candidates.push_back(arg_string(v, name));
  } else {
    candidates.push_back(arg_string(a.get(0), name, "first argument"));
  }
  const std::string s = a.has(1) ? unicode::encode(substring(unicode::decode(self.str()), a, 1)) : self.str();
  for (const std::string& c : candidates) {
    if (c.size() > s.size()) continue;
    if (Start ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0) return Value(true);
  }
  return Value(false);
}

Value str_split(const Value& self, const CallArgs& args) {
  Arguments a(args, "split", {"sep", "maxsplit"});
  std::vector<Value> parts;
  for (auto& p : python_split(self.str(), a.get(0), a.has(1) ? a.get(1).as_int() : -1)) parts.emplace_back(std::move(p));
  return Value::list(std::move(parts));
}

Value str_rsplit(const Value& self, const CallArgs& args) {
  Arguments a(args, "rsplit", {"sep", "maxsplit"});
  const int64_t maxsplit = a.has(1) ? a.get(1).as_int() : -1;
  if (maxsplit < 0) return str_split(self, args);
  // Split the reversed text and reverse back: rsplit's maxsplit counts from the right.
  std::u32string rev = unicode::decode(self.str());
  std::reverse(rev.begin(), rev.end());
  Value sep = a.get(0);
  if (sep.is_string()) {
    std::u32string s = unicode::decode(sep.str());
    std::reverse(s.begin(), s.end());
    sep = Value(unicode::encode(s));
  }
  std::vector<Value> parts;
  for (auto& p : python_split(unicode::encode(rev), sep, maxsplit)) {
    std::u32string cp = unicode::decode(p);
    std::reverse(cp.begin(), cp.end());
    parts.emplace_back(unicode::encode(cp));
  }
  std::reverse(parts.begin(), parts.end());
  return Value::list(std::move(parts));
}

Value str_splitlines(const Value& self, const CallArgs& args) {
  Arguments a(args, "splitlines", {"keepends"});
  std::vector<Value> lines;
  for (auto& l : unicode::splitlines(self.str(), a.get(0).truthy())) lines.emplace_back(std::move(l));
  return Value::list(std::move(lines));
}

Value str_replace(const Value& self, const CallArgs& args) {
  Arguments a(args, "replace", {"old", "new", "count"}, 2);
  const std::string old = arg_string(a.get(0), "replace"), repl = arg_string(a.get(1), "replace");
  int64_t count = a.has(2) ? a.get(2).as_int() : -1;
  const std::string& s = self.str();
  std::string out;
  if (old.empty()) {  // Python inserts `new` around every character
    const std::u32string cps = unicode::decode(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count != 0) {
        out += repl;
        --count;
      }
      if (i < cps.size()) unicode::append(out, cps[i]);
      check_size(out.size());
    }
    return Value(std::move(out));
  }
  size_t pos = 0;
  while (count != 0) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += repl;
    check_size(out.size());
    pos = hit + old.size();
    --count;
  }
  out.append(s, pos, std::string::npos);
  return Value(std::move(out));
}

template <bool Reverse, bool Raise>
Value str_find(const Value& self, const CallArgs& args) {
  Arguments a(args, "find", {"sub", "start", "end"}, 1);
  const std::u32string s = unicode::decode(self.str());
  const std::u32string sub = unicode::decode(arg_string(a.get(0), "find"));
  const std::u32string part = substring(s, a, 1);
  const size_t hit = Reverse ? part.rfind(sub) : part.find(sub);
  if (hit == std::u32string::npos) {
    if (Raise) throw TemplateError("substring not found");
    return Value(-1);
  }
  // Offset of `part` inside `s`: the clamped start.
  int64_t start = a.has(1) && !a.get(1).is_none() ? a.get(1).as_int() : 0;
  if (start < 0) start = std::max<int64_t>(0, start + (int64_t)s.size());
  return Value((int64_t)hit + std::min<int64_t>(start, (int64_t)s.size()));
}

Value str_count(const Value& self, const CallArgs& args) {
  Arguments a(args, "count", {"sub", "start", "end"}, 1);
  const std::u32string part = substring(unicode::decode(self.str()), a, 1);
  const std::u32string sub = unicode::decode(arg_string(a.get(0), "count"));
  if (sub.empty()) return Value((int64_t)part.size() + 1);
  int64_t n = 0;
  for (size_t p = part.find(sub); p != std::u32string::npos; p = part.find(sub, p + sub.size())) ++n;
  return Value(n);
}

Value str_join(const Value& self, const CallArgs& args) {
  Arguments a(args, "join", {"iterable"}, 1);
  std::string out;
  size_t i = 0;
  for (const Value& v : iterate(a.get(0))) {
    if (!v.is_string())
      throw TemplateError("sequence item " + std::to_string(i) + ": expected str instance, " + v.type_name() + " found");
    if (i++) out += self.str();
    out += v.str();
    check_size(out.size());
  }
  return Value(std::move(out));
}

Value str_format_method(const Value& self, const CallArgs& args) { return Value(str_format(self.str(), args)); }

template <bool (*Pred)(char32_t)>
Value str_is(const Value& self, const CallArgs&) {
  const std::u32string s = unicode::decode(self.str());
  if (s.empty()) return Value(false);
  for (char32_t c : s)
    if (!Pred(c)) return Value(false);
  return Value(true);
}
bool is_alnum(char32_t c) { return unicode::is_alpha(c) || unicode::is_digit(c); }

template <bool Upper>
Value str_is_case(const Value& self, const CallArgs&) {
  bool cased = false;
  for (char32_t c : unicode::decode(self.str())) {
    if (Upper ? unicode::is_cased_lower(c) : unicode::is_cased_upper(c)) return Value(false);
    cased |= Upper ? unicode::is_cased_upper(c) : unicode::is_cased_lower(c);
  }
  return Value(cased);
}

Value str_istitle(const Value& self, const CallArgs&) {
  bool cased = false, previous_cased = false;
  for (char32_t c : unicode::decode(self.str())) {
    if (unicode::is_cased_upper(c)) {
      if (previous_cased) return Value(false);
      previous_cased = cased = true;
    } else if (unicode::is_cased_lower(c)) {
      if (!previous_cased) return Value(false);
      previous_cased = cased = true;
    } else {
      previous_cased = false;
    }
  }
  return Value(cased);
}

// center, ljust, rjust: 0 = center, 1 = ljust, 2 = rjust.
template <int Align>
Value str_justify(const Value& self, const CallArgs& args) {
  Arguments a(args, "center", {"width", "fillchar"}, 1);
  const int64_t width = a.get(0).as_int();
  const std::string fill = a.has(1) ? arg_string(a.get(1), "center") : " ";
  if (unicode::length(fill) != 1) throw TemplateError("the fill character must be exactly one character long");
  const int64_t len = (int64_t)unicode::length(self.str());
  if (width <= len) return self;
  check_size((size_t)width * fill.size());
  const int64_t pad = width - len;
  // CPython's centering puts the odd extra space on the left when the width is odd.
  const int64_t left = Align == 0 ? pad / 2 + (pad & width & 1) : Align == 1 ? 0 : pad;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += self.str();
  for (int64_t i = 0; i < pad - left; ++i) out += fill;
  return Value(std::move(out));
}

Value str_zfill(const Value& self, const CallArgs& args) {
  Arguments a(args, "zfill", {"width"}, 1);
  const std::string& s = self.str();
  const int64_t len = (int64_t)unicode::length(s), width = a.get(0).as_int();
  if (width <= len) return self;
  check_size((size_t)width);
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  return Value((sign ? s.substr(0, 1) : "") + std::string((size_t)(width - len), '0') + s.substr(sign ? 1 : 0));
}

template <bool Reverse>
Value str_partition(const Value& self, const CallArgs& args) {
  Arguments a(args, "partition", {"sep"}, 1);
  const std::string sep = arg_string(a.get(0), "partition");
  if (sep.empty()) throw TemplateError("empty separator");
  const std::string& s = self.str();
  const size_t hit = Reverse ? s.rfind(sep) : s.find(sep);
  if (hit == std::string::npos)
    return Reverse ? Value::tuple({Value(""), Value(""), self}) : Value::tuple({self, Value(""), Value("")});
  return Value::tuple({Value(s.substr(0, hit)), Value(sep), Value(s.substr(hit + sep.size()))});
}

template <bool Prefix>
Value str_remove_affix(const Value& self, const CallArgs& args) {
  Arguments a(args, Prefix ? "removeprefix" : "removesuffix", {"affix"}, 1);
  const std::string affix = arg_string(a.get(0), "removeprefix");
  const std::string& s = self.str();
  if (affix.size() > s.size()) return self;
  if (Prefix && s.compare(0, affix.size(), affix) == 0) return Value(s.substr(affix.size()));
  if (!Prefix && s.compare(s.size() - affix.size(), affix.size(), affix) == 0)
    return Value(s.substr(0, s.size() - affix.size()));
  return self;
}

// ---- list ----

Value list_append(const Value& self, const CallArgs& args) {
  Arguments a(args, "append", {"object"}, 1);
  check_items(self.list_ref().items.size() + 1);
  refuse_cycle(a.get(0), self.list_ptr().get());
  self.list_ref().items.push_back(a.get(0));
  return Value::none();
}

Value list_extend(const Value& self, const CallArgs& args) {
  Arguments a(args, "extend", {"iterable"}, 1);
  auto items = iterate(a.get(0));
  check_items(self.list_ref().items.size() + items.size());
  for (const Value& item : items) refuse_cycle(item, self.list_ptr().get());
  self.list_ref().items.insert(self.list_ref().items.end(), items.begin(), items.end());
  return Value::none();
}

Value list_insert(const Value& self, const CallArgs& args) {
  Arguments a(args, "insert", {"index", "object"}, 2);
  auto& items = self.list_ref().items;
  int64_t i = a.get(0).as_int();
  const int64_t n = (int64_t)items.size();
  if (i < 0) i = std::max<int64_t>(0, i + n);
  check_items(items.size() + 1);
  refuse_cycle(a.get(1), self.list_ptr().get());
  items.insert(items.begin() + std::min(i, n), a.get(1));
  return Value::none();
}

Value list_pop(const Value& self, const CallArgs& args) {
  Arguments a(args, "pop", {"index"});
  auto& items = self.list_ref().items;
  if (items.empty()) throw TemplateError("pop from empty list");
  int64_t i = a.has(0) ? a.get(0).as_int() : -1;
  if (i < 0) i += (int64_t)items.size();
  if (i < 0 || i >= (int64_t)items.size()) throw TemplateError("pop index out of range");
  Value v = items[(size_t)i];
  items.erase(items.begin() + i);
  return v;
}

Value list_remove(const Value& self, const CallArgs& args) {
  Arguments a(args, "remove", {"value"}, 1);
  auto& items = self.list_ref().items;
  for (auto it = items.begin(); it != items.end(); ++it) {
    if (equals(*it, a.get(0))) {
      items.erase(it);
      return Value::none();
    }
  }
  throw TemplateError("list.remove(x): x not in list");
}

Value list_index(const Value& self, const CallArgs& args) {
  Arguments a(args, "index", {"value"}, 1);
  const auto& items = self.list_ref().items;
  for (size_t i = 0; i < items.size(); ++i)
    if (equals(items[i], a.get(0))) return Value((int64_t)i);
  throw TemplateError(a.get(0).repr() + " is not in list");
}

Value list_count(const Value& self, const CallArgs& args) {
  Arguments a(args, "count", {"value"}, 1);
  int64_t n = 0;
  for (const Value& v : self.list_ref().items) n += equals(v, a.get(0));
  return Value(n);
}

Value list_copy(const Value& self, const CallArgs&) { return Value::list(self.list_ref().items); }

// ---- dict ----

Value dict_items(const Value& self, const CallArgs&) {
  std::vector<Value> items;
  for (const auto& [k, v] : self.dict_ref().entries) items.push_back(Value::tuple({k, v}));
  return Value::list(std::move(items));
}

Value dict_keys(const Value& self, const CallArgs&) {
  std::vector<Value> keys;
  for (const auto& entry : self.dict_ref().entries) keys.push_back(entry.first);
  return Value::list(std::move(keys));
}

Value dict_values(const Value& self, const CallArgs&) {
  std::vector<Value> values;
  for (const auto& entry : self.dict_ref().entries) values.push_back(entry.second);
  return Value::list(std::move(values));
}

Value dict_get(const Value& self, const CallArgs& args) {
  Arguments a(args, "get", {"key", "default"}, 1);
  if (const Value* v = self.dict_ref().find(a.get(0))) return *v;
  return a.has(1) ? a.get(1) : Value::none();
}

Value dict_copy(const Value& self, const CallArgs&) {
  auto d = std::make_shared<Dict>();
  d->entries = self.dict_ref().entries;
  return Value(std::move(d));
}

using MethodTable = std::unordered_map<std::string_view, Method>;

const MethodTable& string_methods() {
  static const MethodTable table = {
      {"upper", str_upper}, {"lower", str_lower}, {"casefold", str_lower}, {"title", str_title},
      {"capitalize", str_capitalize}, {"strip", str_strip<true, true>}, {"lstrip", str_strip<true, false>},
      {"rstrip", str_strip<false, true>}, {"startswith", str_affix<true>}, {"endswith", str_affix<false>},
      {"split", str_split}, {"rsplit", str_rsplit}, {"splitlines", str_splitlines}, {"replace", str_replace},
      {"find", str_find<false, false>}, {"rfind", str_find<true, false>}, {"index", str_find<false, true>},
      {"rindex", str_find<true, true>}, {"count", str_count}, {"join", str_join}, {"format", str_format_method},
      {"isdigit", str_is<unicode::is_digit>}, {"isnumeric", str_is<unicode::is_digit>},
      {"isdecimal", str_is<unicode::is_digit>}, {"isalpha", str_is<unicode::is_alpha>}, {"isalnum", str_is<is_alnum>},
      {"isspace", str_is<unicode::is_space>}, {"isupper", str_is_case<true>}, {"islower", str_is_case<false>},
      {"istitle", str_istitle},
      {"center", str_justify<0>}, {"ljust", str_justify<1>}, {"rjust", str_justify<2>}, {"zfill", str_zfill},
      {"partition", str_partition<false>}, {"rpartition", str_partition<true>},
      {"removeprefix", str_remove_affix<true>}, {"removesuffix", str_remove_affix<false>},
  };
  return table;
}

const MethodTable& list_methods() {
  static const MethodTable table = {
      {"append", list_append}, {"extend", list_extend}, {"insert", list_insert}, {"pop", list_pop},
      {"remove", list_remove}, {"index", list_index}, {"count", list_count}, {"copy", list_copy},
  };
  return table;
}

const MethodTable& tuple_methods() {
  static const MethodTable table = {{"index", list_index}, {"count", list_count}};
  return table;
}

const MethodTable& dict_methods() {
  static const MethodTable table = {
      {"items", dict_items}, {"keys", dict_keys}, {"values", dict_values}, {"get", dict_get}, {"copy", dict_copy},
  };
  return table;
}

}  // namespace

Value bound_method(const Value& object, const std::string& name) {
  const MethodTable* table = object.is_string()  ? &string_methods()
                             : object.is_tuple() ? &tuple_methods()
                             : object.is_list()  ? &list_methods()
                             : object.is_mapping() ? &dict_methods()
                                                   : nullptr;
  if (!table) return Value();
  const auto it = table->find(name);
  if (it == table->end()) return Value();
  const Method method = it->second;
  return make_function(name, [object, method](const CallArgs& args) { return method(object, args); });
}

std::vector<std::string> python_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; leading and trailing whitespace give no empty parts.
    const std::u32string cps = unicode::decode(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && unicode::is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && (int64_t)parts.size() == maxsplit) {
        parts.push_back(unicode::encode(std::u32string_view(cps).substr(i)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !unicode::is_space(cps[j])) ++j;
      parts.push_back(unicode::encode(std::u32string_view(cps).substr(i, j - i)));
      i = j;
    }
    return parts;
  }
  if (!sep.is_string()) throw TemplateError(std::string("must be str or None, not ") + sep.type_name());
  const std::string& d = sep.str();
  if (d.empty()) throw TemplateError("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || (int64_t)parts.size() < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    parts.push_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  parts.push_back(s.substr(pos));
  return parts;
}

std::string python_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : unicode::decode(s)) {
    const bool cased = unicode::is_cased_upper(c) || unicode::is_cased_lower(c);
    if (cased) {
      if (previous_cased) {
        unicode::append(out, unicode::to_lower(c));
      } else if (c == 0xDF) {
        out += "Ss";
      } else {
        unicode::append(out, unicode::to_upper(c));
      }
    } else {
      unicode::append(out, c);
    }
    previous_cased = cased;
  }
  return out;
}

std::string python_capitalize(const std::string& s) {
  const std::u32string cps = unicode::decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0 && cps[0] == 0xDF) out += "Ss";
    else unicode::append(out, i == 0 ? unicode::to_upper(cps[i]) : unicode::to_lower(cps[i]));
  }
  return out;
}

}  // namespace kiln::jinja
