// Jinja2's tests (`x is defined`, `n is divisibleby 3`...), with Python's notion of types:
// a bool is a number but not an integer, a string is iterable and a sequence.
#include <unordered_map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/unicode.h"

namespace kiln::jinja {
namespace {

const Value& only_arg(const CallArgs& args, const char* test) {
  Arguments a(args, test, {"other"}, 1);
  return a.get(0);
}

void no_args(const CallArgs& args, const char* test) { Arguments(args, test, {}); }

bool t_defined(const Value& v, const CallArgs& a) { return no_args(a, "defined"), !v.is_undefined(); }
bool t_undefined(const Value& v, const CallArgs& a) { return no_args(a, "undefined"), v.is_undefined(); }
bool t_none(const Value& v, const CallArgs& a) { return no_args(a, "none"), v.is_none(); }
bool t_boolean(const Value& v, const CallArgs& a) { return no_args(a, "boolean"), v.is_bool(); }
bool t_true(const Value& v, const CallArgs& a) { return no_args(a, "true"), v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, const CallArgs& a) { return no_args(a, "false"), v.is_bool() && !v.as_bool(); }
bool t_integer(const Value& v, const CallArgs& a) { return no_args(a, "integer"), v.is_int(); }
bool t_float(const Value& v, const CallArgs& a) { return no_args(a, "float"), v.is_float(); }
bool t_number(const Value& v, const CallArgs& a) { return no_args(a, "number"), v.is_number(); }
bool t_string(const Value& v, const CallArgs& a) { return no_args(a, "string"), v.is_string(); }
bool t_mapping(const Value& v, const CallArgs& a) { return no_args(a, "mapping"), v.is_mapping(); }
bool t_callable(const Value& v, const CallArgs& a) { return no_args(a, "callable"), v.is_function(); }
bool t_escaped(const Value&, const CallArgs& a) { return no_args(a, "escaped"), false; }

// Undefined counts as a sequence and as iterable: it has a length (0) and iterates empty.
bool t_sequence(const Value& v, const CallArgs& a) {
  no_args(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping();
}
bool t_iterable(const Value& v, const CallArgs& a) {
  no_args(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping();
}

Value python_mod(const Value& v, const Value& n) { return binary_op(BinaryExpr::Op::mod, v, n); }

bool t_even(const Value& v, const CallArgs& a) {
  no_args(a, "even");
  return equals(python_mod(v, Value(2)), Value(0));
}
bool t_odd(const Value& v, const CallArgs& a) {
  no_args(a, "odd");
  return equals(python_mod(v, Value(2)), Value(1));
}
bool t_divisibleby(const Value& v, const CallArgs& a) { return equals(python_mod(v, only_arg(a, "divisibleby")), Value(0)); }

bool t_eq(const Value& v, const CallArgs& a) { return equals(v, only_arg(a, "eq")); }
bool t_ne(const Value& v, const CallArgs& a) { return !equals(v, only_arg(a, "ne")); }
bool t_lt(const Value& v, const CallArgs& a) { return less_than(v, only_arg(a, "lt")); }
bool t_le(const Value& v, const CallArgs& a) { return !less_than(only_arg(a, "le"), v); }
bool t_gt(const Value& v, const CallArgs& a) { return less_than(only_arg(a, "gt"), v); }
bool t_ge(const Value& v, const CallArgs& a) { return !less_than(v, only_arg(a, "ge")); }
bool t_in(const Value& v, const CallArgs& a) { return contains(only_arg(a, "in"), v); }

// Python's `is`: identity. Containers are the same object only if they share storage;
// None, booleans and equal small scalars are the same object in CPython.
bool t_sameas(const Value& v, const CallArgs& a) {
  const Value& other = only_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::list: return v.list_ptr() == other.list_ptr();
    case Value::Kind::dict: return v.dict_ptr() == other.dict_ptr();
    case Value::Kind::function: return v.function_ptr() == other.function_ptr();
    default: return equals(v, other);
  }
}

bool t_lower(const Value& v, const CallArgs& a) {
  no_args(a, "lower");
  return bound_method(Value(v.to_string()), "islower").function().call({}).truthy();
}
bool t_upper(const Value& v, const CallArgs& a) {
  no_args(a, "upper");
  return bound_method(Value(v.to_string()), "isupper").function().call({}).truthy();
}

bool t_filter(const Value& v, const CallArgs& a) {
  no_args(a, "filter");
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(const Value& v, const CallArgs& a) {
  no_args(a, "test");
  return v.is_string() && find_test(v.str()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"sequence", t_sequence}, {"iterable", t_iterable},
      {"callable", t_callable}, {"escaped", t_escaped}, {"even", t_even}, {"odd", t_odd},
      {"divisibleby", t_divisibleby}, {"equalto", t_eq}, {"eq", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt},
      {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas},
      {"lower", t_lower}, {"upper", t_upper}, {"filter", t_filter}, {"test", t_test},
  };
  return table;
}

}  // namespace

TestFn find_test(std::string_view name) {
  const auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

bool apply_test(std::string_view name, const Value& subject, const CallArgs& args) {
  const TestFn t = find_test(name);
  if (!t) throw TemplateError("no test named '" + std::string(name) + "'");
  return t(subject, args);
}

}  // namespace kiln::jinja
