#include "core/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <fmt/format.h>

#include "core/error.h"

namespace lt {

size_t parse_size(std::string_view text, std::string_view what) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  LT_CHECK(digits > 0, "{} '{}' is not a size: expected bytes or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, "
                       "GB, TB)", what, text);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + digits, value);
  LT_CHECK(ec == std::errc() && end == s.data() + digits, "{} '{}': '{}' is not a number", what, text,
           s.substr(0, digits));
  std::string_view unit = s.substr(digits);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.remove_prefix(1);
  struct Unit { std::string_view name; double scale; };
  static constexpr Unit units[] = {{"", 1},          {"B", 1},          {"KiB", 1024.0},     {"MiB", 1048576.0},
                                   {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                                   {"GB", 1e9},       {"TB", 1e12}};
  for (const Unit& u : units) {
    if (unit != u.name) continue;
    double bytes = value * u.scale;
    LT_CHECK(bytes < 1.8e19, "{} '{}' is too large", what, text);
    LT_CHECK(u.scale != 1 || value == std::floor(value), "{} '{}': a byte count must be a whole number", what, text);
    return size_t(std::llround(bytes));
  }
  LT_FAIL("{} '{}': unknown unit '{}' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", what, text, unit);
}

std::string format_bytes(double bytes) {
  const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.3g} {}", bytes, names[i]);
}

}  // namespace lt
