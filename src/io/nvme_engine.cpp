#include "io/nvme_engine.h"

#include <fmt/format.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "core/aligned.h"
#include "core/error.h"
#include "io/io_faults.h"

namespace lt::nvme_detail {
namespace {

bool transient(int err) { return err == EINTR || err == EAGAIN; }

// ---------------------------------------------------------------------------------------------------
// io_uring: callers prepare SQEs and submit under mu_; one completion thread reaps CQEs, continues short
// requests, tops the ring up from pending_ and reports finished requests. liburing allows one submitter
// and one reaper to work at once; mu_ serialises the submitters (callers and the reaper's top-ups).
class UringEngine final : public Engine {
 public:
  // The ring must be set up by init() (which may fail) before start(); ring_ is never copied or moved,
  // as liburing keeps pointers into its mappings.
  UringEngine(int fd, size_t depth, Completion completion)
      : fd_(fd), depth_(depth), completion_(std::move(completion)) {}

  // Returns "" when the ring works, or why not.
  std::string init();
  void start() {
    started_ = true;
    reaper_ = std::thread([this] { reap_loop(); });
  }

  ~UringEngine() override {
    if (!ring_ready_) return;
    if (!started_) {
      io_uring_queue_exit(&ring_);
      return;
    }
    {
      // A NOP with null user data tells the reaper to stop; nothing else is in flight by now.
      std::lock_guard<std::mutex> lock(mu_);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      while (sqe == nullptr) {  // cannot happen with an idle ring, but never lose the stop signal
        submit_locked();
        sqe = io_uring_get_sqe(&ring_);
      }
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      submit_locked();
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  void submit(const std::vector<Request*>& requests) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (Request* r : requests) pending_.push_back(r);
    pump_locked();
  }

 private:
  // Moves pending requests into the ring while fewer than depth_ are in flight, then submits.
  void pump_locked() {
    size_t prepared = 0;
    while (in_flight_ < depth_ && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Request* r = pending_.front();
      pending_.pop_front();
      char* buf = r->buf + r->done;
      unsigned len = unsigned(r->bytes - r->done);  // chunk_bytes is capped at 1 GiB by the store
      uint64_t off = r->offset + r->done;
      if (r->is_write)
        io_uring_prep_write(sqe, fd_, buf, len, off);
      else
        io_uring_prep_read(sqe, fd_, buf, len, off);
      io_uring_sqe_set_data(sqe, r);
      ++in_flight_;
      ++prepared;
    }
    if (prepared > 0) submit_locked();
  }

  // io_uring_submit fails only transiently here (EINTR; EAGAIN/EBUSY under memory or CQ pressure, which the
  // reaper relieves), because at most depth_ requests are in flight and the CQ holds twice that. The
  // prepared SQEs stay in the ring until a submit takes them, so retrying loses nothing.
  void submit_locked() {
    for (;;) {
      int r = io_uring_submit(&ring_);
      if (r >= 0 || (r != -EINTR && r != -EAGAIN && r != -EBUSY)) return;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void reap_loop() {
    std::vector<std::pair<Request*, int>> finished;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r < 0) {  // EINTR (a signal), or EAGAIN: nothing to report yet
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      bool stop = false;
      finished.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        unsigned head = 0, seen = 0;
        io_uring_for_each_cqe(&ring_, head, cqe) {
          ++seen;
          auto* req = static_cast<Request*>(io_uring_cqe_get_data(cqe));
          int res = cqe->res;
          if (req == nullptr) {
            stop = true;
            continue;
          }
          // The fault seam (io/io_faults.h): a completion with an error, as a failing drive returns one.
          if (const IoFault f = injected_io_fault(req->is_write ? IoOp::nvme_write : IoOp::nvme_read, ""); f.error)
            res = -f.error;
          --in_flight_;
          if (res < 0 && transient(-res)) {
            pending_.push_front(req);  // retry as is
          } else if (res < 0) {
            finished.emplace_back(req, -res);
          } else if (res == 0) {
            finished.emplace_back(req, 0);  // no progress: end of file
          } else {
            req->done += size_t(res);
            if (req->done < req->bytes)
              pending_.push_front(req);  // short: continue with the rest
            else
              finished.emplace_back(req, 0);
          }
        }
        io_uring_cq_advance(&ring_, seen);
        pump_locked();
      }
      for (auto& [req, err] : finished) completion_(req, err);
      if (stop) return;
    }
  }

  int fd_;
  size_t depth_;
  Completion completion_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool started_ = false;
  std::mutex mu_;                // guards the submission side of ring_, pending_, in_flight_
  std::deque<Request*> pending_;
  size_t in_flight_ = 0;
  std::thread reaper_;
};

// ---------------------------------------------------------------------------------------------------
// pread/pwrite: a fixed pool of workers, each running one request to its end.
class PoolEngine final : public Engine {
 public:
  PoolEngine(int fd, int threads, Completion completion) : fd_(fd), completion_(std::move(completion)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work_loop(); });
  }

