// Python's arithmetic on Jinja values: int stays int (with an overflow error instead of
// Python's big integers), / always gives a float, // and % round toward negative
// infinity, str and list concatenate and repeat.
#include <cmath>
#include <optional>

#include "chat/jinja/builtins.h"
#include "chat/jinja/unicode.h"

namespace kiln::jinja {
namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  throw TemplateError(std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

[[noreturn]] void overflow() { throw TemplateError("integer overflow"); }

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list_ref().items.size();
  if (unit != 0 && (uint64_t)n > kMaxResultSize / unit) throw TemplateError("result too large");
  if (seq.is_string()) {
    if (unit == 1) return Value(std::string((size_t)n, seq.str()[0]));
    std::string out;
    out.reserve((size_t)n * unit);
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  const auto& items = seq.list_ref().items;
  check_items((size_t)n * items.size());
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value(r);
  }
  if (a.is_string() && b.is_string()) {
    check_size(a.str().size() + b.str().size());
    return Value(a.str() + b.str());
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    check_items(a.list_ref().items.size() + b.list_ref().items.size());
    std::vector<Value> items = a.list_ref().items;
    items.insert(items.end(), b.list_ref().items.begin(), b.list_ref().items.end());
    return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (a.is_string() || a.is_list())
    throw TemplateError(std::string("can only concatenate ") + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                        a.type_name());
  unsupported("+", a, b);
}

Value multiply(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() * b.as_double());
    int64_t r;
    if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value(r);
  }
  if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
  if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  unsupported("*", a, b);
}

// Python's float divmod: the quotient rounded toward negative infinity, and a remainder
// with the sign of the divisor.
std::pair<double, double> float_divmod(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return {floordiv, mod};
}

Value arithmetic(BinaryExpr::Op op, const Value& a, const Value& b) {
  using Op = BinaryExpr::Op;
  static const char* const symbols[] = {"+", "-", "*", "/", "//", "%", "**"};
  if (!a.is_number() || !b.is_number()) unsupported(symbols[(int)op], a, b);
  const bool floats = a.is_float() || b.is_float();
  if (op == Op::sub) {
    if (floats) return Value(a.as_double() - b.as_double());
    int64_t r;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value(r);
  }
  if (op == Op::div) {
    if (b.as_double() == 0) throw TemplateError("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == Op::floordiv || op == Op::mod) {
    if (floats) {
      if (b.as_double() == 0) throw TemplateError(op == Op::mod ? "float modulo" : "float floor division by zero");
      const auto [q, r] = float_divmod(a.as_double(), b.as_double());
      return Value(op == Op::floordiv ? q : r);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    if (y == 0) throw TemplateError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) {
      if (op == Op::floordiv) overflow();
      return Value(int64_t(0));
    }
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      r += y;
      q -= 1;
    }
    return Value(op == Op::floordiv ? q : r);
  }
  // pow
  if (!floats && b.as_int() >= 0) {
    int64_t result = 1, base = a.as_int(), e = b.as_int();
    while (e > 0) {
      if (e & 1)
        if (__builtin_mul_overflow(result, base, &result)) overflow();
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return Value(result);
  }
  if (a.as_double() == 0 && b.as_double() < 0) throw TemplateError("0.0 cannot be raised to a negative power");
  return Value(std::pow(a.as_double(), b.as_double()));
}

// Python's slice.indices(): clamps start/stop for a sequence of length n.
void adjust_slice(int64_t n, const Value& start, const Value& stop, int64_t step, int64_t& b, int64_t& e) {
  auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool())
      throw TemplateError(std::string("slice indices must be integers or None, not ") + v.type_name());
    return v.as_int();
  };
  const auto s = index(start), t = index(stop);
  auto clamp = [&](int64_t i, int64_t lo, int64_t hi) {
    if (i < 0) i += n;
    if (i < lo) i = lo;
    if (i > hi) i = hi;
    return i;
  };
  if (step > 0) {
    b = s ? clamp(*s, 0, n) : 0;
    e = t ? clamp(*t, 0, n) : n;
  } else {
    b = s ? clamp(*s, -1, n - 1) : n - 1;
    e = t ? clamp(*t, -1, n - 1) : -1;
  }
}

std::string type_object(const Value& v) {
  if (v.is_none()) return "'None'";
  return std::string("'") + v.type_name() + " object'";
}

}  // namespace

void check_size(size_t n) {
  if (n > kMaxResultSize) throw TemplateError("result too large");
}

void check_items(size_t n) {
  if (n > kMaxItems) throw TemplateError("list too large");
}

