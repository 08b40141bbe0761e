#pragma once
// The values a template computes with, modelled on the Python objects Jinja2 hands around:
// lists and dicts are shared by reference (so namespace() attributes and list.append()
// mutate what every name sees), ints and floats stay distinct, and Undefined remembers
// why it is undefined so that using it in arithmetic can say so.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/chat_template.h"

namespace kiln::jinja {

class Value;
struct List;
struct Dict;
struct Function;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using FunctionPtr = std::shared_ptr<Function>;

// Errors raised while rendering: line 0 means "not known yet"; the evaluator fills in the
// line of the innermost expression that was being evaluated.
using TemplateError = kiln::TemplateError;

class Value {
 public:
  enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::boolean), data_(b) {}
  Value(int v) : kind_(Kind::integer), data_(int64_t(v)) {}
  Value(int64_t v) : kind_(Kind::integer), data_(v) {}
  Value(double v) : kind_(Kind::floating), data_(v) {}
  Value(std::string s) : kind_(Kind::string), data_(std::move(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(ListPtr l);
  Value(DictPtr d);
  Value(FunctionPtr f);

  static Value none() { Value v; v.kind_ = Kind::none; return v; }
  // `why`: the message an operation on it raises, e.g. "'foo' is undefined".
  static Value undefined(std::string why) { Value v; v.data_ = std::move(why); return v; }
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  bool is_float() const { return kind_ == Kind::floating; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python's bool is an int
  bool is_string() const { return kind_ == Kind::string; }
  bool is_list() const { return kind_ == Kind::list; }  // lists and tuples
  bool is_dict() const { return kind_ == Kind::dict; }  // dicts, namespaces, loop objects
  bool is_function() const { return kind_ == Kind::function; }
  bool is_tuple() const;
  bool is_mapping() const;  // a plain dict (not a namespace or loop object)

  // The accessors throw TemplateError ("an integer is required...") on the wrong kind.
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;     // integer or boolean
  double as_double() const;   // any number
  const std::string& str() const;
  List& list_ref() const { return *std::get<ListPtr>(data_); }
  Dict& dict_ref() const { return *std::get<DictPtr>(data_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(data_); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(data_); }
  const Function& function() const { return *std::get<FunctionPtr>(data_); }
  const FunctionPtr& function_ptr() const { return std::get<FunctionPtr>(data_); }
  const std::string& undefined_reason() const;

  bool truthy() const;             // Python's bool()
  std::string to_string() const;   // Python's str() as Jinja prints it (undefined -> "")
  std::string repr() const;        // Python's repr(), used inside lists and dicts
  const char* type_name() const;   // Python's type name for messages: "str", "dict"...
  // Throws the undefined's message: for operations Jinja refuses on Undefined.
  void require_defined() const;

 private:
  Kind kind_ = Kind::undefined;
  std::variant<std::monostate, bool, int64_t, double, std::string, ListPtr, DictPtr, FunctionPtr> data_;
};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
};

struct Dict {
  // A namespace() or a loop variable reads its entries as attributes and has no dict
  // methods; a mapping is a Python dict.
  enum class Kind { mapping, namespace_object, loop_object };
  Kind kind = Kind::mapping;
  std::vector<std::pair<Value, Value>> entries;  // insertion order, like Python's dict

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

// Arguments of a call: positional, then keyword, as written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(const CallArgs&)> call;
  bool is_macro = false;
};

// Binds call arguments to named parameters like a Python signature: positional first, then
// keywords by name; unknown keywords and surplus arguments are errors naming `function`.
class Arguments {
 public:
  Arguments(const CallArgs& args, std::string_view function, std::vector<std::string_view> params,
            size_t required = 0);
  bool has(size_t i) const { return i < bound_.size() && bound_[i] != nullptr; }
  const Value& get(size_t i) const;  // undefined when not given
  Value get_or(size_t i, Value fallback) const { return has(i) ? get(i) : std::move(fallback); }

 private:
  std::vector<const Value*> bound_;
};

Value make_function(std::string name, std::function<Value(const CallArgs&)> call);

// Python semantics for ==, <, `in` and the list of items a `for` iterates over.
bool equals(const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);  // throws TypeError-like errors for mixed types
bool contains(const Value& container, const Value& item);
std::vector<Value> iterate(const Value& v);
// Lists and dicts are shared by reference counting, so a list put inside itself would never
// be freed: list.append() and namespace assignments refuse a value that holds `container`.
void refuse_cycle(const Value& value, const void* container);

// Python repr() of a float ("1.0", "1e-05", "0.30000000000000004") and of a string.
std::string float_repr(double d);
std::string string_repr(std::string_view s);

}  // namespace kiln::jinja
