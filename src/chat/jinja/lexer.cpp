#include "chat/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "chat/jinja/unicode.h"
#include "kiln/chat_template.h"

namespace kiln::jinja {

const char* token_type_name(Token::Type type) {
  switch (type) {
    case Token::Type::text: return "template data";
    case Token::Type::variable_begin: return "'{{'";
    case Token::Type::variable_end: return "'}}'";
    case Token::Type::block_begin: return "'{%'";
    case Token::Type::block_end: return "'%}'";
    case Token::Type::name: return "name";
    case Token::Type::string: return "string";
    case Token::Type::integer: return "integer";
    case Token::Type::floating: return "float";
    case Token::Type::op: return "operator";
    case Token::Type::end: return "end of template";
  }
  return "token";
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's str.splitlines() + "\n".join(): every line break becomes "\n" and one trailing
// break disappears (Jinja2's keep_trailing_newline=False).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  const auto lines = unicode::splitlines(source);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    out += lines[i];
  }
  return out;
}

// Length of the Unicode whitespace run (Python's \s) starting at pos.
size_t whitespace_run(std::string_view s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    const unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      if (!unicode::is_space(c)) break;
      ++i;
      continue;
    }
    // Multi-byte: decode one code point.
    const int n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    const auto cps = unicode::decode(s.substr(i, n));
    if (cps.size() != 1 || !unicode::is_space(cps[0])) break;
    i += n;
  }
  return i - pos;
}

std::string rstrip_whitespace(std::string_view s) { return unicode::strip(s, nullptr, false, true); }

