#pragma once
// What templates can do with values besides printing them: Python's operators, Jinja2's
// attribute/item lookup, the methods of str/list/dict, the filters, the tests and the
// global functions. Every failure throws TemplateError without a line; the evaluator adds
// the line of the expression that failed.
#include <string>
#include <string_view>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace kiln::jinja {

// ---- operators.cpp ----
Value binary_op(BinaryExpr::Op op, const Value& a, const Value& b);  // arithmetic and ~
Value unary_minus(const Value& v);
Value unary_plus(const Value& v);
// Jinja2's environment.getattr: an attribute (a method of str/list/dict, an entry of a
// namespace or loop object) first, then an item; missing gives Undefined.
Value get_attr(const Value& object, const std::string& name);
// Jinja2's environment.getitem: an item first, then an attribute.
Value get_item(const Value& object, const Value& key);
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// The item a lookup path's part names ("items.0", "{0[12]}"): a run of decimal digits is
// an integer index (saturated past int64: only ever out of range), anything else a key.
Value path_key(const std::string& part);
// Refuses results beyond this many bytes or items ('x' * 10**12), so a template cannot
// exhaust memory or time: a prompt is at most a few MiB of text.
constexpr size_t kMaxResultSize = size_t(32) << 20;  // bytes of one string, and of the output
constexpr size_t kMaxItems = size_t(1) << 20;        // items of one list
void check_size(size_t n);
void check_items(size_t n);

// ---- methods.cpp ----
// A bound method of a str, list or dict, or Undefined if it has no such method.
Value bound_method(const Value& object, const std::string& name);
// Python's str.split / str.title, shared with filters.
std::vector<std::string> python_split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string python_title(const std::string& s);
std::string python_capitalize(const std::string& s);

// ---- format.cpp ----
std::string percent_format(const std::string& format, const Value& args);  // "%s: %d" % (a, b)
std::string str_format(const std::string& format, const CallArgs& args);   // "{}: {name}".format(...)
struct JsonOptions {
  bool ensure_ascii = false;
  std::string indent;           // newline + this per level when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// Python's json.dumps with the options Hugging Face passes (ensure_ascii=False).
std::string to_json(const Value& v, const JsonOptions& options);

// ---- filters.cpp / tests.cpp ----
using FilterFn = Value (*)(const Value& subject, const CallArgs& args);
using TestFn = bool (*)(const Value& subject, const CallArgs& args);
FilterFn find_filter(std::string_view name);  // nullptr if unknown
TestFn find_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& subject, const CallArgs& args);  // throws if unknown
bool apply_test(std::string_view name, const Value& subject, const CallArgs& args);
// Reads obj.a.b (or obj[0]) for the attribute= argument of sort, map, selectattr...
Value attribute_path(const Value& object, const Value& path);

// ---- globals.cpp ----
// range, dict, namespace, joiner, cycler, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> global_functions();

}  // namespace kiln::jinja
