// Jinja2's built-in filters (filters.py, version 3.1), with Hugging Face's tojson. Each
// takes the value left of the `|` and the call's arguments, bound like the Python
// signature it mirrors.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <unordered_map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/unicode.h"

namespace kiln::jinja {
namespace {

Value ignore_case(const Value& v) { return v.is_string() ? Value(unicode::lower(v.str())) : v; }

// Jinja2's make_attrgetter: "a.b.0" reads item by item (then attribute); `default`
// replaces an undefined result.
Value read_path(const Value& item, const Value& attribute, const Value* fallback = nullptr) {
  Value v = attribute_path(item, attribute);
  if (fallback && v.is_undefined() && !fallback->is_undefined()) return *fallback;
  return v;
}

// A sort key: one attribute, several separated by commas (compared as a tuple), or the item.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  auto post = [&](Value v) { return case_sensitive ? v : ignore_case(v); };
  if (attribute.is_undefined() || attribute.is_none()) return post(item);
  if (attribute.is_string() && attribute.str().find(',') != std::string::npos) {
    std::vector<Value> parts;
    for (const std::string& p : python_split(attribute.str(), Value(","), -1)) parts.push_back(post(read_path(item, Value(p))));
    return Value::tuple(std::move(parts));
  }
  return post(read_path(item, attribute));
}

Value f_abs(const Value& v, const CallArgs& args) {
  Arguments(args, "abs", {});
  v.require_defined();
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) throw TemplateError("integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  throw TemplateError(std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

Value f_attr(const Value& v, const CallArgs& args) {
  Arguments a(args, "attr", {"name"}, 1);
  if (!a.get(0).is_string()) throw TemplateError("attribute name must be a string");
  if (v.is_mapping()) return bound_method(v, a.get(0).str());  // a dict's keys are not attributes
  return get_attr(v, a.get(0).str());
}

Value f_batch(const Value& v, const CallArgs& args) {
  Arguments a(args, "batch", {"linecount", "fill_with"}, 1);
  const int64_t n = a.get(0).as_int();
  if (n <= 0) throw TemplateError("batch: linecount must be positive");
  std::vector<Value> rows, row;
  for (const Value& item : iterate(v)) {
    if ((int64_t)row.size() == n) rows.push_back(Value::list(std::exchange(row, {})));
    row.push_back(item);
  }
  if (!row.empty()) {
    if (a.has(1) && !a.get(1).is_none())
      while ((int64_t)row.size() < n) row.push_back(a.get(1));
    rows.push_back(Value::list(std::move(row)));
  }
  return Value::list(std::move(rows));
}

Value f_capitalize(const Value& v, const CallArgs& args) {
  Arguments(args, "capitalize", {});
  return Value(python_capitalize(v.to_string()));
}

Value f_center(const Value& v, const CallArgs& args) {
  Arguments a(args, "center", {"width"});
  CallArgs width;
  width.positional.push_back(a.get_or(0, Value(80)));
  return bound_method(Value(v.to_string()), "center").function().call(width);
}

Value f_default(const Value& v, const CallArgs& args) {
  Arguments a(args, "default", {"default_value", "boolean"});
  if (v.is_undefined() || (a.get(1).truthy() && !v.truthy())) return a.get_or(0, Value(""));
  return v;
}

Value f_dictsort(const Value& v, const CallArgs& args) {
  Arguments a(args, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_mapping()) throw TemplateError("dictsort: can only sort a mapping");
  const std::string by = a.has(1) ? a.get(1).to_string() : "key";
  if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  const bool cs = a.get(0).truthy(), reverse = a.get(2).truthy();
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_ref().entries) items.push_back(Value::tuple({k, val}));
  auto key = [&](const Value& item) { return cs ? item.list_ref().items[pos] : ignore_case(item.list_ref().items[pos]); };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y)); });
  return Value::list(std::move(items));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value f_escape(const Value& v, const CallArgs& args) {
  Arguments(args, "escape", {});
  return Value(html_escape(v.to_string()));
}

