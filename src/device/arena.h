// device/arena.h — the device-memory allocator: best fit over one contiguous range of addresses.
//
// The arena never touches the memory it hands out; it only keeps the books for [base, base + capacity).
// So the CPU device runs it over an mmap'ed host range, and a CUDA device can run it over one big
// cudaMalloc (a hard budget with no driver fragmentation, as LLMQ and PyTorch's caching allocator do).
//
// Blocks are multiples of kAlign (256 bytes, cudaMalloc's alignment) and tile the range: every byte
// belongs to exactly one block, live or free. Allocation takes the smallest free block that fits (lowest
// address among equals) and splits off the rest; free merges with free neighbours at once, so two free
// blocks are never adjacent. Both are O(log n) in the number of blocks. Thread-safe (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"

namespace lt {

class DeviceArena {
 public:
  // (A class member, not lt::kDeviceAlign: exec/working_set.h defines that name for its memory model.)
  static constexpr size_t kAlign = 256;

  // `base` must be kAlign-aligned; the usable size is `capacity` rounded down to kAlign.
  DeviceArena(void* base, size_t capacity);
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // A block of at least `bytes` (0 counts as 1: every allocation is a distinct, non-null, freeable
  // pointer). No fitting free block: lt::Error naming the request, the tag, the bytes in use, the
  // budget, the largest free block and the biggest live tags.
  void* alloc(size_t bytes, const std::string& tag);
  // `ptr` must be a pointer alloc returned and not yet freed; anything else is an lt::Error.
  // nullptr is a no-op (as cudaFree).
  void free(void* ptr);

  // True when [ptr, ptr + bytes) lies inside one live block (a view into an allocation is fine).
  bool contains_live(const void* ptr, size_t bytes) const;
  // True when ptr lies anywhere in the arena's address range, live or free.
  bool in_range(const void* ptr) const;
  // A device's check of a copy at enqueue (what = "copy_h2d" / "copy_d2h", name = the op's label): the device
  // side lies inside one live block and the host side is not null and not device memory; else lt::Error.
  void check_copy(const char* what, const std::string& name, const void* device_ptr, const char* device_side,
                  const void* host_ptr, const char* host_side, size_t bytes) const;

  DeviceMemoryStats stats() const;
  void reset_peak();
  std::vector<DeviceTagUsage> usage_by_tag() const;  // largest first
  size_t free_block_count() const;                   // fragments; 1 when nothing is live

 private:
  struct Block {
    size_t size = 0;
    bool free = true;
    std::string tag;
  };
  using BlockMap = std::map<size_t, Block>;  // offset -> block, address order

  void insert_free(BlockMap::iterator it) { free_by_size_.emplace(it->second.size, it->first); }
  void erase_free(BlockMap::iterator it) { free_by_size_.erase({it->second.size, it->first}); }
  size_t largest_free_locked() const { return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first; }
  std::vector<DeviceTagUsage> usage_by_tag_locked() const;
  [[noreturn]] void throw_out_of_memory(size_t bytes, const std::string& tag) const;

  uintptr_t base_;
  size_t capacity_;  // as given (the budget users set)
  size_t usable_;    // capacity_ rounded down to kAlign
  mutable std::mutex mu_;
  BlockMap blocks_;
  std::set<std::pair<size_t, size_t>> free_by_size_;  // (size, offset) of every free block
  size_t in_use_ = 0, peak_ = 0, live_ = 0;
};

}  // namespace lt
