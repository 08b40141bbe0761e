#pragma once
// Turns tokens into the statement tree, following Jinja2's grammar and operator
// precedence (parser.py): filters and tests bind tighter than arithmetic, `**` is
// left-associative, `a if c` without else gives undefined.
#include <string_view>

#include "chat/jinja/ast.h"

namespace kiln::jinja {

struct Program {
  Body body;
};

// Throws TemplateError with the line of the offending token.
std::unique_ptr<Program> parse(std::string_view source);

}  // namespace kiln::jinja