bool all_whitespace(std::string_view s) { return !s.empty() && whitespace_run(s, 0) == s.size(); }

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options) : src_(std::move(source)), opt_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_));
        line_ += count_newlines(std::string_view(src_).substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      size_t raw_body = 0;
      const bool raw = kind == '%' && match_raw_begin(tag, &raw_body);
      emit_text(leading_text(std::string_view(src_).substr(pos_, tag - pos_), sign, kind != '{'));
      line_ += count_newlines(std::string_view(src_).substr(pos_, tag - pos_));
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (raw) lex_raw(tag, raw_body);
      else if (kind == '#') lex_comment();
      else lex_tag(kind == '%');
    }
    Token end;
    end.type = Token::Type::end;
    end.line = line_;
    tokens_.push_back(end);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw TemplateError(what, line_); }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return std::string::npos;
  }

  // The text before a tag, after "-" stripping or lstrip_blocks.
  std::string leading_text(std::string_view text, char sign, bool block_like) const {
    if (sign == '-') return rstrip_whitespace(text);
    if (sign != '+' && opt_.lstrip_blocks && block_like) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_whitespace(text.substr(l_pos))) return std::string(text.substr(0, l_pos));
    }
    return std::string(text);
  }

  void emit_text(std::string text) {
    if (text.empty()) return;
    Token t;
    t.type = Token::Type::text;
    t.value = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  void emit(Token::Type type, std::string value = {}) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // Consumes a tag end at pos_: "+%}" keeps what follows, "-%}" eats the whitespace after
  // it, plain "%}" eats one newline with trim_blocks (block_like: blocks and comments).
  void consume_end(size_t at, size_t close_len, char sign, bool block_like) {
    const size_t start = at;
    size_t p = at + close_len;
    if (sign == '-') p += whitespace_run(src_, p);
    else if (sign == 0 && block_like && opt_.trim_blocks && p < src_.size() && src_[p] == '\n') ++p;
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    line_starting_ = p > start && src_[p - 1] == '\n';
    pos_ = p;
  }

  bool match_raw_begin(size_t tag, size_t* body) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p += whitespace_run(src_, p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    p += whitespace_run(src_, p);
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      p += whitespace_run(src_, p);
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    *body = p;
    return true;
  }

  void lex_raw(size_t tag, size_t body) {
    line_ += count_newlines(std::string_view(src_).substr(tag, body - tag));
    line_starting_ = body > tag && src_[body - 1] == '\n';
    pos_ = body;
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p += whitespace_run(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      p += whitespace_run(src_, p);
      char end_sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) continue;
      emit_text(leading_text(std::string_view(src_).substr(body, i - body), sign, true));
      line_ += count_newlines(std::string_view(src_).substr(body, i - body));
      pos_ = i;
      consume_end(p, 2, end_sign, true);
      return;
    }
    fail("missing end of raw directive");
  }

  void lex_comment() {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail("missing end of comment tag");
    char sign = 0;
    size_t at = close;
    if (close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+')) {
      sign = src_[close - 1];
      at = close - 1;
    }
    consume_end(at, close + 2 - at, sign, true);
  }

  void lex_tag(bool block) {
    emit(block ? Token::Type::block_begin : Token::Type::variable_begin);
    const char* close = block ? "%}" : "}}";
    std::string brackets;  // closers expected for the open (, [ and {
    while (true) {
      if (pos_ >= src_.size()) fail(std::string("unexpected end of template, expected '") + close + "'");
      // The end of the tag wins over any operator, as in Jinja2's rule order, but only
      // outside brackets: {{ {'a': {'b': 1}} }} is one expression.
      if (brackets.empty() && at_tag_end(block, close)) return;
      const size_t ws = whitespace_run(src_, pos_);
      if (ws) {
        line_ += count_newlines(std::string_view(src_).substr(pos_, ws));
        pos_ += ws;
        continue;
      }
      if (lex_number()) continue;
      const char c = src_[pos_];
      if (is_name_start(c)) {
        size_t e = pos_ + 1;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        emit(Token::Type::name, src_.substr(pos_, e - pos_));
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else if (!lex_operator()) {
        fail(std::string("unexpected char '") + c + "'");
      } else {
        balance(brackets, tokens_.back().value[0]);
      }
    }
  }

  // Consumes the tag's end if it is at pos_: "+%}", "-%}" / "-}}", or the plain one.
  bool at_tag_end(bool block, const char* close) {
    const Token::Type type = block ? Token::Type::block_end : Token::Type::variable_end;
    if (block && src_.compare(pos_, 3, "+%}") == 0) {
      emit(type);
      consume_end(pos_, 3, '+', true);
      return true;
    }
    if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
      emit(type);
      consume_end(pos_, 3, '-', block);
      return true;
    }
    if (src_.compare(pos_, 2, close) == 0) {
      emit(type);
      consume_end(pos_, 2, 0, block);
      return true;
    }
    return false;
  }

  void balance(std::string& brackets, char op) const {
    if (op == '(') brackets.push_back(')');
    else if (op == '[') brackets.push_back(']');
    else if (op == '{') brackets.push_back('}');
    else if (op == ')' || op == ']' || op == '}') {
      if (brackets.empty()) fail(std::string("unexpected '") + op + "'");
      if (brackets.back() != op) fail(std::string("unexpected '") + op + "', expected '" + brackets.back() + "'");
      brackets.pop_back();
    }
  }

  // (\d+_)*\d+ starting at p; returns the end or npos.
  size_t digits(size_t p, bool (*ok)(char) = &is_digit) const {
    if (p >= src_.size() || !ok(src_[p])) return std::string::npos;
    while (p < src_.size()) {
      if (ok(src_[p])) ++p;
      else if (src_[p] == '_' && p + 1 < src_.size() && ok(src_[p + 1])) ++p;
      else break;
    }
    return p;
  }

  size_t exponent(size_t p) const {
    if (p >= src_.size() || (src_[p] != 'e' && src_[p] != 'E')) return std::string::npos;
    ++p;
    if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
    return digits(p);
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s)
      if (c != '_') out += c;
    return out;
  }

  bool lex_number() {
    if (!is_digit(src_[pos_])) return false;
    const size_t int_end = digits(pos_);
    // A float (Jinja2's float_re, tried before integers) cannot follow a '.'.
    if (pos_ == 0 || src_[pos_ - 1] != '.') {
      size_t end = std::string::npos;
      if (src_[int_end] == '.' && digits(int_end + 1) != std::string::npos) {
        const size_t frac_end = digits(int_end + 1);
        const size_t exp_end = exponent(frac_end);
        end = exp_end != std::string::npos ? exp_end : frac_end;
      } else {
        end = exponent(int_end);
      }
      if (end != std::string::npos) {
        Token t;
        t.type = Token::Type::floating;
        t.value = src_.substr(pos_, end - pos_);
        t.float_value = std::strtod(without_underscores(t.value).c_str(), nullptr);
        t.line = line_;
        tokens_.push_back(std::move(t));
        pos_ = end;
        return true;
      }
    }
    int base = 10;
    size_t start = pos_, end = int_end;
    const char prefix = pos_ + 1 < src_.size() ? (char)(src_[pos_ + 1] | 0x20) : 0;
    if (src_[pos_] == '0' && (prefix == 'b' || prefix == 'o' || prefix == 'x')) {
      base = prefix == 'b' ? 2 : prefix == 'o' ? 8 : 16;
      auto ok = base == 2 ? +[](char c) { return c == '0' || c == '1'; }
                : base == 8 ? +[](char c) { return c >= '0' && c <= '7'; }
                            : +[](char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
      size_t p = pos_ + 2;
      if (p < src_.size() && src_[p] == '_') ++p;
      const size_t e = digits(p, ok);
      if (e != std::string::npos) {
        start = pos_ + 2;
        end = e;
      } else {
        base = 10;
      }
    }
    if (base == 10 && src_[pos_] == '0') {  // "0", "00", "0_0": a leading zero only before zeros
      end = pos_ + 1;
      while (end < src_.size() && (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0')))
        ++end;
    }
    const std::string text = without_underscores(std::string_view(src_).substr(start, end - start));
    errno = 0;
    char* stop = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &stop, base);
    if (errno == ERANGE || v > (unsigned long long)INT64_MAX) fail("integer literal too large: " + text);
    Token t;
    t.type = Token::Type::integer;
    t.value = src_.substr(pos_, end - pos_);
    t.int_value = (int64_t)v;
    t.line = line_;
    tokens_.push_back(std::move(t));
    pos_ = end;
    return true;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  }

  // A string literal with Python's escapes (\n, \t, \xhh, \uXXXX, octal...); unknown
  // escapes keep their backslash, as Python does.
  void lex_string() {
    const char quote = src_[pos_];
    const int start_line = line_;
    std::string value;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) fail("unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail("unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = p + k < src_.size() ? hex_value(src_[p + k]) : -1;
            if (h < 0) fail(std::string("truncated \\") + e + " escape in a string literal");
            cp = cp * 16 + (char32_t)h;
          }
          p += n;
          if (cp > 0x10FFFF) fail("illegal Unicode character in a string literal");
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
          unicode::append(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = (char32_t)(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) cp = cp * 8 + (src_[p++] - '0');
            unicode::append(value, cp);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    Token t;
    t.type = Token::Type::string;
    t.value = std::move(value);
    t.line = start_line;
    tokens_.push_back(std::move(t));
    line_ += count_newlines(std::string_view(src_).substr(pos_, p + 1 - pos_));
    pos_ = p + 1;
  }

  bool lex_operator() {
    static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        emit(Token::Type::op, op);
        pos_ += 2;
        return true;
      }
    }
    const char c = src_[pos_];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == 0) return false;
    emit(Token::Type::op, std::string(1, c));
    ++pos_;
    return true;
  }

  std::string src_;
  LexerOptions opt_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(normalize_newlines(source), options).run();
}

}  // namespace kiln::jinja
