// exec/host_worker.h — a host thread running jobs in FIFO order: the executor's host lanes (gradient accumulation
// into the f32 host gradients, the optimizer's update, NVMe I/O), overlapped with the device's work. A job may wait
// for other lanes' work first (the step schedule's deps) without that wait counting as its time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
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
  // `after`: what the job waits for before it starts (its recorded time starts after them); one that fails (its
  // promise broken or given an exception) fails the job.
  void submit(std::function<void()> job, std::string name, int layer = -1, size_t bytes = 0,
              std::vector<std::shared_future<void>> after = {});
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
    std::vector<std::shared_future<void>> after;
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

}  // namespace lt
