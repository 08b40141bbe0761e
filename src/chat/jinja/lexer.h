#pragma once
// Splits a template into text and the tokens inside {{ }} and {% %}, applying the
// whitespace rules exactly where Jinja2's lexer applies them: "-" on a tag strips the
// whitespace next to it, trim_blocks drops the newline after a block or comment tag,
// lstrip_blocks drops the indentation before one, "+" turns either off. Comments vanish
// and {% raw %} bodies come out as text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

struct Token {
  enum class Type { text, variable_begin, variable_end, block_begin, block_end, name, string, integer, floating,
                    op, end };
  Type type = Type::end;
  std::string value;  // text, name, operator, or a string literal's unescaped contents
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;    // Hugging Face's environment sets both
  bool lstrip_blocks = true;
};

// Throws TemplateError (with the line) on an unterminated tag, comment, string or raw block.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options = {});

const char* token_type_name(Token::Type type);

}  // namespace kiln::jinja
