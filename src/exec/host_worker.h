// exec/host_worker.h — a host thread running jobs in FIFO order: the executor's host lane (gradient
// accumulation into the f32 host gradients, later the optimizer), overlapped with the device's work.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
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
  std::thread thread_;
};

}  // namespace lt
