// io/paths.cpp — see paths.h.
#include "io/paths.h"

#include <system_error>

#include "core/error.h"

namespace lt {

namespace fs = std::filesystem;

PathKind path_kind(const fs::path& path) {
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  switch (s.type()) {
    case fs::file_type::not_found: return PathKind::missing;  // ENOENT or ENOTDIR
    case fs::file_type::regular: return PathKind::file;
    case fs::file_type::directory: return PathKind::directory;
    case fs::file_type::none: LT_FAIL("{}: cannot look at this path: {}", path.string(), ec.message());
    default: return PathKind::other;
  }
}

std::vector<fs::path> directory_entries(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  LT_CHECK(!ec, "{}: cannot list this directory: {}", dir.string(), ec.message());
  return out;
}

void make_directories(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LT_CHECK(!ec, "{}: cannot create directory {}: {}", what, dir.string(), ec.message());
}

}  // namespace lt
