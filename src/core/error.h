// core/error.h — the one error type and CHECK macro family used everywhere.
//
// Library code never aborts: a failed check throws lt::Error carrying the failed expression, file:line
// and a sentence for the user. The CLI catches it, prints one line and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lt {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string where) : std::runtime_error(std::move(message)), where_(std::move(where)) {}
  // "src/io/safetensors.cpp:120 (offset_end <= file_size)" — for developers; what() is for users.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* expr, std::string message);
}  // namespace detail

}  // namespace lt

// LT_CHECK(cond, "fmt {}", args...): throws lt::Error with the formatted message when cond is false.
#define LT_CHECK(cond, ...)                                                        \
  do {                                                                             \
    if (!(cond)) [[unlikely]]                                                      \
      ::lt::detail::throw_error(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// LT_FAIL("fmt {}", args...): unconditional error (unsupported value, unreachable input case).
#define LT_FAIL(...) ::lt::detail::throw_error(__FILE__, __LINE__, nullptr, ::fmt::format(__VA_ARGS__))

// Comparisons that print both sides.
#define LT_CHECK_EQ(a, b, ...) LT_CHECK((a) == (b), "{} (got {} vs {})", ::fmt::format(__VA_ARGS__), (a), (b))
#define LT_CHECK_LE(a, b, ...) LT_CHECK((a) <= (b), "{} (got {} > {})", ::fmt::format(__VA_ARGS__), (a), (b))
#define LT_CHECK_LT(a, b, ...) LT_CHECK((a) < (b), "{} (got {} >= {})", ::fmt::format(__VA_ARGS__), (a), (b))
