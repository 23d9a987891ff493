// Atomic files written as a stream and unnamed scratch files: the bytes come back exactly, across the buffer's
// size and in pieces of every size; a writer dropped or failing leaves neither the path nor a temporary.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/io_faults.h"
#include "io/json_file.h"
#include "testing/files_testing.h"

namespace lt {
namespace {

namespace fs = std::filesystem;

// Bytes that differ from their neighbours (never all zero), `n` of them.
std::string pattern(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng.next_u64() & 0xff);
  return s;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFile, StreamedPiecesAndAPatchedHeaderComeBackExactly) {
  const std::string dir = testing::fresh_test_dir("lt_atomic_");
  const std::string data = pattern(3 * (size_t(1) << 20) + 12345, 7);  // past the 1 MiB buffer, three times
  std::string expected = data;
  {
    AtomicFile out(dir + "/f.bin");
    size_t at = 0, piece = 1;
    while (at < data.size()) {  // pieces of 1, 3, 9, ... bytes up to 2.4 MB: buffered, flushed and direct writes
      const size_t n = std::min(piece, data.size() - at);
      out.append(data.data() + at, n);
      at += n;
      piece = piece * 3 % 2400000 + 1;
    }
    EXPECT_EQ(out.size(), data.size());
    EXPECT_FALSE(fs::exists(dir + "/f.bin")) << "visible before commit";
    const std::string header = "HEADER";
    out.write_at(5, header.data(), header.size());
    expected.replace(5, header.size(), header);
    EXPECT_NE(testing::error_of([&] { out.write_at(data.size() - 2, header.data(), header.size()); })
                  .find("past the"),
              std::string::npos);
    out.commit();
  }
  EXPECT_EQ(read_file(dir + "/f.bin"), expected);
  EXPECT_EQ(entries(dir), 1u);
}

TEST(AtomicFile, DroppedOrFailedLeavesTheOldFileAndNoTemporary) {
  const std::string dir = testing::fresh_test_dir("lt_atomic_");
  const std::string path = dir + "/f.bin";
  write_file_atomic(path, std::string("old"));
  {
    AtomicFile out(path);
    out.append("new", 3);
  }  // never committed
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(entries(dir), 1u);

  const std::string data = pattern(size_t(5) << 19, 3);
  for (const auto& [op, err] : {std::pair{IoOp::write, ENOSPC}, {IoOp::fsync, EIO}, {IoOp::rename, EXDEV}}) {
    set_io_fault_hook([op = op, err = err](IoOp o, const std::string&) { return o == op ? IoFault{err} : IoFault{}; });
    const std::string message = testing::error_of([&] { write_file_atomic(path, data); });
    set_io_fault_hook({});
    EXPECT_NE(message.find(std::strerror(err)), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_EQ(read_file(path), "old") << io_op_name(op);
    EXPECT_EQ(entries(dir), 1u) << io_op_name(op);
  }
}

TEST(ScratchFile, GivesTheBytesBackInOrderAndHasNoName) {
  const std::string dir = testing::fresh_test_dir("lt_scratch_");
  const std::string data = pattern(size_t(5) << 19, 11);  // 2.5 MiB: two full buffers and a part
  ScratchFile f(dir);
  for (size_t at = 0; at < data.size(); at += 4099) f.append(data.data() + at, std::min<size_t>(4099, data.size() - at));
  EXPECT_EQ(f.size(), data.size());
  EXPECT_EQ(entries(dir), 0u) << "a scratch file has no name";
  std::string back;
  size_t chunks = 0;
  f.read_all([&](std::string_view chunk) {
    back.append(chunk);
    ++chunks;
  });
  EXPECT_EQ(back, data);
  EXPECT_EQ(chunks, 3u);
  EXPECT_NE(testing::error_of([&] { ScratchFile g(dir + "/absent"); }).find("cannot create an unnamed scratch file"),
            std::string::npos);
}

}  // namespace
}  // namespace lt
