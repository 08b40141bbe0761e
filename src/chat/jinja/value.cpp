#include "chat/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja/unicode.h"

namespace kiln::jinja {

Value::Value(ListPtr l) : kind_(Kind::list), data_(std::move(l)) {}
Value::Value(DictPtr d) : kind_(Kind::dict), data_(std::move(d)) {}
Value::Value(FunctionPtr f) : kind_(Kind::function), data_(std::move(f)) {}

Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  return Value(std::move(l));
}

Value Value::tuple(std::vector<Value> items) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->is_tuple = true;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<Dict>()); }

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= (uint64_t)INT64_MAX ? Value((int64_t)u) : Value((double)u);
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [k, v] : j.items()) d->entries.emplace_back(Value(k), from_json(v));
      return Value(std::move(d));
    }
    default: return none();  // binary / discarded: nothing a template could use
  }
}

bool Value::is_tuple() const { return is_list() && list_ref().is_tuple; }
bool Value::is_mapping() const { return is_dict() && dict_ref().kind == Dict::Kind::mapping; }

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  if (!is_int()) throw TemplateError(std::string("an integer is required, not '") + type_name() + "'");
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  if (!is_int() && !is_bool()) throw TemplateError(std::string("a number is required, not '") + type_name() + "'");
  return (double)as_int();
}

const std::string& Value::str() const {
  if (!is_string()) throw TemplateError(std::string("a string is required, not '") + type_name() + "'");
  return std::get<std::string>(data_);
}

const std::string& Value::undefined_reason() const { return std::get<std::string>(data_); }

void Value::require_defined() const {
  if (is_undefined()) throw TemplateError(undefined_reason().empty() ? "value is undefined" : undefined_reason());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return as_bool();
    case Kind::integer: return as_int() != 0;
    case Kind::floating: return as_double() != 0.0;
    case Kind::string: return !str().empty();
    case Kind::list: return !list_ref().items.empty();
    case Kind::dict: return dict_ref().kind != Dict::Kind::mapping || !dict_ref().entries.empty();
    case Kind::function: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return is_tuple() ? "tuple" : "list";
    case Kind::dict:
      return dict_ref().kind == Dict::Kind::mapping ? "dict"
             : dict_ref().kind == Dict::Kind::namespace_object ? "Namespace" : "LoopContext";
    case Kind::function: return function().is_macro ? "Macro" : "function";
  }
  return "object";
}

namespace {

// A list can contain itself (l.append(l)); printing or comparing it must fail, not recurse
// until the stack overflows.
constexpr int kMaxNesting = 200;

void check_nesting(int depth) {
  if (depth > kMaxNesting) throw TemplateError("value nested too deeply (does a list contain itself?)");
}

std::string repr_at(const Value& v, int depth);

std::string dict_repr(const Dict& d, int depth) {
  check_nesting(depth);
  std::string out = "{";
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (i) out += ", ";
    out += repr_at(d.entries[i].first, depth + 1) + ": " + repr_at(d.entries[i].second, depth + 1);
  }
  return out + "}";
}

std::string repr_at(const Value& v, int depth) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.as_bool() ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.as_int());
    case Value::Kind::floating: return float_repr(v.as_double());
    case Value::Kind::string: return string_repr(v.str());
    case Value::Kind::list: {
      check_nesting(depth);
      const List& l = v.list_ref();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += repr_at(l.items[i], depth + 1);
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      return out + (l.is_tuple ? ")" : "]");
    }
    case Value::Kind::dict:
      if (v.dict_ref().kind == Dict::Kind::namespace_object) return "<Namespace " + dict_repr(v.dict_ref(), depth) + ">";
      if (v.dict_ref().kind == Dict::Kind::loop_object) return "<LoopContext>";
      return dict_repr(v.dict_ref(), depth);
    case Value::Kind::function:
      return v.function().is_macro ? "<Macro '" + v.function().name + "'>" : "<function " + v.function().name + ">";
  }
  return "";
}

bool equals_at(const Value& a, const Value& b, int depth);
bool less_than_at(const Value& a, const Value& b, int depth);

}  // namespace

std::string Value::to_string() const { return is_undefined() ? "" : is_string() ? str() : repr_at(*this, 0); }