Value f_first(const Value& v, const CallArgs& args) {
  Arguments(args, "first", {});
  auto items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, const CallArgs& args) {
  Arguments(args, "last", {});
  auto items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python's float() of a string: optional whitespace and sign, digits, inf/nan.
bool parse_float(const std::string& text, double& out) {
  std::string s = unicode::strip(text, nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return false;
  const std::string lower = unicode::lower(s);
  const std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : (lower[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

Value f_float(const Value& v, const CallArgs& args) {
  Arguments a(args, "float", {"default"});
  const Value fallback = a.get_or(0, Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.str(), d)) return Value(d);
  v.require_defined();
  return fallback;
}

Value f_int(const Value& v, const CallArgs& args) {
  Arguments a(args, "int", {"default", "base"});
  const Value fallback = a.get_or(0, Value(0));
  const int base = a.has(1) ? (int)a.get(1).as_int() : 10;
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = std::trunc(v.as_double());
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value((int64_t)d);
  }
  if (v.is_string()) {
    std::string s = unicode::strip(v.str(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      errno = 0;
      char* end = nullptr;
      const long long n = std::strtoll(s.c_str(), &end, base);
      if (end == s.c_str() + s.size() && errno == 0 && (base != 10 || s.find_first_of("xX") == std::string::npos))
        return Value((int64_t)n);
    }
    double d;  // "42.23"|int is 42, as Jinja2 falls back to int(float(value))
    if (parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value((int64_t)std::trunc(d));
    return fallback;
  }
  v.require_defined();
  return fallback;
}

Value f_format(const Value& v, const CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty())
    throw TemplateError("can't handle positional and keyword arguments at the same time");
  if (!args.keyword.empty()) {
    Value d = Value::dict();
    for (const auto& [k, val] : args.keyword) d.dict_ref().set(Value(k), val);
    return Value(percent_format(v.to_string(), d));
  }
  return Value(percent_format(v.to_string(), Value::tuple(args.positional)));
}

Value f_indent(const Value& v, const CallArgs& args) {
  Arguments a(args, "indent", {"width", "first", "blank"});
  const Value width = a.get_or(0, Value(4));
  const std::string indention = width.is_string() ? width.str() : std::string((size_t)std::max<int64_t>(0, width.as_int()), ' ');
  // Jinja2 appends a newline first so that splitlines() keeps a trailing empty line.
  const auto lines = unicode::splitlines(v.to_string() + "\n");
  std::string rv;
  if (a.get(2).truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : indention) + lines[i];
  }
  if (a.get(1).truthy()) rv = indention + rv;
  return Value(std::move(rv));
}

Value f_items(const Value& v, const CallArgs& args) {
  Arguments(args, "items", {});
  if (v.is_undefined()) return Value::list();
  if (!v.is_mapping()) throw TemplateError("Can only get item pairs from a mapping.");
  return bound_method(v, "items").function().call(args);
}

Value f_join(const Value& v, const CallArgs& args) {
  Arguments a(args, "join", {"d", "attribute"});
  const std::string sep = a.has(0) ? a.get(0).to_string() : "";
  std::string out;
  size_t i = 0;
  for (const Value& item : iterate(v)) {
    if (i++) out += sep;
    out += (a.has(1) && !a.get(1).is_none() ? read_path(item, a.get(1)) : item).to_string();
    check_size(out.size());
  }
  return Value(std::move(out));
}

Value f_length(const Value& v, const CallArgs& args) {
  Arguments(args, "length", {});
  switch (v.kind()) {
    case Value::Kind::undefined: return Value(0);
    case Value::Kind::string: return Value((int64_t)unicode::length(v.str()));
    case Value::Kind::list: return Value((int64_t)v.list_ref().items.size());
    case Value::Kind::dict:
      if (v.is_mapping()) return Value((int64_t)v.dict_ref().entries.size());
      break;
    default: break;
  }
  throw TemplateError(std::string("object of type '") + v.type_name() + "' has no len()");
}

Value f_list(const Value& v, const CallArgs& args) {
  Arguments(args, "list", {});
  return Value::list(iterate(v));
}

Value f_lower(const Value& v, const CallArgs& args) {
  Arguments(args, "lower", {});
  return Value(unicode::lower(v.to_string()));
}

Value f_upper(const Value& v, const CallArgs& args) {
  Arguments(args, "upper", {});
  return Value(unicode::upper(v.to_string()));
}

Value f_map(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (!v.truthy()) return Value::list();  // Jinja2 maps nothing over any falsy value, none included
  if (args.positional.empty()) {
    Arguments a(args, "map", {"attribute", "default"});
    if (!a.has(0)) throw TemplateError("map requires a filter argument");
    const Value fallback = a.get(1);
    for (const Value& item : iterate(v)) out.push_back(read_path(item, a.get(0), a.has(1) ? &fallback : nullptr));
    return Value::list(std::move(out));
  }
  if (!args.positional[0].is_string()) throw TemplateError("map: the filter name must be a string");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : iterate(v)) out.push_back(apply_filter(args.positional[0].str(), item, rest));
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr
template <bool Select, bool Attr>
Value f_select(const Value& v, const CallArgs& args) {
  const size_t off = Attr ? 1 : 0;
  if (!v.truthy()) return Value::list();  // as map: `none|selectattr(...)` is empty
  if (Attr && args.positional.empty()) throw TemplateError("Missing parameter for attribute name");
  const bool has_test = args.positional.size() > off;
  if (has_test && !args.positional[off].is_string()) throw TemplateError("the test name must be a string");
  CallArgs rest;
  if (has_test) rest.positional.assign(args.positional.begin() + off + 1, args.positional.end());
  rest.keyword = args.keyword;
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    const Value subject = Attr ? read_path(item, args.positional[0]) : item;
    const bool ok = has_test ? apply_test(args.positional[off].str(), subject, rest) : subject.truthy();
    if (ok == Select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

template <bool Max>
Value f_min_max(const Value& v, const CallArgs& args) {
  Arguments a(args, Max ? "max" : "min", {"case_sensitive", "attribute"});
  const auto items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], a.get(1), a.get(0).truthy());
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], a.get(1), a.get(0).truthy());
    if (Max ? less_than(best_key, k) : less_than(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_replace(const Value& v, const CallArgs& args) {
  Arguments a(args, "replace", {"old", "new", "count"}, 2);
  CallArgs call;
  call.positional = {Value(a.get(0).to_string()), Value(a.get(1).to_string())};
  if (a.has(2) && !a.get(2).is_none()) call.positional.push_back(a.get(2));
  return bound_method(Value(v.to_string()), "replace").function().call(call);
}

Value f_reverse(const Value& v, const CallArgs& args) {
  Arguments(args, "reverse", {});
  if (v.is_string()) {
    std::u32string cps = unicode::decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value(unicode::encode(cps));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python's round(x, n): the nearest decimal, ties to even on the exact binary value,
// which is what printf's correctly rounded %.*f gives.
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    if (digits > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", (int)digits, x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, (double)-digits);
  return std::nearbyint(x / scale) * scale;
}

Value f_round(const Value& v, const CallArgs& args) {
  Arguments a(args, "round", {"precision", "method"});
  const int64_t precision = a.has(0) ? a.get(0).as_int() : 0;
  const std::string method = a.has(1) ? a.get(1).to_string() : "common";
  if (method != "common" && method != "ceil" && method != "floor") throw TemplateError("method must be common, ceil or floor");
  v.require_defined();
  if (!v.is_number()) throw TemplateError(std::string("type ") + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {  // round(int, n) stays an int; negative n rounds to tens, ties to even
      if (precision >= 0) return Value(v.as_int());
      if (precision < -18) return Value(0);
      int64_t unit = 1;
      for (int64_t i = 0; i < -precision; ++i) unit *= 10;
      const int64_t x = v.as_int();
      int64_t q = x / unit, r = x % unit;
      if (r < 0) {
        r += unit;
        q -= 1;
      }
      if (2 * r > unit || (2 * r == unit && (q & 1))) ++q;
      return Value(q * unit);
    }
    return Value(python_round(v.as_double(), precision));
  }
  const double scale = std::pow(10.0, (double)precision);
  const double scaled = v.as_double() * scale;
  return Value((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Value f_safe(const Value& v, const CallArgs& args) {
  Arguments(args, "safe", {});
  return Value(v.to_string());
}

Value f_sort(const Value& v, const CallArgs& args) {
  Arguments a(args, "sort", {"reverse", "case_sensitive", "attribute"});
  auto items = iterate(v);
  const bool reverse = a.get(0).truthy(), cs = a.get(1).truthy();
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) keyed.emplace_back(sort_key(item, a.get(2), cs), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_string(const Value& v, const CallArgs& args) {
  Arguments(args, "string", {});
  return Value(v.to_string());
}

Value f_sum(const Value& v, const CallArgs& args) {
  Arguments a(args, "sum", {"attribute", "start"});
  Value total = a.get_or(1, Value(0));
  for (const Value& item : iterate(v))
    total = binary_op(BinaryExpr::Op::add, total, a.has(0) && !a.get(0).is_none() ? read_path(item, a.get(0)) : item);
  return total;
}

// Jinja2's title filter capitalizes after spaces, dashes and opening brackets only
// (unlike str.title, which does after any non-letter).
Value f_title(const Value& v, const CallArgs& args) {
  Arguments(args, "title", {});
  const std::u32string s = unicode::decode(v.to_string());
  auto is_boundary = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || unicode::is_space(c); };
  std::string out;
  bool word_start = true;
  for (char32_t c : s) {
    if (is_boundary(c)) {
      unicode::append(out, c);
      word_start = true;
    } else if (word_start) {
      if (c == 0xDF) out += "SS";
      else unicode::append(out, unicode::to_upper(c));
      word_start = false;
    } else {
      unicode::append(out, unicode::to_lower(c));
    }
  }
  return Value(std::move(out));
}

// Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Value f_tojson(const Value& v, const CallArgs& args) {
  Arguments a(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = a.get(0).truthy();
  const Value& indent = a.get(1);
  if (!indent.is_undefined() && !indent.is_none()) {
    o.has_indent = true;
    o.indent = indent.is_string() ? indent.str() : std::string((size_t)std::clamp<int64_t>(indent.as_int(), 0, 1000), ' ');
    o.item_separator = ",";
  }
  const Value& sep = a.get(2);
  if (!sep.is_undefined() && !sep.is_none()) {
    if (!sep.is_list() || sep.list_ref().items.size() != 2) throw TemplateError("tojson: separators must be a pair of strings");
    o.item_separator = sep.list_ref().items[0].to_string();
    o.key_separator = sep.list_ref().items[1].to_string();
  }
  o.sort_keys = a.get(3).truthy();
  return Value(to_json(v, o));
}

Value f_trim(const Value& v, const CallArgs& args) {
  Arguments a(args, "trim", {"chars"});
  if (!a.has(0) || a.get(0).is_none()) return Value(unicode::strip(v.to_string(), nullptr, true, true));
  const std::string chars = a.get(0).to_string();
  return Value(unicode::strip(v.to_string(), &chars, true, true));
}

Value f_truncate(const Value& v, const CallArgs& args) {
  Arguments a(args, "truncate", {"length", "killwords", "end", "leeway"});
  const int64_t length = a.has(0) ? a.get(0).as_int() : 255;
  const std::string end = a.has(2) ? a.get(2).to_string() : "...";
  const int64_t leeway = a.has(3) ? a.get(3).as_int() : 5;
  const std::u32string s = unicode::decode(v.to_string());
  const int64_t end_len = (int64_t)unicode::length(end);
  if (length < end_len) throw TemplateError("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if ((int64_t)s.size() <= length + leeway) return Value(unicode::encode(s));
  std::u32string head = s.substr(0, (size_t)(length - end_len));
  if (!a.get(1).truthy()) {
    const size_t space = head.rfind(U' ');
    if (space != std::u32string::npos) head.resize(space);
  }
  return Value(unicode::encode(head) + end);
}

Value f_unique(const Value& v, const CallArgs& args) {
  Arguments a(args, "unique", {"case_sensitive", "attribute"});
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    Value key = sort_key(item, a.get(1), a.get(0).truthy());
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(const Value& v, const CallArgs& args) {
  Arguments(args, "wordcount", {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : unicode::decode(v.to_string())) {
    const bool w = unicode::is_alpha(c) || unicode::is_digit(c) || c == '_';
    words += w && !in_word;
    in_word = w;
  }
  return Value(words);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"forceescape", f_escape}, {"first", f_first}, {"float", f_float}, {"format", f_format},
      {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
      {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_min_max<true>},
      {"min", f_min_max<false>}, {"reject", f_select<false, false>}, {"rejectattr", f_select<false, true>},
      {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
      {"select", f_select<true, false>}, {"selectattr", f_select<true, true>}, {"sort", f_sort},
      {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
      {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

Value attribute_path(const Value& object, const Value& path) {
  if (path.is_int()) return get_item(object, path);
  Value v = object;
  for (const std::string& part : python_split(path.to_string(), Value("."), -1)) {
    v = get_item(v, path_key(part));
  }
  return v;
}

FilterFn find_filter(std::string_view name) {
  const auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

Value apply_filter(std::string_view name, const Value& subject, const CallArgs& args) {
  const FilterFn f = find_filter(name);
  if (!f) throw TemplateError("no filter named '" + std::string(name) + "'");
  return f(subject, args);
}

}  // namespace kiln::jinja
