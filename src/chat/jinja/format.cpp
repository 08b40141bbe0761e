// Text formatting the way Python does it: "%s" % x, "{}".format(x) and json.dumps, which
// Hugging Face's tojson filter calls with ensure_ascii=False.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "chat/jinja/builtins.h"
#include "chat/jinja/unicode.h"

namespace kiln::jinja {
namespace {

// One more decimal digit of a width or precision, saturating: the limit checks after
// parsing refuse anything this large, and a long run of digits must not overflow first.
int64_t add_digit(int64_t v, char digit) {
  return std::min<int64_t>(std::max<int64_t>(v, 0) * 10 + (digit - '0'), int64_t(1) << 40);
}

// Pads `s` (counted in code points) to `width`: left-justified, right-justified, centered,
// or with the padding after a leading sign ('=').
std::string pad(const std::string& s, int64_t width, char align, const std::string& fill = " ") {
  const int64_t len = (int64_t)unicode::length(s);
  if (width <= len) return s;
  check_size((size_t)width * fill.size());
  const int64_t n = width - len;
  auto fills = [&](int64_t k) {
    std::string out;
    for (int64_t i = 0; i < k; ++i) out += fill;
    return out;
  };
  switch (align) {
    case '<': return s + fills(n);
    case '^': return fills(n / 2) + s + fills(n - n / 2);
    case '=':
      if (!s.empty() && (s[0] == '+' || s[0] == '-' || s[0] == ' ')) return s.substr(0, 1) + fills(n) + s.substr(1);
      return fills(n) + s;
    default: return fills(n) + s;
  }
}

std::string truncate_code_points(const std::string& s, int64_t n) {
  if (n < 0) return s;
  const std::u32string cps = unicode::decode(s);
  if ((int64_t)cps.size() <= n) return s;
  return unicode::encode(std::u32string_view(cps).substr(0, (size_t)n));
}

double number_arg(const Value& v, char conversion) {
  v.require_defined();
  if (!v.is_number())
    throw TemplateError(std::string("%") + conversion + " format: a real number is required, not " + v.type_name());
  return v.as_double();
}

int64_t integer_arg(const Value& v, char conversion) {
  v.require_defined();
  if (v.is_float()) {
    if (conversion == 'x' || conversion == 'X' || conversion == 'o')
      throw TemplateError(std::string("%") + conversion + " format: an integer is required, not float");
    const double d = std::trunc(v.as_double());
    // Python's ints are unbounded; ours are not, and converting past them is undefined.
    if (!std::isfinite(d) || std::fabs(d) >= 0x1p63)
      throw TemplateError(std::string("%") + conversion + " format: " + std::to_string(v.as_double()) +
                          " is too large for an integer");
    return (int64_t)d;
  }
  if (!v.is_int() && !v.is_bool())
    throw TemplateError(std::string("%") + conversion + " format: a real number is required, not " + v.type_name());
  return v.as_int();
}

std::string c_format(const std::string& spec, double d) {
  char buf[512];
  std::snprintf(buf, sizeof buf, spec.c_str(), d);
  return buf;
}

// One integer in base 10, 16 or 8 with Python's sign and alternate-form rules.
std::string format_integer(int64_t v, char type, bool alternate, char sign) {
  const bool negative = v < 0;
  const uint64_t mag = negative ? 0 - (uint64_t)v : (uint64_t)v;
  char buf[80];
  const char* prefix = "";
  if (type == 'x' || type == 'X') {
    std::snprintf(buf, sizeof buf, type == 'x' ? "%llx" : "%llX", (unsigned long long)mag);
    if (alternate) prefix = type == 'x' ? "0x" : "0X";
  } else if (type == 'o') {
    std::snprintf(buf, sizeof buf, "%llo", (unsigned long long)mag);
    if (alternate) prefix = "0o";
  } else if (type == 'b') {
    std::string bits;
    uint64_t m = mag;
    do {
      bits.insert(bits.begin(), char('0' + (m & 1)));
      m >>= 1;
    } while (m);
    std::snprintf(buf, sizeof buf, "%s", bits.c_str());
    if (alternate) prefix = "0b";
  } else {
    std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)mag);
  }
  const std::string sign_text = negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
  return sign_text + prefix + buf;
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = args.is_mapping() ? &args.dict_ref() : nullptr;
  if (args.is_tuple()) positional = args.list_ref().items;
  else positional.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw TemplateError("incomplete format");
    const Value* value = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw TemplateError("incomplete format key");
      if (!mapping) throw TemplateError("format requires a mapping");
      value = mapping->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!value) throw TemplateError("format key '" + fmt.substr(i + 1, close - i - 1) + "' not found");
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags += fmt[i++];
    auto take_arg = [&]() -> const Value& {
      if (next >= positional.size()) throw TemplateError("not enough arguments for format string");
      return positional[next++];
    };
    int64_t width = -1, precision = -1;
    if (i < fmt.size() && fmt[i] == '*') {
      width = take_arg().as_int();
      ++i;
    } else {
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') width = add_digit(width, fmt[i++]);
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        precision = take_arg().as_int();
        ++i;
      } else {
        while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') precision = add_digit(precision, fmt[i++]);
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw TemplateError("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (width > 100000 || precision > 100000) throw TemplateError("format width too large");
    const Value& v = value ? *value : take_arg();
    const bool left = flags.find('-') != std::string::npos;
    const bool zero = flags.find('0') != std::string::npos && !left;
    const char sign = flags.find('+') != std::string::npos ? '+' : flags.find(' ') != std::string::npos ? ' ' : 0;
    std::string field;
    switch (conv) {
      case 's': field = truncate_code_points(v.to_string(), precision); break;
      case 'r':
      case 'a': field = truncate_code_points(v.repr(), precision); break;
      case 'c':
        if (v.is_string() && unicode::length(v.str()) == 1) field = v.str();
        else unicode::append(field, (char32_t)integer_arg(v, 'c'));
        break;
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        std::string digits = format_integer(integer_arg(v, conv), conv == 'i' || conv == 'u' ? 'd' : conv,
                                            flags.find('#') != std::string::npos, sign);
        if (precision >= 0) {  // minimum number of digits
          const size_t start = digits.find_first_of("0123456789abcdefABCDEF", (digits[0] == '-' || digits[0] == '+' || digits[0] == ' ') ? 1 : 0);
          const int64_t have = (int64_t)(digits.size() - start);
          if (have < precision) digits.insert(start, (size_t)(precision - have), '0');
        }
        field = zero ? pad(digits, width, '=', "0") : digits;
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        std::string spec = "%" + flags + (width >= 0 ? std::to_string(width) : "") + "." +
                           std::to_string(precision >= 0 ? precision : 6) + conv;
        field = c_format(spec, number_arg(v, conv));
        break;
      }
      default: throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
    out += pad(field, width, left ? '<' : '>');
    check_size(out.size());
  }
  if (!used_mapping && !mapping && next < positional.size())
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

namespace {

// Applies a str.format spec ("<10", ">+8.2f", "^20", "08d", "x") to one value.
std::string format_field(const Value& v, const std::string& spec) {
  size_t i = 0;
  std::string fill = " ";
  char align = 0;
  const std::u32string cps = unicode::decode(spec);
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    fill.clear();
    unicode::append(fill, cps[0]);
    align = (char)cps[1];
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    align = (char)cps[0];
    i = 1;
  }
  const std::string rest = unicode::encode(std::u32string_view(cps).substr(i));
  size_t p = 0;
  char sign = 0;
  if (p < rest.size() && (rest[p] == '+' || rest[p] == '-' || rest[p] == ' ')) sign = rest[p++];
  const bool alternate = p < rest.size() && rest[p] == '#' && ++p;
  if (p < rest.size() && rest[p] == '0') {
    if (!align) {
      fill = "0";
      align = '=';
    }
    ++p;
  }
  int64_t width = -1, precision = -1;
  while (p < rest.size() && rest[p] >= '0' && rest[p] <= '9') width = add_digit(width, rest[p++]);
  char grouping = 0;
  if (p < rest.size() && (rest[p] == ',' || rest[p] == '_')) grouping = rest[p++];
  if (p < rest.size() && rest[p] == '.') {
    ++p;
    precision = 0;
    while (p < rest.size() && rest[p] >= '0' && rest[p] <= '9') precision = add_digit(precision, rest[p++]);
  }
  const char type = p < rest.size() ? rest[p++] : 0;
  if (p != rest.size() || width > 100000 || precision > 100000) throw TemplateError("invalid format specifier '" + spec + "'");

  std::string text;
  if (v.is_string() || (!v.is_number() && (type == 0 || type == 's'))) {
    if (type != 0 && type != 's') throw TemplateError(std::string("unknown format code '") + type + "' for object of type 'str'");
    text = truncate_code_points(v.to_string(), precision);
    return pad(text, width, align ? align : '<', fill);
  }
  v.require_defined();
  if (!v.is_number()) throw TemplateError(std::string("unsupported format string passed to ") + v.type_name() + ".__format__");
  const bool integral = (v.is_int() || v.is_bool()) && (type == 0 || std::string("dbnoxXc").find(type) != std::string::npos);
  if (integral) {
    if (type == 'c') {
      unicode::append(text, (char32_t)v.as_int());
    } else {
      text = format_integer(v.as_int(), type == 0 || type == 'n' ? 'd' : type, alternate, sign);
      if (grouping && (type == 0 || type == 'd' || type == 'n')) {
        const size_t digits_start = text.find_first_of("0123456789");
        std::string grouped;
        const std::string digits = text.substr(digits_start);
        for (size_t k = 0; k < digits.size(); ++k) {
          if (k && (digits.size() - k) % 3 == 0) grouped += grouping;
          grouped += digits[k];
        }
        text = text.substr(0, digits_start) + grouped;
      }
    }
  } else {
    const double d = v.as_double();
    if (type == 0 && precision < 0) {
      text = v.is_float() ? float_repr(d) : std::to_string(v.as_int());
      if (sign == '+' && d >= 0) text = "+" + text;
      else if (sign == ' ' && d >= 0) text = " " + text;
    } else {
      const char t = type == 0 ? 'g' : type == '%' ? 'f' : type;
      if (std::string("eEfFgG").find(t) == std::string::npos)
        throw TemplateError(std::string("unknown format code '") + type + "' for object of type '" + v.type_name() + "'");
      std::string c_spec = "%";
      if (sign == '+' || sign == ' ') c_spec += sign;
      if (alternate) c_spec += '#';
      c_spec += "." + std::to_string(precision >= 0 ? precision : 6) + t;
      text = c_format(c_spec, type == '%' ? d * 100 : d);
      if (type == '%') text += '%';
    }
  }
  return pad(text, width, align ? align : '>', fill);
}

Value lookup_field(const std::string& field, const CallArgs& args, size_t& auto_index) {
  size_t end = field.find_first_of(".[");
  const std::string head = field.substr(0, end);
  Value v;
  if (head.empty()) {
    if (auto_index >= args.positional.size()) throw TemplateError("Replacement index " + std::to_string(auto_index) + " out of range");
    v = args.positional[auto_index++];
  } else if (head.find_first_not_of("0123456789") == std::string::npos) {
    const size_t index = std::stoul(head);
    if (index >= args.positional.size()) throw TemplateError("Replacement index " + head + " out of range");
    v = args.positional[index];
  } else {
    bool found = false;
    for (const auto& [name, value] : args.keyword) {
      if (name == head) {
        v = value;
        found = true;
      }
    }
    if (!found) throw TemplateError("KeyError: '" + head + "'");
  }
  while (end != std::string::npos) {
    if (field[end] == '.') {
      const size_t next = field.find_first_of(".[", end + 1);
      v = get_attr(v, field.substr(end + 1, next - end - 1));
      end = next;
    } else {
      const size_t close = field.find(']', end);
      if (close == std::string::npos) throw TemplateError("Missing ']' in format string");
      const std::string key = field.substr(end + 1, close - end - 1);
        v = get_item(v, path_key(key));
      end = close + 1 < field.size() ? close + 1 : std::string::npos;
    }
  }
  return v;
}

}  // namespace

