#include "device/device.h"

#include <fmt/format.h>

#include "core/error.h"

namespace lt {

const char* stream_kind_name(StreamKind k) {
  switch (k) {
    case StreamKind::compute: return "compute";
    case StreamKind::h2d: return "h2d";
    case StreamKind::d2h: return "d2h";
  }
  LT_FAIL("unknown stream kind {}", int(k));
}

std::string format_bytes(size_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : v < 100 ? 1 : 0, units[u]);
}

std::string format_memory_report(const Device& device) {
  DeviceMemoryStats s = device.memory();
  std::string out =
      fmt::format("device memory ({}): {} in use of {} in {} allocations, peak {}, largest free block {}\n",
                  device.name(), format_bytes(s.in_use), format_bytes(s.capacity), s.allocations,
                  format_bytes(s.peak), format_bytes(s.largest_free));
  for (const auto& u : device.live_allocations())
    out += fmt::format("  {:<32} {:>10}  {:>5.1f}%  in {} block{}\n", u.tag.empty() ? "(untagged)" : u.tag,
                       format_bytes(u.bytes), s.capacity ? 100.0 * double(u.bytes) / double(s.capacity) : 0.0,
                       u.blocks, u.blocks == 1 ? "" : "s");
  return out;
}

}  // namespace lt
