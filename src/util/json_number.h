#pragma once
// Numbers read from JSON (tokenizer.json, tokenizer_config.json, chat messages, the state
// inside session files, and later server requests) are range-checked before they are
// converted. nlohmann's get<long>() of 1.3e92 is undefined behaviour (a float-to-integer
// overflow, found by fuzzing), and a value that wraps on conversion would pass the
// caller's own checks as some other number. Each helper throws kiln::Error naming the
// field and the accepted range.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "kiln/error.h"

namespace kiln {

namespace json_detail {
inline std::string range_text(double lo, double hi) {
  const auto text = [](double v) {
    if (v == std::trunc(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  std::string range = "[";  // appended piece by piece: GCC 12 warns (-Wrestrict) on "[" + ...
  range += text(lo);
  range += ", ";
  range += text(hi);
  range += "]";
  return range;
}
}  // namespace json_detail

// An integer in [lo, hi]. A float with an integral value (2.0) counts as that integer.
template <typename Json>
int64_t json_integer(const Json& j, std::string_view field, int64_t lo = std::numeric_limits<int64_t>::min(),
                     int64_t hi = std::numeric_limits<int64_t>::max()) {
  const auto refuse = [&]() -> int64_t {
    throw Error(std::string(field) + " must be an integer in " + json_detail::range_text(double(lo), double(hi)) +
                ", got " + j.dump());
  };
  if (j.is_number_unsigned()) {
    const uint64_t u = j.template get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()) || int64_t(u) > hi || int64_t(u) < lo) return refuse();
    return int64_t(u);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.template get<int64_t>();
    return v < lo || v > hi ? refuse() : v;
  }
  if (j.is_number_float()) {
    const double d = j.template get<double>();
    // Compared as doubles before any conversion: lo and hi round to doubles no larger in
    // magnitude than 2^63, and d must be integral and inside them.
    if (!std::isfinite(d) || d != std::trunc(d) || d < double(lo) || d > double(hi) || std::fabs(d) >= 0x1p63)
      return refuse();
    return int64_t(d);
  }
  return refuse();
}

// A finite number in [lo, hi].
template <typename Json>
double json_real(const Json& j, std::string_view field, double lo = -std::numeric_limits<double>::max(),
                 double hi = std::numeric_limits<double>::max()) {
  if (j.is_number()) {
    const double d = j.template get<double>();
    if (std::isfinite(d) && d >= lo && d <= hi) return d;
  }
  throw Error(std::string(field) + " must be a number in " + json_detail::range_text(lo, hi) + ", got " + j.dump());
}

// The member `key` of object o as json_integer / json_real, or `fallback` when o has none.
template <typename Json>
int64_t json_integer_or(const Json& o, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const auto it = o.find(key);
  return it == o.end() ? fallback : json_integer(*it, key, lo, hi);
}
template <typename Json>
double json_real_or(const Json& o, const char* key, double fallback, double lo, double hi) {
  const auto it = o.find(key);
  return it == o.end() ? fallback : json_real(*it, key, lo, hi);
}

}  // namespace kiln
