// core/scoped_setting.h — a process-wide value with a default that a test may replace for a scope: the budgets and
// limits launchers read (attention's dK/dV partial rows, the gated delta rule's backward rows, cuda-sim's per-block
// shared memory), so that a small test case takes the path a large one would.
#pragma once

#include <atomic>

namespace lt {

template <class T>
class ScopedSetting {
 public:
  explicit constexpr ScopedSetting(T initial) : value_(initial) {}
  T get() const { return value_.load(std::memory_order_relaxed); }

  // Within its lifetime (process-wide, not nested across threads) the setting is `value`; then what it was.
  class Override {
   public:
    Override(ScopedSetting& setting, T value) : setting_(setting), saved_(setting.value_.exchange(value)) {}
    ~Override() { setting_.value_.store(saved_); }
    Override(const Override&) = delete;
    Override& operator=(const Override&) = delete;

   private:
    ScopedSetting& setting_;
    T saved_;
  };

 private:
  std::atomic<T> value_;
};

}  // namespace lt
