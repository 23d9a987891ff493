// exec/host_worker.h — a host thread running jobs in FIFO order: the executor's host lane (gradient
// accumulation into the f32 host gradients, later the optimizer), overlapped with the device's work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>
#include <string>
#include <thread>

#include "device/device.h"

namespace lt {

class HostWorker {
 public:
  // Jobs are reported to `sink` (may be null) on lane `lane` with times from `clock`.
  HostWorker(std::string lane, const Device* clock);
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  void set_sink(OpSink* sink);
  void submit(std::function<void()> job, std::string name, int layer = -1, size_t bytes = 0);
  // Waits until every submitted job has run; rethrows the first job error.
  void drain();
  // A job has failed since the last drain (later jobs are dropped unrun).
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  struct Job {
    std::function<void()> fn;
    std::string name;
    int layer;
    size_t bytes;
  };
  void run();

  std::string lane_;
  const Device* clock_;
  OpSink* sink_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

// Host staging slots, each free or busy, shared between a stream's host callbacks (which acquire a slot
// before a copy into it) and host jobs (which release it once they have consumed it).
//
// Nothing waits forever: acquire gives up (without the slot) once `releaser`, the worker whose jobs
// release the slots, has failed — it drops its later jobs, so their releases would never come; a job
// submitted after the slot was acquired can hold a release_guard instead of calling release, so the slot
// frees whether the job runs or is dropped; and abort() (the step failed) makes every acquire return at
// once, so callbacks and jobs blocked on slots finish and the device and workers can be drained.
class HostSlots {
 public:
  explicit HostSlots(int n) : busy_(size_t(n), false) {}
  void acquire(int i, const HostWorker* releaser = nullptr);
  void release(int i);
  void abort();
  // Releases slot i when the last copy of the returned handle is destroyed (capture it in the job).
  std::shared_ptr<void> release_guard(int i);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
  bool aborted_ = false;
};

}  // namespace lt