  ~PoolEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void submit(const std::vector<Request*>& requests) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Request* r : requests) queue_.push_back(r);
    }
    cv_.notify_all();
  }

 private:
  void work_loop() {
    for (;;) {
      Request* r = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        r = queue_.front();
        queue_.pop_front();
      }
      int err = 0;
      while (r->done < r->bytes) {
        ssize_t n = r->is_write ? ::pwrite(fd_, r->buf + r->done, r->bytes - r->done, off_t(r->offset + r->done))
                                : ::pread(fd_, r->buf + r->done, r->bytes - r->done, off_t(r->offset + r->done));
        if (const IoFault f = injected_io_fault(r->is_write ? IoOp::nvme_write : IoOp::nvme_read, ""); f.error) {
          n = -1;  // the fault seam (io/io_faults.h)
          errno = f.error;
        }
        if (n < 0 && transient(errno)) continue;
        if (n < 0) {
          err = errno;
          break;
        }
        if (n == 0) break;  // no progress: end of file
        r->done += size_t(n);
      }
      completion_(r, err);
    }
  }

  int fd_;
  Completion completion_;
  std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<Request*> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

std::string UringEngine::init() {
  int r = io_uring_queue_init(unsigned(depth_), &ring_, 0);
  if (r < 0)
    return fmt::format("io_uring_queue_init failed: {} (errno {}){}", std::strerror(-r), -r,
                       -r == ENOSYS || -r == EPERM
                           ? "; io_uring is disabled here (seccomp in a container, or sysctl kernel.io_uring_disabled)"
                           : "");
  ring_ready_ = true;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  bool ops_ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                io_uring_opcode_supported(probe, IORING_OP_WRITE);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!ops_ok) return "the kernel's io_uring lacks IORING_OP_READ/WRITE (needs Linux 5.6 or later)";
  // One 4 KiB read at offset 0 through the ring, before any thread exists: a kernel or sandbox may set up a
  // ring and still refuse the operation. A read of 0 bytes (an empty adopted file) or EBADF (a write-only
  // adopted descriptor, which pread would meet too) shows the ring itself works.
  void* page = std::aligned_alloc(kPageAlign, kPageAlign);
  LT_CHECK(page != nullptr, "out of host memory allocating a 4096-byte page");
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  io_uring_prep_read(sqe, fd_, page, unsigned(kPageAlign), 0);
  int res = io_uring_submit(&ring_);
  if (res >= 0) {
    io_uring_cqe* cqe = nullptr;
    do res = io_uring_wait_cqe(&ring_, &cqe);
    while (res == -EINTR);
    if (res == 0) {
      res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
    }
  }
  std::free(page);
  if (res < 0 && res != -EBADF)
    return fmt::format("a 4 KiB read through io_uring failed: {} (errno {})", std::strerror(-res), -res);
  return "";
}

}  // namespace

std::unique_ptr<Engine> make_uring_engine(int fd, size_t queue_depth, Completion completion, std::string* why_not) {
  auto engine = std::make_unique<UringEngine>(fd, queue_depth, std::move(completion));
  *why_not = engine->init();
  if (!why_not->empty()) return nullptr;
  engine->start();
  return engine;
}

std::unique_ptr<Engine> make_pool_engine(int fd, int threads, Completion completion) {
  return std::make_unique<PoolEngine>(fd, threads, std::move(completion));
}

}  // namespace lt::nvme_detail
