// io/nvme_engine.h — internal to the NVMe tier (io/nvme.h): the two ways requests reach the file.
//
// A Request is one chunk of a transfer. The store hands requests to an Engine, which moves them on its
// own threads and reports each exactly once through the Completion callback, from one of those threads.
// Short transfers are continued (done < bytes is resubmitted for the rest), EINTR and EAGAIN retried;
// only a real error or a request that moves 0 bytes is reported as failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lt::nvme_detail {

struct Request {
  uint64_t ticket = 0;  // the transfer it belongs to
  bool is_write = false;
  uint64_t offset = 0;  // file offset of byte 0
  char* buf = nullptr;  // host memory of byte 0
  size_t bytes = 0;
  size_t done = 0;      // bytes moved so far
};

// err: 0 on success (done == bytes), an errno on failure, or 0 with done < bytes when a request moved
// no bytes (end of file). Called without the engine's locks held.
using Completion = std::function<void(Request* request, int err)>;

class Engine {
 public:
  virtual ~Engine() = default;  // the store destroys an engine only when nothing is in flight
  // Queues the requests; they start as soon as queue depth allows. Thread-safe. Ownership stays with the
  // caller, which must keep each request alive until its completion.
  virtual void submit(const std::vector<Request*>& requests) = 0;
};

// io_uring with `queue_depth` requests in flight and one completion thread. Returns null and sets
// *why_not (a sentence for the log) when io_uring cannot be used here.
std::unique_ptr<Engine> make_uring_engine(int fd, size_t queue_depth, Completion completion, std::string* why_not);

// pread/pwrite on `threads` worker threads, each running one request at a time.
std::unique_ptr<Engine> make_pool_engine(int fd, int threads, Completion completion);

}  // namespace lt::nvme_detail
