// core/aligned.h — owning, aligned host buffers.
//
// Layer slabs are 4 KiB-aligned so one layer moves as one copy and O_DIRECT I/O can use them as is.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <utility>

#include "core/error.h"

namespace lt {

constexpr size_t kPageAlign = 4096;
constexpr size_t kHugePage = size_t(2) << 20;

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Whether a new buffer is zero-filled. Fill::none skips the pass (and, for large buffers, the page
// faults land where the data is first written) — for buffers that are fully written before being read.
enum class Fill : uint8_t { zero, none };

// A buffer of `count` T's aligned to `align` bytes, zero-filled unless Fill::none.
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count, size_t align = kPageAlign, Fill fill = Fill::zero) : count_(count) {
    size_t bytes = align_up(count * sizeof(T), align);
    if (bytes == 0) return;
    // Large buffers (slabs, states, gradients) go on transparent huge pages where the kernel offers them:
    // streaming passes over gigabytes then miss the TLB 512x less often.
    const bool huge = bytes >= kHugePage * 2;
    if (huge) {
      align = std::max(align, kHugePage);
      bytes = align_up(bytes, kHugePage);
    }
    void* p = std::aligned_alloc(align, bytes);
    LT_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP it changes nothing
    if (fill == Fill::zero) std::memset(p, 0, bytes);
    data_.reset(static_cast<T*>(p));
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + count_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + count_; }

 private:
  std::unique_ptr<T, FreeDeleter> data_;
  size_t count_ = 0;
};

// Gives the whole pages inside [p, p + bytes) back to the kernel and returns their bytes: they read as zeros when
// touched again, and are kept off transparent huge pages (khugepaged would otherwise refill a mostly released
// 2 MiB range). For memory this process no longer reads — a data-parallel rank's masters of other ranks' shards.
inline size_t release_pages(void* p, size_t bytes) {
  const uintptr_t b = align_up(reinterpret_cast<uintptr_t>(p), kPageAlign);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) / kPageAlign * kPageAlign;
  if (e <= b) return 0;
  void* at = reinterpret_cast<void*>(b);
  madvise(at, e - b, MADV_NOHUGEPAGE);  // advice: without THP it changes nothing
  LT_CHECK(madvise(at, e - b, MADV_DONTNEED) == 0, "release_pages: madvise(MADV_DONTNEED) of {} bytes failed: {}",
           e - b, std::strerror(errno));
  return e - b;
}

// Named buffers kept across calls (grow-only), so a loop of steps allocates and faults its pages once.
// Not thread-safe: one owner at a time.
class Workspace {
 public:
  // Told of each buffer once allocated and before it is freed (the executor pins its host buffers for a GPU's
  // copies: Device::pin_host).
  struct Hooks {
    std::function<void(uint8_t* data, size_t bytes, const std::string& name)> allocated;
    std::function<void(uint8_t* data)> freeing;
  };
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    if (hooks_.freeing)
      for (auto& [name, b] : buffers_) hooks_.freeing(b.data());
  }
  void set_hooks(Hooks hooks) { hooks_ = std::move(hooks); }

  // A buffer of at least `bytes`, 4 KiB-aligned; its contents are unspecified.
  uint8_t* get(const std::string& name, size_t bytes) {
    AlignedBuffer<uint8_t>& b = buffers_[name];
    if (b.size() < bytes) {
      if (hooks_.freeing && b.size() > 0) hooks_.freeing(b.data());
      b = AlignedBuffer<uint8_t>(bytes, kPageAlign, Fill::none);
      if (hooks_.allocated) hooks_.allocated(b.data(), b.size(), name);
    }
    return b.data();
  }
  template <typename T>
  T* get(const std::string& name, size_t count) {
    return reinterpret_cast<T*>(get(name, count * sizeof(T)));
  }
  size_t bytes() const {
    size_t n = 0;
    for (const auto& [name, b] : buffers_) n += b.size();
    return n;
  }

 private:
  std::map<std::string, AlignedBuffer<uint8_t>> buffers_;
  Hooks hooks_;
};

}  // namespace lt
