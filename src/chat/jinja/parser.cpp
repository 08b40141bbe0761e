#include "chat/jinja/parser.h"

#include <initializer_list>

#include "chat/jinja/builtins.h"
#include "chat/jinja/lexer.h"

namespace kiln::jinja {
namespace {

// Deeper nesting than this is no real template; refusing it keeps a hostile one from
// overflowing the stack.
constexpr int kMaxDepth = 200;

std::string describe(const Token& t) {
  switch (t.type) {
    case Token::Type::name:
    case Token::Type::op: return "'" + t.value + "'";
    case Token::Type::string: return "string";
    case Token::Type::integer:
    case Token::Type::floating: return "number";
    case Token::Type::variable_end: return "end of print statement";
    case Token::Type::block_end: return "end of statement block";
    default: return token_type_name(t.type);
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::unique_ptr<Program> run() {
    auto program = std::make_unique<Program>();
    program->body = subparse({});
    if (cur().type != Token::Type::end) fail("unexpected " + describe(cur()));
    for (const Unknown& u : unknown_)
      if (!u.soft) throw TemplateError(u.message, u.line);
    return program;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth) parser.fail("template nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // Jinja2 refuses an unknown filter or test when it compiles the template, except inside
  // an `if` or an inline `x if c else y` ("soft" places), where only reaching it fails.
  struct Unknown {
    std::string message;
    int line;
    bool soft;
  };
  void unknown(std::string message, int line) { unknown_.push_back({std::move(message), line, soft_ > 0}); }
  // Bodies of loops, macros and blocks are compiled in a new frame, which is not soft.
  template <typename F>
  auto hard(F&& parse_body) {
    const int saved = soft_;
    soft_ = 0;
    auto result = parse_body();
    soft_ = saved;
    return result;
  }

  const Token& cur() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  [[noreturn]] void fail(const std::string& what) const { throw TemplateError(what, cur().line); }

  bool is_op(const char* op) const { return cur().type == Token::Type::op && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == Token::Type::name && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  const Token& expect(Token::Type type) {
    if (cur().type != type) fail(std::string("expected ") + token_type_name(type) + ", got " + describe(cur()));
    return next();
  }
  void expect_name(const char* name) {
    if (!skip_name(name)) fail(std::string("expected '") + name + "', got " + describe(cur()));
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `end_names` (left as the current token) or
  // the end of the template.
  Body subparse(std::initializer_list<const char*> end_names) {
    Body body;
    while (cur().type != Token::Type::end) {
      const Token& t = cur();
      if (t.type == Token::Type::text) {
        body.push_back(std::make_unique<TextStmt>(t.value, t.line));
        next();
      } else if (t.type == Token::Type::variable_begin) {
        next();
        auto expr = parse_tuple(true, {}, false);
        body.push_back(std::make_unique<OutputStmt>(std::move(expr), t.line));
        expect(Token::Type::variable_end);
      } else if (t.type == Token::Type::block_begin) {
        next();
        if (cur().type == Token::Type::name)
          for (const char* end : end_names)
            if (cur().value == end) return body;
        body.push_back(parse_statement());
        expect(Token::Type::block_end);
      } else {
        fail("unexpected " + describe(t));
      }
    }
    return body;
  }

  // The body of a block statement, up to one of `end_names` (which stays current unless
  // drop_needle). Reaching the end of the template first is an error naming the tags.
  Body parse_statements(std::initializer_list<const char*> end_names, bool drop_needle = false) {
    skip_op(":");
    expect(Token::Type::block_end);
    std::string expected;
    size_t i = 0;
    for (const char* name : end_names) expected += std::string(i++ ? " or '" : "'") + name + "'";
    expected_.push_back(expected);
    Body body = subparse(end_names);
    expected_.pop_back();
    if (cur().type == Token::Type::end) fail("unexpected end of template, expected " + expected);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& t = cur();
    if (t.type != Token::Type::name) fail("tag name expected, got " + describe(t));
    const std::string& tag = t.value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "print") {
      next();
      return std::make_unique<OutputStmt>(parse_tuple(true, {}, false), t.line);
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside of a for loop");
      auto s = std::make_unique<SimpleStmt>(tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, t.line);
      next();
      return s;
    }
    if (tag == "generation") {  // Hugging Face's assistant-mask marker: the body renders as is
      auto s = std::make_unique<ScopeStmt>(t.line);
      next();
      s->body = parse_statements({"endgeneration"}, true);
      return s;
    }
    if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
        tag == "autoescape")
      fail("the '" + tag + "' tag is not supported in chat templates");
    fail("unknown tag '" + tag + "'" + (expected_.empty() ? "" : ", expected " + expected_.back()));
  }

  StmtPtr parse_if() {
    auto node = std::make_unique<IfStmt>(next().line);
    ++soft_;
    while (true) {
      auto test = parse_tuple(false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"});
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& t = next();
      if (t.value == "elif") continue;
      if (t.value == "else") node->otherwise = parse_statements({"endif"}, true);
      break;
    }
    --soft_;
    return node;
  }

  StmtPtr parse_for() {
    auto node = std::make_unique<ForStmt>(next().line);
    node->target = parse_assign_target(false);
    expect_name("in");
    node->iterable = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) node->filter = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported");
    ++loop_depth_;
    node->body = hard([&] { return parse_statements({"endfor", "else"}); });
    --loop_depth_;
    if (next().value == "else") node->otherwise = hard([&] { return parse_statements({"endfor"}, true); });
    return node;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    Target target = parse_assign_target(true);
    if (skip_op("=")) {
      auto node = std::make_unique<SetStmt>(line);
      node->target = std::move(target);
      node->value = parse_tuple(true, {}, false);
      return node;
    }
    auto node = std::make_unique<SetBlockStmt>(line);
    node->target = std::move(target);
    while (skip_op("|")) node->filters.push_back(parse_filter_call(nullptr));
    node->body = hard([&] { return parse_statements({"endset"}, true); });
    return node;
  }

  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      MacroParam p;
      p.name = expect(Token::Type::name).value;
      if (skip_op("=")) p.default_value = parse_expression(true);
      else if (!params.empty() && params.back().default_value) fail("non-default argument follows default argument");
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro() {
    auto node = std::make_unique<MacroStmt>(next().line);
    node->name = expect(Token::Type::name).value;
    node->params = parse_signature();
    macros_.push_back(node.get());
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    node->body = hard([&] { return parse_statements({"endmacro"}, true); });
    loop_depth_ = saved_loops;
    macros_.pop_back();
    return node;
  }

  StmtPtr parse_call_block() {
    auto node = std::make_unique<CallBlockStmt>(next().line);
    if (is_op("(")) node->params = parse_signature();
    ExprPtr call = parse_expression(true);
    if (call->kind != Expr::Kind::call) fail("expected a macro call after 'call'");
    node->call.reset(static_cast<CallExpr*>(call.release()));
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    node->body = hard([&] { return parse_statements({"endcall"}, true); });
    loop_depth_ = saved_loops;
    return node;
  }

  StmtPtr parse_filter_block() {
    auto node = std::make_unique<FilterBlockStmt>(next().line);
    node->filters.push_back(parse_filter_call(nullptr));
    while (skip_op("|")) node->filters.push_back(parse_filter_call(nullptr));
    node->body = hard([&] { return parse_statements({"endfilter"}, true); });
    return node;
  }

  StmtPtr parse_with() {
    auto node = std::make_unique<WithStmt>(next().line);
    while (cur().type != Token::Type::block_end) {
      if (!node->assignments.empty()) expect_op(",");
      Target target = parse_assign_target(false);
      expect_op("=");
      node->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    node->body = hard([&] { return parse_statements({"endwith"}, true); });
    return node;
  }

  // name | name, name | (name, name) | ns.attr (only where namespaces can be assigned).
  Target parse_assign_target(bool with_namespace) {
    Target target;
    if (with_namespace && cur().type == Token::Type::name && look().type == Token::Type::op && look().value == ".") {
      target.names.push_back(next().value);
      next();
      target.namespace_attr = expect(Token::Type::name).value;
      return target;
    }
    const bool paren = skip_op("(");
    while (true) {
      target.names.push_back(expect(Token::Type::name).value);
      if (!skip_op(",")) break;
      target.tuple = true;
      if (cur().type != Token::Type::name) break;  // trailing comma
    }
    if (paren) {
      expect_op(")");
      target.tuple = true;
    }
    return target;
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<const char*> extra_end) const {
    const Token& t = cur();
    if (t.type == Token::Type::variable_end || t.type == Token::Type::block_end || (t.type == Token::Type::op && t.value == ")"))
      return true;
    for (const char* name : extra_end)
      if (t.type == Token::Type::name && t.value == name) return true;
    return false;
  }

  // Comma-separated expressions; more than one (or a trailing comma) makes a tuple.
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto t = std::make_unique<ListExpr>(true, line);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const int line = cur().line;
    const size_t first_unknown = unknown_.size();
    ExprPtr expr = parse_or();
    if (!is_name("if")) return expr;
    // All of `a if c else b` is a soft place, `a` included. (A parse error ends parsing, so
    // soft_ needs no restoring on the way out.)
    for (size_t i = first_unknown; i < unknown_.size(); ++i) unknown_[i].soft = true;
    ++soft_;
    while (skip_name("if")) {
      auto c = std::make_unique<ConditionalExpr>(line);
      c->then = std::move(expr);
      c->cond = parse_or();
      if (skip_name("else")) c->otherwise = parse_condexpr();
      expr = std::move(c);
    }
    --soft_;
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryExpr::Op::logical_or, std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryExpr::Op::logical_and, std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const int line = next().line;
      return std::make_unique<UnaryExpr>(UnaryExpr::Op::logical_not, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CompareExpr::Op op;
      if (is_op("==")) op = CompareExpr::Op::eq;
      else if (is_op("!=")) op = CompareExpr::Op::ne;
      else if (is_op("<")) op = CompareExpr::Op::lt;
      else if (is_op("<=")) op = CompareExpr::Op::le;
      else if (is_op(">")) op = CompareExpr::Op::gt;
      else if (is_op(">=")) op = CompareExpr::Op::ge;
      else if (is_name("in")) op = CompareExpr::Op::in;
      else if (is_name("not") && look().type == Token::Type::name && look().value == "in") {
        next();
        op = CompareExpr::Op::not_in;
      } else {
        break;
      }
      next();
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(first), line);
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const auto op = cur().value == "+" ? BinaryExpr::Op::add : BinaryExpr::Op::sub;
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryExpr::Op::concat, std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& v = cur().value;
      const auto op = v == "*" ? BinaryExpr::Op::mul : v == "/" ? BinaryExpr::Op::div
                      : v == "//" ? BinaryExpr::Op::floordiv : BinaryExpr::Op::mod;
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryExpr::Op::pow, std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const int line = cur().line;
    ExprPtr node;
    if (skip_op("-")) node = std::make_unique<UnaryExpr>(UnaryExpr::Op::negate, parse_unary(false), line);
    else if (skip_op("+")) node = std::make_unique<UnaryExpr>(UnaryExpr::Op::plus, parse_unary(false), line);
    else node = parse_primary();
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Token::Type::name: {
        next();
        if (t.value == "true" || t.value == "True") return std::make_unique<LiteralExpr>(Value(true), t.line);
        if (t.value == "false" || t.value == "False") return std::make_unique<LiteralExpr>(Value(false), t.line);
        if (t.value == "none" || t.value == "None") return std::make_unique<LiteralExpr>(Value::none(), t.line);
        for (MacroStmt* m : macros_) {
          m->uses_varargs |= t.value == "varargs";
          m->uses_kwargs |= t.value == "kwargs";
          m->uses_caller |= t.value == "caller";
        }
        return std::make_unique<NameExpr>(t.value, t.line);
      }
      case Token::Type::string: {
        std::string s;
        while (cur().type == Token::Type::string) s += next().value;  // 'a' 'b' is 'ab'
        return std::make_unique<LiteralExpr>(Value(std::move(s)), t.line);
      }
      case Token::Type::integer: next(); return std::make_unique<LiteralExpr>(Value(t.int_value), t.line);
      case Token::Type::floating: next(); return std::make_unique<LiteralExpr>(Value(t.float_value), t.line);
      case Token::Type::op:
        if (t.value == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto list = std::make_unique<ListExpr>(false, next().line);
    while (!is_op("]")) {
      if (!list->items.empty()) expect_op(",");
      if (is_op("]")) break;
      list->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return list;
  }

  ExprPtr parse_dict() {
    auto dict = std::make_unique<DictExpr>(next().line);
    while (!is_op("}")) {
      if (!dict->items.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      dict->items.emplace_back(std::move(key), parse_expression(true));
    }
    expect_op("}");
    return dict;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        while (skip_op("|")) node = parse_filter_call(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& attr = next();
      if (attr.type == Token::Type::name) return std::make_unique<GetAttrExpr>(std::move(node), attr.value, t.line);
      if (attr.type != Token::Type::integer) fail("expected name or number after '.'");
      return std::make_unique<GetItemExpr>(std::move(node), std::make_unique<LiteralExpr>(Value(attr.int_value), t.line),
                                           t.line);
    }
    // '[': an index or a slice
    ExprPtr start, stop, step;
    bool slice = false;
    if (!is_op(":")) start = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]")) stop = parse_expression(true);
      if (skip_op(":") && !is_op("]")) step = parse_expression(true);
    }
    if (is_op(",")) fail("subscripts with several indexes are not supported");
    expect_op("]");
    if (!slice) return std::make_unique<GetItemExpr>(std::move(node), std::move(start), t.line);
    auto s = std::make_unique<SliceExpr>(t.line);
    s->object = std::move(node);
    s->start = std::move(start);
    s->stop = std::move(stop);
    s->step = std::move(step);
    return s;
  }

  ArgList parse_call_args() {
    ArgList args;
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Token::Type::name && look().type == Token::Type::op && look().value == "=") {
        std::string key = next().value;
        next();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.keyword.empty()) fail("positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
      need_comma = true;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = std::make_unique<CallExpr>(std::move(callee), cur().line);
    call->args = parse_call_args();
    return call;
  }

  std::string dotted_name() {
    std::string name = expect(Token::Type::name).value;
    while (skip_op(".")) name += "." + expect(Token::Type::name).value;
    return name;
  }

  std::unique_ptr<FilterExpr> parse_filter_call(ExprPtr subject) {
    const int line = cur().line;
    auto f = std::make_unique<FilterExpr>(std::move(subject), dotted_name(), line);
    if (!find_filter(f->name)) unknown("no filter named '" + f->name + "'", line);
    if (is_op("(")) f->args = parse_call_args();
    return f;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = next().line;  // 'is'
    const bool negated = skip_name("not");
    auto test = std::make_unique<TestExpr>(std::move(subject), dotted_name(), negated, line);
    if (!find_test(test->name)) unknown("no test named '" + test->name + "'", line);
    const Token& t = cur();
    if (is_op("(")) {
      test->args = parse_call_args();
    } else if ((t.type == Token::Type::name || t.type == Token::Type::string || t.type == Token::Type::integer ||
                t.type == Token::Type::floating || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      test->args.positional.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
    }
    return test;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int soft_ = 0;
  std::vector<Unknown> unknown_;
  std::vector<std::string> expected_;  // the end tags each open block waits for
  std::vector<MacroStmt*> macros_;
};

}  // namespace

std::unique_ptr<Program> parse(std::string_view source) { return Parser(tokenize(source)).run(); }

}  // namespace kiln::jinja