Value binary_op(BinaryExpr::Op op, const Value& a, const Value& b) {
  using Op = BinaryExpr::Op;
  if (op == Op::concat) {
    std::string s = a.to_string();
    const std::string t = b.to_string();
    check_size(s.size() + t.size());
    return Value(s.append(t));
  }
  a.require_defined();
  b.require_defined();
  switch (op) {
    case Op::add: return add(a, b);
    case Op::mul: return multiply(a, b);
    case Op::mod:
      if (a.is_string()) return Value(percent_format(a.str(), b));
      return arithmetic(op, a, b);
    default: return arithmetic(op, a, b);
  }
}

Value unary_minus(const Value& v) {
  v.require_defined();
  if (v.is_float()) return Value(-v.as_double());
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) overflow();
    return Value(-v.as_int());
  }
  throw TemplateError(std::string("bad operand type for unary -: '") + v.type_name() + "'");
}

Value unary_plus(const Value& v) {
  v.require_defined();
  if (v.is_bool()) return Value(v.as_int());
  if (v.is_number()) return v;
  throw TemplateError(std::string("bad operand type for unary +: '") + v.type_name() + "'");
}

Value get_attr(const Value& object, const std::string& name) {
  object.require_defined();
  if (object.is_dict()) {
    const Dict& d = object.dict_ref();
    if (d.kind == Dict::Kind::mapping) {
      Value method = bound_method(object, name);
      if (!method.is_undefined()) return method;
    }
    if (const Value* v = d.find(std::string_view(name))) return *v;
  } else if (object.is_string() || object.is_list()) {
    Value method = bound_method(object, name);
    if (!method.is_undefined()) return method;
  }
  return Value::undefined(type_object(object) + " has no attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key) {
  object.require_defined();
  if (object.is_dict()) {
    if (const Value* v = object.dict_ref().find(key)) return *v;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (object.is_list()) {
      const auto& items = object.list_ref().items;
      if (i < 0) i += (int64_t)items.size();
      if (i >= 0 && i < (int64_t)items.size()) return items[(size_t)i];
    } else if (unicode::is_ascii(object.str())) {
      const std::string& s = object.str();
      if (i < 0) i += (int64_t)s.size();
      if (i >= 0 && i < (int64_t)s.size()) return Value(std::string(1, s[(size_t)i]));
    } else {
      const std::u32string cps = unicode::decode(object.str());
      if (i < 0) i += (int64_t)cps.size();
      if (i >= 0 && i < (int64_t)cps.size()) return Value(unicode::encode(cps.substr((size_t)i, 1)));
    }
  }
  if (key.is_string()) {
    Value attr = get_attr(object, key.str());
    if (!attr.is_undefined()) return attr;
    return Value::undefined(type_object(object) + " has no attribute '" + key.str() + "'");
  }
  return Value::undefined(type_object(object) + " has no element " + key.repr());
}

Value path_key(const std::string& part) {
  if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return Value(part);
  int64_t n = 0;
  for (char c : part) n = n > (INT64_MAX - (c - '0')) / 10 ? INT64_MAX : n * 10 + (c - '0');
  return Value(n);
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step_value) {
  object.require_defined();
  // Jinja2 compiles slices to Python's obj[a:b:c], bypassing its getitem: no Undefined here.
  if (object.is_mapping()) throw TemplateError("unhashable type: 'slice'");
  if (!object.is_list() && !object.is_string())
    throw TemplateError(std::string("'") + object.type_name() + "' object is not subscriptable");
  int64_t step = 1;
  if (!step_value.is_none() && !step_value.is_undefined()) {
    if (!step_value.is_int() && !step_value.is_bool()) throw TemplateError("slice indices must be integers or None");
    step = step_value.as_int();
  }
  if (step == 0) throw TemplateError("slice step cannot be zero");
  const bool ascii = object.is_string() && unicode::is_ascii(object.str());
  const std::u32string cps = object.is_string() && !ascii ? unicode::decode(object.str()) : std::u32string();
  const int64_t n = object.is_list() ? (int64_t)object.list_ref().items.size()
                    : ascii           ? (int64_t)object.str().size()
                                      : (int64_t)cps.size();
  int64_t b, e;
  adjust_slice(n, start, stop, step, b, e);
  std::vector<size_t> picks;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) picks.push_back((size_t)i);
  if (object.is_list()) {
    std::vector<Value> out;
    out.reserve(picks.size());
    for (size_t i : picks) out.push_back(object.list_ref().items[i]);
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (ascii) {
    std::string out;
    out.reserve(picks.size());
    for (size_t i : picks) out += object.str()[i];
    return Value(std::move(out));
  }
  std::u32string out;
  for (size_t i : picks) out += cps[i];
  return Value(unicode::encode(out));
}

}  // namespace kiln::jinja
