#pragma once
// Renders a parsed template. Scoping follows Jinja2: `for` bodies, macros and `with`
// blocks get their own scope for each run (a `set` inside stays inside), `if` does not.
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/jinja/parser.h"

namespace kiln::jinja {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent_(std::move(parent)) {}
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value) { vars_[name] = std::move(value); }

 private:
  std::unordered_map<std::string, Value> vars_;
  std::shared_ptr<Scope> parent_;
};
using ScopePtr = std::shared_ptr<Scope>;

// Renders `program` with `variables` (which override the global functions of the same
// name). Throws TemplateError with the failing line, or TemplateRaisedError.
std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& variables);

}  // namespace kiln::jinja