std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw TemplateError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw TemplateError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1), spec;
    char conversion = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    Value v = lookup_field(field, args, auto_index);
    if (conversion == 'r' || conversion == 'a') v = Value(v.repr());
    else if (conversion == 's') v = Value(v.to_string());
    out += format_field(v, spec);
    check_size(out.size());
    i = close;
  }
  return out;
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : unicode::decode(s)) {
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", (unsigned)c);
          out += buf;
        } else if (ensure_ascii && c > 0x7E) {
          if (c >= 0x10000) {  // a surrogate pair, as Python writes it
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", (unsigned)(0xD800 + (v >> 10)), (unsigned)(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", (unsigned)c);
          }
          out += buf;
        } else {
          unicode::append(out, c);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::string: return k.str();
    case Value::Kind::integer: return std::to_string(k.as_int());
    case Value::Kind::floating: return json_float(k.as_double());
    case Value::Kind::boolean: return k.as_bool() ? "true" : "false";
    case Value::Kind::none: return "null";
    default: throw TemplateError(std::string("keys must be str, int, float, bool or None, not ") + k.type_name());
  }
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  check_size(out.size());
  if (level > 200) throw TemplateError("tojson: nesting too deep");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: out += json_float(v.as_double()); return;
    case Value::Kind::string: json_string(out, v.str(), o.ensure_ascii); return;
    case Value::Kind::list: {
      const auto& items = v.list_ref().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        json_value(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      if (v.dict_ref().kind != Dict::Kind::mapping) break;
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.dict_ref().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return less_than(a->first, b->first); });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        json_string(out, json_key(entries[i]->first), o.ensure_ascii);
        out += o.key_separator;
        json_value(out, entries[i]->second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  throw TemplateError(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

}  // namespace kiln::jinja
