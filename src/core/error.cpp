#include "core/error.h"

namespace lt::detail {

void throw_error(const char* file, int line, const char* expr, std::string message) {
  std::string where = fmt::format("{}:{}", file, line);
  if (expr) where += fmt::format(" ({})", expr);
  throw Error(std::move(message), std::move(where));
}

}  // namespace lt::detail
