#include "chat/jinja/evaluator.h"

#include "chat/jinja/builtins.h"

namespace kiln::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent_.get()) {
    const auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return &it->second;
  }
  return nullptr;
}

namespace {

// Macros calling themselves without end would otherwise overflow the stack.
constexpr int kMaxCallDepth = 200;

// Adds the line of the node being evaluated to an error that has none yet.
[[noreturn]] void rethrow_with_line(const TemplateError& e, int line) {
  if (e.line() != 0) throw e;
  throw TemplateError(e.message(), line);
}

class Renderer {
 public:
  std::string run(const Program& program, const ScopePtr& scope) {
    std::string out;
    exec_body(program.body, scope, out);
    return out;
  }

 private:
  enum class Flow { next, break_loop, continue_loop };

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const StmtPtr& stmt : body) {
      Flow f;
      try {
        f = exec(*stmt, scope, out);
      } catch (const TemplateError& e) {
        rethrow_with_line(e, stmt->line);
      }
      if (out.size() > kMaxResultSize) throw TemplateError("output too large", stmt->line);
      if (f != Flow::next) return f;
    }
    return Flow::next;
  }

  std::string render_body(const Body& body, const ScopePtr& scope) {
    std::string out;
    exec_body(body, scope, out);
    return out;
  }

  Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    switch (stmt.kind) {
      case Stmt::Kind::text: out += static_cast<const TextStmt&>(stmt).text; return Flow::next;
      case Stmt::Kind::output: out += eval(*static_cast<const OutputStmt&>(stmt).expr, scope).to_string(); return Flow::next;
      case Stmt::Kind::if_: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return exec_body(body, scope, out);
        return exec_body(s.otherwise, scope, out);
      }
      case Stmt::Kind::for_: exec_for(static_cast<const ForStmt&>(stmt), scope, out); return Flow::next;
      case Stmt::Kind::set: {
        const auto& s = static_cast<const SetStmt&>(stmt);
        assign(s.target, eval(*s.value, scope), *scope);
        return Flow::next;
      }
      case Stmt::Kind::set_block: {
        const auto& s = static_cast<const SetBlockStmt&>(stmt);
        Value v(render_body(s.body, std::make_shared<Scope>(scope)));
        for (const auto& f : s.filters) v = apply_filter(f->name, v, eval_args(f->args, scope));
        assign(s.target, std::move(v), *scope);
        return Flow::next;
      }
      case Stmt::Kind::macro: {
        const auto& s = static_cast<const MacroStmt&>(stmt);
        scope->set(s.name, make_macro(s.name, s.params, s.body, scope, &s));
        return Flow::next;
      }
      case Stmt::Kind::call_block: {
        const auto& s = static_cast<const CallBlockStmt&>(stmt);
        Value caller = make_macro("caller", s.params, s.body, scope, nullptr);
        out += call(*s.call, scope, &caller).to_string();
        return Flow::next;
      }
      case Stmt::Kind::filter_block: {
        const auto& s = static_cast<const FilterBlockStmt&>(stmt);
        Value v(render_body(s.body, scope));
        for (const auto& f : s.filters) v = apply_filter(f->name, v, eval_args(f->args, scope));
        out += v.to_string();
        return Flow::next;
      }
      case Stmt::Kind::with: {
        const auto& s = static_cast<const WithStmt&>(stmt);
        auto inner = std::make_shared<Scope>(scope);
        for (const auto& [target, expr] : s.assignments) assign(target, eval(*expr, scope), *inner);
        return exec_body(s.body, inner, out);
      }
      case Stmt::Kind::scope: return exec_body(static_cast<const ScopeStmt&>(stmt).body, std::make_shared<Scope>(scope), out);
      case Stmt::Kind::break_: return Flow::break_loop;
      case Stmt::Kind::continue_: return Flow::continue_loop;
    }
    return Flow::next;
  }

  void assign(const Target& target, Value value, Scope& scope) {
    if (!target.namespace_attr.empty()) {
      const Value* ns = scope.find(target.names[0]);
      if (!ns || !ns->is_dict() || ns->dict_ref().kind != Dict::Kind::namespace_object)
        throw TemplateError("cannot assign attribute on non-namespace object");
      refuse_cycle(value, ns->dict_ptr().get());
      ns->dict_ref().set(Value(target.namespace_attr), std::move(value));
      return;
    }
    if (!target.tuple) {
      scope.set(target.names[0], std::move(value));
      return;
    }
    const auto items = iterate(value);
    if (items.size() != target.names.size())
      throw TemplateError(items.size() > target.names.size()
                              ? "too many values to unpack (expected " + std::to_string(target.names.size()) + ")"
                              : "not enough values to unpack (expected " + std::to_string(target.names.size()) +
                                    ", got " + std::to_string(items.size()) + ")");
    for (size_t i = 0; i < items.size(); ++i) scope.set(target.names[i], items[i]);
  }

  void exec_for(const ForStmt& s, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*s.iterable, scope));
    if (s.filter) {  // the `if` of `for x in xs if cond` runs before the loop counts items
      std::vector<Value> kept;
      for (Value& item : items) {
        auto probe = std::make_shared<Scope>(scope);
        assign(s.target, item, *probe);
        if (eval(*s.filter, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.otherwise, std::make_shared<Scope>(scope), out);
      return;
    }
    const int64_t n = (int64_t)items.size();
    auto last_changed = std::make_shared<std::vector<Value>>();
    auto changed_called = std::make_shared<bool>(false);
    for (int64_t i = 0; i < n; ++i) {
      auto inner = std::make_shared<Scope>(scope);
      auto loop = std::make_shared<Dict>();
      loop->kind = Dict::Kind::loop_object;
      auto& e = loop->entries;
      e.emplace_back(Value("index"), Value(i + 1));
      e.emplace_back(Value("index0"), Value(i));
      e.emplace_back(Value("revindex"), Value(n - i));
      e.emplace_back(Value("revindex0"), Value(n - i - 1));
      e.emplace_back(Value("first"), Value(i == 0));
      e.emplace_back(Value("last"), Value(i == n - 1));
      e.emplace_back(Value("length"), Value(n));
      e.emplace_back(Value("depth"), Value(1));
      e.emplace_back(Value("depth0"), Value(0));
      if (i > 0) e.emplace_back(Value("previtem"), items[(size_t)i - 1]);
      if (i < n - 1) e.emplace_back(Value("nextitem"), items[(size_t)i + 1]);
      e.emplace_back(Value("cycle"), make_function("cycle", [i](const CallArgs& args) {
                       if (args.positional.empty()) throw TemplateError("no items for cycling given");
                       return args.positional[(size_t)i % args.positional.size()];
                     }));
      e.emplace_back(Value("changed"), make_function("changed", [last_changed, changed_called](const CallArgs& args) {
                       const Value now = Value::list(args.positional);
                       if (*changed_called && equals(now, Value::list(*last_changed))) return Value(false);
                       *changed_called = true;
                       *last_changed = args.positional;
                       return Value(true);
                     }));
      inner->set("loop", Value(std::move(loop)));
      assign(s.target, items[(size_t)i], *inner);
      if (exec_body(s.body, inner, out) == Flow::break_loop) break;
    }
  }

  // A macro (or the caller of a call block) as a function value. Its scope sees the
  // variables where it was defined, as they are when it is called.
  Value make_macro(const std::string& name, const std::vector<MacroParam>& params, const Body& body,
                   const ScopePtr& closure, const MacroStmt* macro) {
    auto f = std::make_shared<Function>();
    f->name = name;
    f->is_macro = true;
    // The macro usually lives in the scope it closes over: a weak reference keeps that
    // from being a reference cycle that would never be freed.
    std::weak_ptr<Scope> weak_closure = closure;
    f->call = [this, name, &params, &body, weak_closure, macro](const CallArgs& args) {
      const ScopePtr closure = weak_closure.lock();
      if (!closure) throw TemplateError("macro '" + name + "' called outside the block that defined it");
      if (call_depth_ >= kMaxCallDepth) throw TemplateError("maximum macro recursion depth exceeded");
      struct DepthGuard {
        int& d;
        ~DepthGuard() { --d; }
      } guard{++call_depth_};
      auto scope = std::make_shared<Scope>(closure);
      const bool varargs = macro && macro->uses_varargs, kwargs = macro && macro->uses_kwargs;
      if (args.positional.size() > params.size() && !varargs)
        throw TemplateError("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
      std::vector<bool> bound(params.size(), false);
      for (size_t i = 0; i < args.positional.size() && i < params.size(); ++i) {
        scope->set(params[i].name, args.positional[i]);
        bound[i] = true;
      }
      auto extra_kwargs = std::make_shared<Dict>();
      for (const auto& [key, value] : args.keyword) {
        size_t i = 0;
        while (i < params.size() && params[i].name != key) ++i;
        if (i < params.size()) {
          scope->set(key, value);
          bound[i] = true;
        } else if (key == "caller") {
          scope->set("caller", value);
        } else if (kwargs) {
          extra_kwargs->set(Value(key), value);
        } else {
          throw TemplateError("macro '" + name + "' takes no keyword argument '" + key + "'");
        }
      }
      for (size_t i = 0; i < params.size(); ++i) {
        if (bound[i]) continue;
        scope->set(params[i].name, params[i].default_value
                                       ? eval(*params[i].default_value, scope)
                                       : Value::undefined("parameter '" + params[i].name + "' was not provided"));
      }
      if (varargs) {
        std::vector<Value> rest;
        for (size_t i = params.size(); i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
        scope->set("varargs", Value::tuple(std::move(rest)));
      }
      if (kwargs) scope->set("kwargs", Value(extra_kwargs));
      return Value(render_body(body, scope));
    };
    return Value(std::move(f));
  }

  CallArgs eval_args(const ArgList& list, const ScopePtr& scope) {
    CallArgs args;
    args.positional.reserve(list.positional.size());
    for (const auto& e : list.positional) args.positional.push_back(eval(*e, scope));
    for (const auto& [name, e] : list.keyword) args.keyword.emplace_back(name, eval(*e, scope));
    return args;
  }

  Value call(const CallExpr& c, const ScopePtr& scope, const Value* caller = nullptr) {
    const Value callee = eval(*c.callee, scope);
    CallArgs args = eval_args(c.args, scope);
    if (caller) args.keyword.emplace_back("caller", *caller);
    callee.require_defined();
    if (!callee.is_function()) throw TemplateError(std::string("'") + callee.type_name() + "' object is not callable");
    return callee.function().call(args);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_node(e, scope);
    } catch (const TemplateError& err) {
      rethrow_with_line(err, e.line);
    }
  }

  Value eval_node(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::literal: return static_cast<const LiteralExpr&>(e).value;
      case Expr::Kind::name: {
        const auto& n = static_cast<const NameExpr&>(e);
        if (const Value* v = scope->find(n.name)) return *v;
        return Value::undefined("'" + n.name + "' is undefined");
      }
      case Expr::Kind::list: {
        const auto& l = static_cast<const ListExpr&>(e);
        std::vector<Value> items;
        items.reserve(l.items.size());
        for (const auto& item : l.items) items.push_back(eval(*item, scope));
        return l.tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case Expr::Kind::dict: {
        Value d = Value::dict();
        for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) d.dict_ref().set(eval(*k, scope), eval(*v, scope));
        return d;
      }
      case Expr::Kind::get_attr: {
        const auto& g = static_cast<const GetAttrExpr&>(e);
        return get_attr(eval(*g.object, scope), g.attr);
      }
      case Expr::Kind::get_item: {
        const auto& g = static_cast<const GetItemExpr&>(e);
        const Value object = eval(*g.object, scope);
        return get_item(object, eval(*g.index, scope));
      }
      case Expr::Kind::slice: {
        const auto& s = static_cast<const SliceExpr&>(e);
        const Value object = eval(*s.object, scope);
        auto part = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value::none(); };
        return slice(object, part(s.start), part(s.stop), part(s.step));
      }
      case Expr::Kind::unary: {
        const auto& u = static_cast<const UnaryExpr&>(e);
        const Value v = eval(*u.operand, scope);
        switch (u.op) {
          case UnaryExpr::Op::negate: return unary_minus(v);
          case UnaryExpr::Op::plus: return unary_plus(v);
          case UnaryExpr::Op::logical_not: return Value(!v.truthy());
        }
        break;
      }
      case Expr::Kind::binary: {
        const auto& b = static_cast<const BinaryExpr&>(e);
        Value left = eval(*b.left, scope);
        // `and` / `or` give one of their operands, as in Python, and short-circuit.
        if (b.op == BinaryExpr::Op::logical_and) return left.truthy() ? eval(*b.right, scope) : left;
        if (b.op == BinaryExpr::Op::logical_or) return left.truthy() ? left : eval(*b.right, scope);
        return binary_op(b.op, left, eval(*b.right, scope));
      }
      case Expr::Kind::compare: {
        const auto& c = static_cast<const CompareExpr&>(e);
        Value left = eval(*c.first, scope);
        for (const auto& [op, expr] : c.rest) {
          Value right = eval(*expr, scope);
          if (!compare(op, left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::conditional: {
        const auto& c = static_cast<const ConditionalExpr&>(e);
        if (eval(*c.cond, scope).truthy()) return eval(*c.then, scope);
        if (c.otherwise) return eval(*c.otherwise, scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
      case Expr::Kind::call: return call(static_cast<const CallExpr&>(e), scope);
      case Expr::Kind::filter: {
        const auto& f = static_cast<const FilterExpr&>(e);
        const Value subject = eval(*f.subject, scope);
        return apply_filter(f.name, subject, eval_args(f.args, scope));
      }
      case Expr::Kind::test: {
        const auto& t = static_cast<const TestExpr&>(e);
        const Value subject = eval(*t.subject, scope);
        return Value(apply_test(t.name, subject, eval_args(t.args, scope)) != t.negated);
      }
    }
    throw TemplateError("unknown expression");
  }

  static bool compare(CompareExpr::Op op, const Value& a, const Value& b) {
    switch (op) {
      case CompareExpr::Op::eq: return equals(a, b);
      case CompareExpr::Op::ne: return !equals(a, b);
      case CompareExpr::Op::lt: return less_than(a, b);
      case CompareExpr::Op::gt: return less_than(b, a);
      case CompareExpr::Op::le: return less_than(a, b) || equals(a, b);
      case CompareExpr::Op::ge: return less_than(b, a) || equals(a, b);
      case CompareExpr::Op::in: return contains(b, a);
      case CompareExpr::Op::not_in: return !contains(b, a);
    }
    return false;
  }

  int call_depth_ = 0;
};

}  // namespace

std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& variables) {
  auto globals = std::make_shared<Scope>();
  for (auto& [name, fn] : global_functions()) globals->set(name, std::move(fn));
  auto context = std::make_shared<Scope>(globals);
  for (const auto& [name, value] : variables) context->set(name, value);
  Renderer renderer;
  return renderer.run(program, context);
}

}  // namespace kiln::jinja
