// train/tensorboard.h — TensorBoard event files, written directly: TFRecord framing (length, masked
// CRC32C of the length, an Event protocol buffer, masked CRC32C of the data) with the few protobuf fields
// scalars need hand-encoded. A protobuf library would bring a code generator for three messages; the
// encoding of these fields is fixed and small, so we write it (and test it by parsing it back).
//
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }     Value { string tag = 1; float simple_value = 2; }
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace lt {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);  // ((crc >> 15) | (crc << 17)) + 0xa282ead8

class TensorBoardWriter {
 public:
  // Creates dir if needed and opens dir/events.out.tfevents.<unix time>.<host>.<pid>; writes the header
  // event (file_version "brain.Event:2").
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(std::string_view tag, int64_t step, double value, double wall_time = -1);
  void flush();  // fflush + fsync: events survive a crash up to here
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  FILE* file_ = nullptr;
};

// One scalar read back from an event file (tests, tools).
struct TensorBoardScalar {
  std::string tag;
  int64_t step;
  double wall_time;
  float value;
};
// Parses every record, checking both CRCs of each; throws lt::Error naming the file and offset of a
// corrupt or truncated record.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path);

}  // namespace lt
