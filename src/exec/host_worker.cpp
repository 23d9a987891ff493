#include "exec/host_worker.h"


namespace lt {

HostWorker::HostWorker(std::string lane, const Device* clock)
    : lane_(std::move(lane)), clock_(clock), thread_([this] { run(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostWorker::set_sink(OpSink* sink) {
  std::lock_guard<std::mutex> lock(mutex_);
  sink_ = sink;
}

void HostWorker::submit(std::function<void()> job, std::string name, int layer, size_t bytes,
                        std::vector<std::shared_future<void>> after) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(job), std::move(name), layer, bytes, std::move(after)});
  }
  cv_.notify_one();
}

void HostWorker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    failed_.store(false, std::memory_order_release);
    std::rethrow_exception(e);
  }
}

void HostWorker::run() {
  for (;;) {
    Job job;
    OpSink* sink;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      sink = sink_;
    }
    std::exception_ptr err;
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      skip = error_ != nullptr;  // after a failure, later jobs are dropped until drain() reports it
    }
    if (!skip) {
      try {
        for (const std::shared_future<void>& f : job.after) f.get();
      } catch (...) {
        err = std::current_exception();
      }
    }
    job.after.clear();
    double start = clock_->now();
    if (!skip && !err) {
      try {
        job.fn();
      } catch (...) {
        err = std::current_exception();
      }
    }
    // Destroy the job (and whatever it captured — a slot's release guard) before drain() can return: the
    // captures may point into an object that the drainer frees next.
    job.fn = nullptr;
    if (sink) sink->record(OpRecord{job.name, lane_, start, clock_->now(), job.bytes, job.layer, {}});
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (err && !error_) {
        error_ = err;
        failed_.store(true, std::memory_order_release);
      }
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace lt
