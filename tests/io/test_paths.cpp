// User-given paths looked at, listed and made: what exists answers as it is, what does not as missing, and
// every other failure (a name past NAME_MAX, a file where a directory must go) as an lt::Error naming the path —
// never std::filesystem's own exception (a fuzzer found one escaping the dataset registry).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"
#include "testing/files_testing.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

TEST(Paths, SayWhatAPathNames) {
  const std::string dir = testing::fresh_test_dir("lt_paths_");
  write_file_atomic(dir + "/f.json", "{}");
  fs::create_symlink(dir + "/f.json", dir + "/link");
  EXPECT_EQ(path_kind(dir), PathKind::directory);
  EXPECT_EQ(path_kind(dir + "/f.json"), PathKind::file);
  EXPECT_EQ(path_kind(dir + "/link"), PathKind::file);  // followed
  EXPECT_EQ(path_kind(dir + "/absent"), PathKind::missing);
  EXPECT_EQ(path_kind(dir + "/f.json/under"), PathKind::missing);  // ENOTDIR: nothing can be there
  EXPECT_EQ(path_kind("/dev/null"), PathKind::other);
  EXPECT_TRUE(path_exists(dir + "/f.json"));
  EXPECT_TRUE(is_file_path(dir + "/f.json"));
  EXPECT_FALSE(is_directory_path(dir + "/f.json"));
  EXPECT_TRUE(is_directory_path(dir));
}

TEST(Paths, ANameTooLongIsAnErrorNamingIt) {
  const std::string dir = testing::fresh_test_dir("lt_paths_");
  const std::string long_name = dir + "/" + std::string(300, 'q');  // NAME_MAX is 255
  const std::string e = error_of([&] { (void)path_exists(long_name); });
  EXPECT_NE(e.find(long_name + ": cannot look at this path: File name too long"), std::string::npos) << e;
  const std::string made = error_of([&] { make_directories(long_name, "output_dir"); });
  EXPECT_NE(made.find("output_dir: cannot create directory " + long_name), std::string::npos) << made;
}

TEST(Paths, MakeDirectoriesNamesTheSettingWhenAFileIsInTheWay) {
  const std::string dir = testing::fresh_test_dir("lt_paths_");
  make_directories(dir + "/a/b/c", "output_dir");
  EXPECT_TRUE(is_directory_path(dir + "/a/b/c"));
  make_directories(dir + "/a/b/c", "output_dir");  // already there: nothing to do
  write_file_atomic(dir + "/file", "x");
  const std::string e = error_of([&] { make_directories(dir + "/file/sub", "output_dir"); });
  EXPECT_NE(e.find("output_dir: cannot create directory " + dir + "/file/sub"), std::string::npos) << e;
}

TEST(Paths, ListADirectoryOrNameWhyNot) {
  const std::string dir = testing::fresh_test_dir("lt_paths_");
  write_file_atomic(dir + "/b", "x");
  write_file_atomic(dir + "/a", "y");
  std::vector<fs::path> got = directory_entries(dir);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<fs::path>{dir + "/a", dir + "/b"}));
  const std::string e = error_of([&] { (void)directory_entries(dir + "/a"); });
  EXPECT_NE(e.find(dir + "/a: cannot list this directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace lt
