// Device memory: the arena allocator (alignment, best fit, coalescing, fragmentation, errors, peak, tags),
// directly and through the CPU device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "device/arena.h"
#include "device/device.h"

namespace lt {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// A 256-aligned fake base: the arena never touches its memory, so any aligned address range will do.
void* fake_base() { return reinterpret_cast<void*>(uintptr_t(1) << 40); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceMemory, AllocationsAreAlignedDistinctAndCounted) {
  auto dev = make_cpu_device(4 * MiB);
  const size_t sizes[] = {1, 255, 256, 257, 1000, 0, 4097, 65536 + 3};
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  size_t reserved = 0;
  for (size_t n : sizes) {
    auto* p = static_cast<uint8_t*>(dev->alloc(n, "t"));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << "size " << n;
    blocks.push_back({p, n});
    reserved += std::max<size_t>(256, (n + 255) / 256 * 256);
  }
  // Fill each block with its own byte, then check none was overwritten by another: no overlap.
  for (size_t i = 0; i < blocks.size(); ++i) std::memset(blocks[i].first, int(i + 1), blocks[i].second);
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = 0; j < blocks[i].second; ++j) ASSERT_EQ(blocks[i].first[j], uint8_t(i + 1)) << "block " << i;
  DeviceMemoryStats s = dev->memory();
  EXPECT_EQ(s.capacity, 4 * MiB);
  EXPECT_EQ(s.in_use, reserved);
  EXPECT_EQ(s.allocations, blocks.size());
  EXPECT_EQ(s.largest_free, 4 * MiB - reserved);  // allocations are carved from the front, in order
  for (auto& [p, n] : blocks) dev->free(p);
  s = dev->memory();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.largest_free, 4 * MiB);
}

