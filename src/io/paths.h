// io/paths.h — what a user-given path names, asked without letting std::filesystem throw.
//
// std::filesystem::exists / is_directory / is_regular_file throw filesystem_error for anything but "no such file"
// (a name longer than NAME_MAX, a component that is not searchable), and create_directories for a path it cannot
// make: a raw library message, which a fuzzer found escaping the dataset registry. These answer "missing" for what
// does not exist (ENOENT, ENOTDIR) and throw lt::Error naming the path and the reason for the rest.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lt {

enum class PathKind { missing, file, directory, other };

// Follows symbolic links, as std::filesystem::status does.
PathKind path_kind(const std::filesystem::path& path);

inline bool path_exists(const std::filesystem::path& p) { return path_kind(p) != PathKind::missing; }
inline bool is_directory_path(const std::filesystem::path& p) { return path_kind(p) == PathKind::directory; }
inline bool is_file_path(const std::filesystem::path& p) { return path_kind(p) == PathKind::file; }

// The entries of directory `dir` (not recursive), in the order the file system gives. lt::Error naming the
// directory when it cannot be read.
std::vector<std::filesystem::path> directory_entries(const std::filesystem::path& dir);

// `dir` and its missing parents, as std::filesystem::create_directories; `what` names the setting it came from
// ("output_dir") in the error.
void make_directories(const std::filesystem::path& dir, const std::string& what);

}  // namespace lt
