#pragma once
// Python strings count code points, not bytes: len(), slicing, center() and case mapping
// in templates must do the same on kiln's UTF-8 strings. Invalid bytes decode as U+FFFD
// rather than failing, since a template only ever shows them back.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja::unicode {

std::u32string decode(std::string_view utf8);
std::string encode(std::u32string_view text);
void append(std::string& out, char32_t cp);
size_t length(std::string_view utf8);  // in code points
bool is_ascii(std::string_view utf8);

// Case mapping for ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin:
// the scripts chat templates meet; everything else maps to itself.
char32_t to_upper(char32_t cp);
char32_t to_lower(char32_t cp);
std::string upper(std::string_view utf8);
std::string lower(std::string_view utf8);

// Python's str.isspace / isalpha / isdigit / isalnum (\w for wordcount) on one code point.
bool is_space(char32_t cp);
bool is_alpha(char32_t cp);
bool is_digit(char32_t cp);
bool is_cased_upper(char32_t cp);
bool is_cased_lower(char32_t cp);

// Python's str.strip([chars]) family; chars == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// Python's str.splitlines(keepends).
std::vector<std::string> splitlines(std::string_view s, bool keepends = false);

}  // namespace kiln::jinja::unicode