TEST(DeviceMemory, OverBudgetErrorNamesRequestTagUseAndBudget) {
  auto dev = make_cpu_device(1 * MiB);
  void* w = dev->alloc(600 * KiB, "weights L0");
  std::string msg = error_of([&] { dev->alloc(600 * KiB, "activations h[3]"); });
  ASSERT_FALSE(msg.empty()) << "allocating over budget must throw lt::Error";
  EXPECT_NE(msg.find("614400 bytes"), std::string::npos) << msg;       // the request
  EXPECT_NE(msg.find("activations h[3]"), std::string::npos) << msg;   // its tag
  EXPECT_NE(msg.find("614400 bytes) in use"), std::string::npos) << msg;  // in use (600 KiB is 256-aligned)
  EXPECT_NE(msg.find("1048576 bytes) budget"), std::string::npos) << msg;
  EXPECT_NE(msg.find("largest free block 424 KiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("weights L0"), std::string::npos) << msg;  // the biggest live users
  // A failed allocation changes nothing.
  EXPECT_EQ(dev->memory().in_use, 600 * KiB);
  EXPECT_EQ(dev->memory().allocations, 1u);
  // Absurd requests fail cleanly too (no overflow in the rounding).
  EXPECT_THROW(dev->alloc(SIZE_MAX, "huge"), Error);
  EXPECT_THROW(dev->alloc(SIZE_MAX - 100, "huge"), Error);
  dev->free(w);
  EXPECT_NO_THROW(dev->free(dev->alloc(1 * MiB, "all of it")));
}

TEST(DeviceMemory, FragmentationIsReportedAndFreeCoalesces) {
  DeviceArena arena(fake_base(), 4 * KiB);
  void* b[4];
  for (auto& p : b) p = arena.alloc(KiB, "block");
  EXPECT_EQ(arena.stats().largest_free, 0u);
  arena.free(b[0]);
  arena.free(b[2]);
  EXPECT_EQ(arena.free_block_count(), 2u);
  EXPECT_EQ(arena.stats().largest_free, KiB);
  // 2 KiB are free, but in two pieces: the error says so.
  std::string msg = error_of([&] { arena.alloc(2 * KiB, "big"); });
  EXPECT_NE(msg.find("fragmented"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 blocks"), std::string::npos) << msg;
  // Freeing the block between them merges all three into one.
  arena.free(b[1]);
  EXPECT_EQ(arena.free_block_count(), 1u);
  EXPECT_EQ(arena.stats().largest_free, 3 * KiB);
  void* big = arena.alloc(3 * KiB, "big");
  EXPECT_EQ(big, b[0]);
  arena.free(big);
  arena.free(b[3]);  // merges with the free block before it
  EXPECT_EQ(arena.free_block_count(), 1u);
  EXPECT_EQ(arena.stats().largest_free, 4 * KiB);
}

TEST(DeviceMemory, BestFitPicksTheSmallestHole) {
  DeviceArena arena(fake_base(), 64 * KiB);
  // Holes of 4 KiB and 1 KiB separated by live blocks; a 1 KiB request takes the 1 KiB hole.
  void* a = arena.alloc(4 * KiB, "a");
  void* keep1 = arena.alloc(256, "keep");
  void* c = arena.alloc(KiB, "c");
  void* keep2 = arena.alloc(256, "keep");
  arena.free(a);
  arena.free(c);
  EXPECT_EQ(arena.alloc(KiB, "fits"), c);
  EXPECT_EQ(arena.alloc(KiB, "next"), a);  // then the lowest-addressed of the rest
  (void)keep1;
  (void)keep2;
}

TEST(DeviceMemory, RandomAllocFreeKeepsBlocksDisjointAndCoalescesToOne) {
  const uint64_t seed = 20240601;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const size_t capacity = 1 * MiB + 100;  // not a multiple of the alignment: the usable part is rounded down
  DeviceArena arena(fake_base(), capacity);
  const uintptr_t base = reinterpret_cast<uintptr_t>(fake_base());
  std::map<uintptr_t, size_t> live;  // address -> reserved size
  size_t in_use = 0, peak = 0, failures = 0;
  for (int step = 0; step < 20000; ++step) {
    bool do_alloc = live.empty() || rng.below(100) < 55;
    if (do_alloc) {
      size_t n = rng.below(100) < 80 ? 1 + rng.below(4 * KiB) : 1 + rng.below(64 * KiB);
      void* p = nullptr;
      try {
        p = arena.alloc(n, "r");
      } catch (const Error&) {
        ++failures;
        ASSERT_LT(arena.stats().largest_free, (n + 255) / 256 * 256) << "refused though a block fits, step " << step;
        continue;
      }
      uintptr_t a = reinterpret_cast<uintptr_t>(p);
      size_t r = (n + 255) / 256 * 256;
      ASSERT_EQ(a % 256, 0u);
      ASSERT_GE(a, base);
      ASSERT_LE(a + r, base + capacity / 256 * 256);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + r, next->first) << "overlap at step " << step;
      }
      if (next != live.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, a) << "overlap at step " << step;
      }
      live[a] = r;
      in_use += r;
      peak = std::max(peak, in_use);
    } else {
      auto it = live.begin();
      std::advance(it, rng.below(live.size()));
      arena.free(reinterpret_cast<void*>(it->first));
      in_use -= it->second;
      live.erase(it);
    }
    DeviceMemoryStats s = arena.stats();
    ASSERT_EQ(s.in_use, in_use);
    ASSERT_EQ(s.allocations, live.size());
    ASSERT_EQ(s.peak, peak);
  }
  EXPECT_GT(failures, 0u) << "the sequence should have hit the budget at least once";
  for (auto& [a, r] : live) arena.free(reinterpret_cast<void*>(a));
  EXPECT_EQ(arena.free_block_count(), 1u);
  EXPECT_EQ(arena.stats().largest_free, capacity / 256 * 256);
}

TEST(DeviceMemory, PeakIsAHighWaterMarkUntilReset) {
  auto dev = make_cpu_device(1 * MiB);
  void* a = dev->alloc(100 * KiB, "a");
  void* b = dev->alloc(200 * KiB, "b");
  dev->free(a);
  EXPECT_EQ(dev->memory().in_use, 200 * KiB);
  EXPECT_EQ(dev->memory().peak, 300 * KiB);
  dev->reset_peak();
  EXPECT_EQ(dev->memory().peak, 200 * KiB);
  void* c = dev->alloc(50 * KiB, "c");
  EXPECT_EQ(dev->memory().peak, 250 * KiB);
  dev->free(b);
  dev->free(c);
  EXPECT_EQ(dev->memory().peak, 250 * KiB);
}

TEST(DeviceMemory, FreeOfAnUnknownPointerIsAnError) {
  auto dev = make_cpu_device(1 * MiB);
  std::vector<uint8_t> host(1024);
  EXPECT_THROW(dev->free(host.data()), Error);  // not device memory at all
  auto* p = static_cast<uint8_t*>(dev->alloc(1024, "x"));
  EXPECT_THROW(dev->free(p + 256), Error);  // inside a block, not its start
  void* q = dev->alloc(256, "y");
  EXPECT_THROW(dev->free(static_cast<uint8_t*>(q) + 512), Error);  // a free region
  dev->free(p);
  std::string msg = error_of([&] { dev->free(p); });  // twice
  EXPECT_NE(msg.find("not a live device allocation"), std::string::npos) << msg;
  EXPECT_NO_THROW(dev->free(nullptr));  // as cudaFree
  EXPECT_EQ(dev->memory().allocations, 1u);
  dev->free(q);
}

TEST(DeviceMemory, LiveAllocationsReportMemoryPerTag) {
  auto dev = make_cpu_device(8 * MiB);
  void* w0 = dev->alloc(2 * MiB, "weights");
  void* w1 = dev->alloc(2 * MiB, "weights");
  void* h = dev->alloc(1 * MiB, "boundary h");
  void* g = dev->alloc(100, "grad");
  auto usage = dev->live_allocations();
  ASSERT_EQ(usage.size(), 3u);
  EXPECT_EQ(usage[0].tag, "weights");
  EXPECT_EQ(usage[0].bytes, 4 * MiB);
  EXPECT_EQ(usage[0].blocks, 2u);
  EXPECT_EQ(usage[1].tag, "boundary h");
  EXPECT_EQ(usage[2].tag, "grad");
  EXPECT_EQ(usage[2].bytes, 256u);
  std::string report = format_memory_report(*dev);
  EXPECT_NE(report.find("5.00 MiB in use of 8.00 MiB"), std::string::npos) << report;
  EXPECT_NE(report.find("weights"), std::string::npos) << report;
  EXPECT_NE(report.find("50.0%"), std::string::npos) << report;
  dev->free(w1);
  usage = dev->live_allocations();
  EXPECT_EQ(usage[0].bytes, 2 * MiB);
  EXPECT_EQ(usage[0].blocks, 1u);
  for (void* p : {w0, h, g}) dev->free(p);
  EXPECT_TRUE(dev->live_allocations().empty());
}

TEST(DeviceMemory, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(80ull << 30), "80.0 GiB");
  EXPECT_EQ(format_bytes(300ull << 20), "300 MiB");
}

TEST(DeviceMemory, LargeCapacityCostsNothingUntilTouched) {
  // 64 GiB of emulated device memory is only reserved address space (MAP_NORESERVE).
  auto dev = make_cpu_device(64ull << 30);
  auto* p = static_cast<uint8_t*>(dev->alloc(32ull << 30, "big"));
  p[0] = 1;
  p[(32ull << 30) - 1] = 2;
  EXPECT_EQ(p[0] + p[(32ull << 30) - 1], 3);
  dev->free(p);
}

TEST(DeviceMemory, ZeroCapacityRefusesEverything) {
  auto dev = make_cpu_device(0);
  EXPECT_THROW(dev->alloc(1, "x"), Error);
  EXPECT_EQ(dev->memory().largest_free, 0u);
}

}  // namespace
}  // namespace lt
