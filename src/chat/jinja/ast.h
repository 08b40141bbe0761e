#pragma once
// The parsed template: expressions and statements as plain data. Each node keeps the
// template line it starts on so that errors while rendering can name it.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace kiln::jinja {

struct Expr {
  enum class Kind { literal, name, list, dict, get_attr, get_item, slice, unary, binary, compare, conditional, call,
                    filter, test };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ArgList {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(Value v, int l) : Expr(Kind::literal, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(Kind::name, l), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {  // [a, b] or (a, b)
  ListExpr(bool t, int l) : Expr(Kind::list, l), tuple(t) {}
  bool tuple;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {  // object.attr
  GetAttrExpr(ExprPtr o, std::string a, int l) : Expr(Kind::get_attr, l), object(std::move(o)), attr(std::move(a)) {}
  ExprPtr object;
  std::string attr;
};

struct GetItemExpr : Expr {  // object[index]
  GetItemExpr(ExprPtr o, ExprPtr i, int l) : Expr(Kind::get_item, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object, index;
};

struct SliceExpr : Expr {  // object[start:stop:step], each part optional
  explicit SliceExpr(int l) : Expr(Kind::slice, l) {}
  ExprPtr object, start, stop, step;
};

struct UnaryExpr : Expr {
  enum class Op { negate, plus, logical_not };
  UnaryExpr(Op o, ExprPtr e, int l) : Expr(Kind::unary, l), op(o), operand(std::move(e)) {}
  Op op;
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  enum class Op { add, sub, mul, div, floordiv, mod, pow, concat, logical_and, logical_or };
  BinaryExpr(Op o, ExprPtr a, ExprPtr b, int l) : Expr(Kind::binary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  Op op;
  ExprPtr left, right;
};

// a < b <= c chains like Python: every pair must hold.
struct CompareExpr : Expr {
  enum class Op { eq, ne, lt, le, gt, ge, in, not_in };
  CompareExpr(ExprPtr first_operand, int l) : Expr(Kind::compare, l), first(std::move(first_operand)) {}
  ExprPtr first;
  std::vector<std::pair<Op, ExprPtr>> rest;
};

struct ConditionalExpr : Expr {  // then if cond else otherwise (otherwise may be absent)
  explicit ConditionalExpr(int l) : Expr(Kind::conditional, l) {}
  ExprPtr cond, then, otherwise;
};

struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(Kind::call, l), callee(std::move(c)) {}
  ExprPtr callee;
  ArgList args;
};

struct FilterExpr : Expr {  // subject | name(args); subject is null in {% filter %} blocks
  FilterExpr(ExprPtr s, std::string n, int l) : Expr(Kind::filter, l), subject(std::move(s)), name(std::move(n)) {}
  ExprPtr subject;
  std::string name;
  ArgList args;
};

struct TestExpr : Expr {  // subject is [not] name(args)
  TestExpr(ExprPtr s, std::string n, bool neg, int l)
      : Expr(Kind::test, l), subject(std::move(s)), name(std::move(n)), negated(neg) {}
  ExprPtr subject;
  std::string name;
  bool negated;
  ArgList args;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// What a for or set assigns to: one name, a tuple of names, or namespace.attr.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string namespace_attr;  // set when the target is names[0].namespace_attr
};

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, macro, call_block, filter_block, with, break_, continue_,
                    scope };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(Kind::text, l), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(ExprPtr e, int l) : Stmt(Kind::output, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::if_, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
  Body otherwise;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::for_, l) {}
  Target target;
  ExprPtr iterable, filter;  // filter: the optional `if` after the iterable
  Body body, otherwise;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::set, l) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {  // {% set x | filters %}body{% endset %}
  explicit SetBlockStmt(int l) : Stmt(Kind::set_block, l) {}
  Target target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::macro, l) {}
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};

struct CallBlockStmt : Stmt {  // {% call(params) macro(args) %}body{% endcall %}
  explicit CallBlockStmt(int l) : Stmt(Kind::call_block, l) {}
  std::unique_ptr<CallExpr> call;
  std::vector<MacroParam> params;
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::filter_block, l) {}
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::with, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

struct SimpleStmt : Stmt {  // break, continue
  using Stmt::Stmt;
};

// A body rendered as it is, e.g. Hugging Face's {% generation %} marker.
struct ScopeStmt : Stmt {
  explicit ScopeStmt(int l) : Stmt(Kind::scope, l) {}
  Body body;
};

}  // namespace kiln::jinja
