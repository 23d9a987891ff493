#include "device/arena.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace lt {

DeviceArena::DeviceArena(void* base, size_t capacity)
    : base_(reinterpret_cast<uintptr_t>(base)), capacity_(capacity), usable_(capacity / kAlign * kAlign) {
  LT_CHECK(base_ % kAlign == 0, "device arena base {} is not {}-byte aligned", base, kAlign);
  if (usable_ > 0) insert_free(blocks_.emplace(0, Block{usable_, true, {}}).first);
}

void* DeviceArena::alloc(size_t bytes, const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > usable_) throw_out_of_memory(bytes, tag);  // also keeps the rounding below from overflowing
  size_t size = std::max<size_t>(1, bytes);
  size = (size + kAlign - 1) / kAlign * kAlign;
  auto fit = free_by_size_.lower_bound({size, 0});  // smallest block >= size, lowest address among equals
  if (fit == free_by_size_.end()) throw_out_of_memory(bytes, tag);
  size_t offset = fit->second;
  free_by_size_.erase(fit);
  auto it = blocks_.find(offset);
  size_t rest = it->second.size - size;
  if (rest > 0) insert_free(blocks_.emplace_hint(std::next(it), offset + size, Block{rest, true, {}}));
  it->second = Block{size, false, tag};
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  ++live_;
  return reinterpret_cast<void*>(base_ + offset);
}

void DeviceArena::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  LT_CHECK(p >= base_ && p < base_ + usable_, "free of {}: not a device pointer (the device arena is {:#x} .. +{})",
           ptr, base_, usable_);
  auto it = blocks_.find(p - base_);
  LT_CHECK(it != blocks_.end() && !it->second.free,
           "free of {}: not a live device allocation (freed twice, or a pointer into the middle of a block)", ptr);
  in_use_ -= it->second.size;
  --live_;
  it->second.free = true;
  it->second.tag.clear();
  // Merge with the free neighbours, so free blocks are never adjacent.
  if (auto next = std::next(it); next != blocks_.end() && next->second.free) {
    erase_free(next);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    if (auto prev = std::prev(it); prev->second.free) {
      erase_free(prev);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  insert_free(it);
}

bool DeviceArena::contains_live(const void* ptr, size_t bytes) const {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p < base_ || p >= base_ + usable_) return false;
  size_t offset = p - base_;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.upper_bound(offset);
  if (it == blocks_.begin()) return false;
  --it;
  return !it->second.free && bytes <= it->first + it->second.size - offset;
}

bool DeviceArena::in_range(const void* ptr) const {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  return p >= base_ && p < base_ + usable_;
}

DeviceMemoryStats DeviceArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceMemoryStats s;
  s.capacity = capacity_;
  s.in_use = in_use_;
  s.peak = peak_;
  s.allocations = live_;
  s.largest_free = largest_free_locked();
  return s;
}

void DeviceArena::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

std::vector<DeviceTagUsage> DeviceArena::usage_by_tag() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_by_tag_locked();
}

size_t DeviceArena::free_block_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_by_size_.size();
}

std::vector<DeviceTagUsage> DeviceArena::usage_by_tag_locked() const {
  std::map<std::string, DeviceTagUsage> by_tag;
  for (const auto& [offset, b] : blocks_) {
    if (b.free) continue;
    auto& u = by_tag[b.tag];
    u.tag = b.tag;
    u.bytes += b.size;
    ++u.blocks;
  }
  std::vector<DeviceTagUsage> out;
  out.reserve(by_tag.size());
  for (auto& [tag, u] : by_tag) out.push_back(std::move(u));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return out;
}

void DeviceArena::throw_out_of_memory(size_t bytes, const std::string& tag) const {
  // Called with mu_ held.
  size_t largest = largest_free_locked();
  size_t free_total = usable_ - in_use_;
  std::string why = bytes <= free_total
                        ? fmt::format("fragmented: {} free in {} blocks, the largest {}", format_bytes(free_total),
                                      free_by_size_.size(), format_bytes(largest))
                        : fmt::format("largest free block {}", format_bytes(largest));
  std::string users;
  auto usage = usage_by_tag_locked();
  for (size_t i = 0; i < usage.size() && i < 4; ++i)
    users += fmt::format("{}{} {}", i ? ", " : "; live: ", usage[i].tag.empty() ? "(untagged)" : usage[i].tag,
                         format_bytes(usage[i].bytes));
  if (usage.size() > 4) users += fmt::format(", and {} more tags", usage.size() - 4);
  LT_FAIL("device out of memory: cannot allocate {} ({} bytes) for '{}': {} ({} bytes) in use of a {} ({} bytes) "
          "budget, {}{}",
          format_bytes(bytes), bytes, tag, format_bytes(in_use_), in_use_, format_bytes(capacity_), capacity_, why,
          users);
}

void DeviceArena::check_copy(const char* what, const std::string& name, const void* device_ptr,
                             const char* device_side, const void* host_ptr, const char* host_side,
                             size_t bytes) const {
  if (bytes == 0) return;
  LT_CHECK(contains_live(device_ptr, bytes), "{} '{}': the {} {} .. +{} bytes is not inside one live device allocation",
           what, name, device_side, device_ptr, bytes);
  LT_CHECK(host_ptr != nullptr, "{} '{}': the host {} is null", what, name, host_side);
  LT_CHECK(!in_range(host_ptr), "{} '{}': the {} {} is device memory, not host memory", what, name, host_side,
           host_ptr);
}

}  // namespace lt