std::string Value::repr() const { return repr_at(*this, 0); }

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Arguments::Arguments(const CallArgs& args, std::string_view function, std::vector<std::string_view> params,
                     size_t required) {
  bound_.assign(params.size(), nullptr);
  if (args.positional.size() > params.size())
    throw TemplateError(std::string(function) + "() takes at most " + std::to_string(params.size()) +
                        " arguments (" + std::to_string(args.positional.size()) + " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < params.size() && params[i] != name) ++i;
    if (i == params.size())
      throw TemplateError(std::string(function) + "() got an unexpected keyword argument '" + name + "'");
    if (bound_[i]) throw TemplateError(std::string(function) + "() got multiple values for argument '" + name + "'");
    bound_[i] = &value;
  }
  for (size_t i = 0; i < required; ++i)
    if (!bound_[i])
      throw TemplateError(std::string(function) + "() missing required argument '" + std::string(params[i]) + "'");
}

const Value& Arguments::get(size_t i) const {
  static const Value undefined;
  return has(i) ? *bound_[i] : undefined;
}

Value make_function(std::string name, std::function<Value(const CallArgs&)> call) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(call);
  return Value(std::move(f));
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  if (a.is_list() || a.is_dict()) check_nesting(depth);
  switch (a.kind()) {
    case K::undefined:
    case K::none: return true;
    case K::string: return a.str() == b.str();
    case K::list: {
      const List &x = a.list_ref(), &y = b.list_ref();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals_at(x.items[i], y.items[i], depth + 1)) return false;
      return true;
    }
    case K::dict: {
      const Dict &x = a.dict_ref(), &y = b.dict_ref();
      if (x.kind != Dict::Kind::mapping || y.kind != Dict::Kind::mapping) return &x == &y;
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (!other || !equals_at(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case K::function: return a.function_ptr() == b.function_ptr();
    default: return false;
  }
}

bool less_than_at(const Value& a, const Value& b, int depth) {
  a.require_defined();
  b.require_defined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    check_nesting(depth);
    const auto &x = a.list_ref().items, &y = b.list_ref().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals_at(x[i], y[i], depth + 1)) return less_than_at(x[i], y[i], depth + 1);
    return x.size() < y.size();
  }
  throw TemplateError(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool less_than(const Value& a, const Value& b) { return less_than_at(a, b, 0); }

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::undefined: return false;  // Undefined iterates as empty
    case Value::Kind::string:
      if (!item.is_string())
        throw TemplateError(std::string("'in <string>' requires string as left operand, not ") + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::list:
      for (const Value& v : container.list_ref().items)
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::dict:
      if (container.dict_ref().kind != Dict::Kind::mapping) break;
      return container.dict_ref().find(item) != nullptr;
    default: break;
  }
  throw TemplateError(std::string("argument of type '") + container.type_name() + "' is not iterable");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return v.list_ref().items;
    case Value::Kind::string: {
      std::vector<Value> chars;
      std::string ch;
      for (char32_t cp : unicode::decode(v.str())) {
        ch.clear();
        unicode::append(ch, cp);
        chars.emplace_back(ch);
      }
      return chars;
    }
    case Value::Kind::dict: {
      if (v.dict_ref().kind != Dict::Kind::mapping) break;
      std::vector<Value> keys;
      for (const auto& entry : v.dict_ref().entries) keys.push_back(entry.first);
      return keys;
    }
    default: break;
  }
  throw TemplateError(std::string("'") + v.type_name() + "' object is not iterable");
}

namespace {

bool holds(const Value& v, const void* container, int depth) {
  check_nesting(depth);
  if (v.is_list()) {
    if (v.list_ptr().get() == container) return true;
    for (const Value& item : v.list_ref().items)
      if ((item.is_list() || item.is_dict()) && holds(item, container, depth + 1)) return true;
  } else if (v.is_dict()) {
    if (v.dict_ptr().get() == container) return true;
    for (const auto& entry : v.dict_ref().entries)
      if ((entry.second.is_list() || entry.second.is_dict()) && holds(entry.second, container, depth + 1)) return true;
  }
  return false;
}

}  // namespace

void refuse_cycle(const Value& value, const void* container) {
  if (holds(value, container, 0)) throw TemplateError("a list or namespace cannot contain itself");
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional for exponents -4..15,
  // scientific ("1e+16", "1.5e-07") outside.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if ((size_t)exponent + 1 >= digits.size()) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  return sign + out + exp;
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : unicode::decode(s)) {
    char buf[16];
    if (cp == (char32_t)quote || cp == '\\') {
      out += '\\';
      out += (char)cp;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD) {
      std::snprintf(buf, sizeof buf, "\\x%02x", (unsigned)cp);
      out += buf;
    } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0xD800 && cp <= 0xDFFF)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
      out += buf;
    } else {
      unicode::append(out, cp);
    }
  }
  out += quote;
  return out;
}

}  // namespace kiln::jinja
