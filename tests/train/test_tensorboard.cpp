// TensorBoard event files: CRC32C known answers, framing, and scalars read back exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/json_file.h"
#include "train/tensorboard.h"

namespace lt {
namespace {

TEST(Crc32c, KnownAnswers) {
  // RFC 3720 (iSCSI) test vectors and the common check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  std::string inc(32, 0);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = char(i);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
}

TEST(TensorBoard, ScalarsRoundTrip) {
  std::string dir = ::testing::TempDir() + "lt_tb_roundtrip";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    for (int64_t step = 1; step <= 50; ++step) {
      w.add_scalar("train/loss", step, 5.0 / double(step), 1000.0 + double(step));
      w.add_scalar("train/lr", step, 1e-4 * double(step));
    }
    w.add_scalar("eval/exact_match", 300000000000LL, 0.91);  // a step needing a multi-byte varint
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  auto scalars = read_tensorboard_scalars(path);
  ASSERT_EQ(scalars.size(), 101u);
  EXPECT_EQ(scalars[0].tag, "train/loss");
  EXPECT_EQ(scalars[0].step, 1);
  EXPECT_EQ(scalars[0].value, float(5.0));
  EXPECT_EQ(scalars[0].wall_time, 1001.0);
  EXPECT_EQ(scalars[99].tag, "train/lr");
  EXPECT_EQ(scalars[99].value, float(1e-4 * 50));
  EXPECT_EQ(scalars[100].step, 300000000000LL);
  EXPECT_EQ(scalars[100].value, 0.91f);
}

TEST(TensorBoard, CorruptionIsDetected) {
  std::string dir = ::testing::TempDir() + "lt_tb_corrupt";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalar("a", 1, 1.0);
  }
  std::string bytes = read_file(path);
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 0x10;  // inside the last event's data
  std::ofstream(path, std::ios::binary).write(flipped.data(), std::streamsize(flipped.size()));
  EXPECT_THROW(read_tensorboard_scalars(path), Error);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() - 3));  // truncated
  EXPECT_THROW(read_tensorboard_scalars(path), Error);
}

}  // namespace
}  // namespace lt
