// Helpers for the device tests: a watchdog so a hung test fails instead of hanging, a gate that holds a
// stream until the test opens it, a thread-safe OpSink, and seeded random bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "device/device.h"

namespace lt::testing {

// Ends the process with a message if not destroyed within `seconds` (ctest then reports the failure).
class Watchdog {
 public:
  Watchdog(double seconds, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done_; })) {
        std::fprintf(stderr, "\nWATCHDOG: '%s' still running after %.0f s; the device hangs. Exiting.\n",
                     what_.c_str(), seconds);
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Held shut, a launched Gate::pass() blocks its stream until open() (or `timeout_s`, so a test bug cannot hang).
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Returns false when it timed out.
  bool pass(double timeout_s = 5.0) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class RecordingSink : public OpSink {
 public:
  void record(const OpRecord& op) override {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.push_back(op);
  }
  std::vector<OpRecord> ops() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.clear();
  }
  std::vector<OpRecord> named(const std::string& name) const {
    std::vector<OpRecord> out;
    for (const auto& op : ops())
      if (op.name == name) out.push_back(op);
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<OpRecord> ops_;
};

// `n` bytes from a seeded generator (never all zero).
inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(rng.next_u64() >> 56) | uint8_t(i % 7 == 0);
  return out;
}

}  // namespace lt::testing
