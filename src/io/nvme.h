// io/nvme.h — the NVMe tier: a scratch file the streaming executor spills activations to (layer
// boundaries, tens of MB each) when device and host memory are full.
//
// One NvmeStore is one preallocated scratch file under a configured directory. The executor carves it
// into regions (alloc/free) and moves page-aligned host buffers in and out asynchronously: write/read
// return a ticket at once, wait(ticket) blocks and rethrows the I/O error, if any. A transfer is cut into
// chunk_bytes requests kept in flight up to queue_depth, so one 40 MB boundary reaches the device's
// bandwidth, and several transfers can be in flight together while the caller computes.
//
// The path in use is chosen at open() and said by describe() for the log; fallbacks() says why a
// preferred path was not taken:
//   backend  io_uring (liburing) when io_uring_queue_init succeeds, the kernel supports IORING_OP_READ/
//            WRITE and a 4 KiB read through the ring works; otherwise pread/pwrite on a small pool of
//            threads. Containers often forbid io_uring (ENOSYS, EPERM; or kernel.io_uring_disabled).
//   caching  O_DIRECT when the filesystem accepts it (ext4, xfs, btrfs; tmpfs since Linux 6.6), needs no
//            more than 4096-byte alignment (statx STATX_DIOALIGN, where reported) and a 4 KiB write and read
//            with it succeed; otherwise buffered I/O through the page cache (ramfs, older tmpfs, some
//            network and FUSE filesystems). Buffered spills occupy host memory — the very thing
//            the tier exists to relieve — until the kernel writes them back, so the log must say so.
//
// The file has no name while in use: it is created with O_TMPFILE or, where the filesystem lacks that,
// under a unique name unlinked right after open. Its space belongs to the open descriptor alone and is
// returned when that closes — at destruction, during exception unwinding, and also when the process is
// killed (SIGKILL, the OOM killer), so no stale spill file outlives a run. (While it runs, `ls` shows
// nothing; the file appears in /proc/<pid>/fd as "<dir>/#<inode> (deleted)" and its space in `df`.)
// Space is reserved up front with fallocate, so a full disk fails at open() with ENOSPC naming the
// directory, the bytes requested and the bytes free, not in the middle of a step.
//
// Alignment: O_DIRECT needs the host address, file offset and length to be multiples of the logical block
// size. The store uses 4096 (lt::kPageAlign) for all three, in buffered mode too, so code tested on a
// filesystem without O_DIRECT does not start failing on a disk. A transfer of `bytes` moves
// align_up(bytes, 4096) bytes: the host buffer and the region must hold that many (lt::AlignedBuffer and
// alloc() round up already).
//
// Measured (tests/io/test_nvme.cpp NvmeBandwidth.AllPaths, 1 GiB, ext4 on a virtio disk, 2-core VM, noisy):
// O_DIRECT 2.3-3.3 GB/s write and 2.2-2.9 GB/s read with io_uring or pread alike; buffered 0.13-0.26 GB/s
// write (fdatasync included: page-cache writeback is the bottleneck) and 0.55-1.7 GB/s read after dropping
// the pages.
//
// Threads: every member function is thread-safe. Requests progress on the store's own threads (the
// io_uring completion thread, or the pread pool), not in wait(), so an "nvme" lane thread can issue
// transfers, go on with other work and wait later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lt {

namespace nvme_detail {
class Engine;
struct Request;
struct OpTable;
}  // namespace nvme_detail

enum class NvmeBackend { io_uring, pread };  // how requests reach the file
enum class NvmeCaching { direct, buffered };  // O_DIRECT, or through the page cache

const char* to_string(NvmeBackend backend);  // "io_uring", "pread"
const char* to_string(NvmeCaching caching);  // "O_DIRECT", "buffered"

// Creates `dir` and its parents when missing, as output_dir is; throws lt::Error naming the directory
// and why it cannot be created (a file in the way, permissions, a read-only filesystem).
void ensure_nvme_dir(const std::string& dir);

struct NvmeOptions {
  std::string dir;                               // directory for the scratch file; must exist and be writable
  size_t capacity_bytes = 0;                     // reserved at open(); rounded up to 4096
  NvmeBackend backend = NvmeBackend::io_uring;   // preferred; io_uring falls back to pread where unavailable
  NvmeCaching caching = NvmeCaching::direct;     // preferred; direct falls back to buffered where refused
  size_t queue_depth = 32;                       // requests in flight per store (io_uring ring size), 1..4096
  size_t chunk_bytes = size_t(1) << 20;          // one request's size; a multiple of 4096
  int pread_threads = 4;                         // worker threads of the pread backend, 1..64
};

// Names one transfer until it is waited for. Each ticket must be waited for exactly once (that is where
// its error surfaces); tickets never waited for are dropped when the store is destroyed.
struct NvmeTicket {
  uint64_t id = 0;  // 0: no transfer
};

// Bandwidth measured through the store's own path (backend, caching, chunking, queue depth).
struct NvmeProbe {
  size_t bytes = 0;          // written, then read back
  double write_seconds = 0;  // submission to completion, plus the fdatasync that makes it durable
  double read_seconds = 0;   // after the written pages were dropped from the page cache (buffered mode)
  double write_gbps = 0;     // bytes / seconds / 1e9
  double read_gbps = 0;
  std::string describe() const;  // "write 2.10 GB/s, read 3.05 GB/s (256.0 MiB)"
};

class NvmeStore {
 public:
  // Creates the directory if missing, then creates and reserves the scratch file; throws lt::Error naming
  // the directory and the cause (cannot be created, not a directory, not writable, ENOSPC with bytes requested and free, invalid options).
  static std::unique_ptr<NvmeStore> open(const NvmeOptions& options);
  // Takes over an already-open descriptor (closed at destruction, or at once if this throws) and uses
  // [0, capacity_bytes) of it as is: no creation, no unlinking, no preallocation, caching as the
  // descriptor was opened. `name` labels it in messages. For a dedicated partition or a pre-made file,
  // and for tests that need a descriptor whose I/O fails for real (a read-only descriptor's writes fail
  // with EBADF; a file on a full filesystem, not preallocated, fails with ENOSPC).
  static std::unique_ptr<NvmeStore> adopt(int fd, const std::string& name, const NvmeOptions& options);

  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;
  // Waits for every transfer still in flight (their errors are dropped: a destructor cannot throw), then
  // closes the descriptor, which frees the file's space.
  ~NvmeStore();

  NvmeBackend backend() const { return backend_; }
  NvmeCaching caching() const { return caching_; }
  const std::vector<std::string>& fallbacks() const { return fallbacks_; }  // why a preferred path was not used
  // One line for the log: "io_uring, O_DIRECT, /scratch: 4.0 GiB reserved, up to 32 requests of 1.0 MiB
  // in flight", followed by the fallbacks.
  std::string describe() const;
  const std::string& dir() const { return dir_; }

  // Space. Regions are 4096-aligned, sizes rounded up to 4096; `tag` ("boundary 12") names a region in
  // errors. alloc throws when no hole is large enough, with capacity, use and the largest hole.
  uint64_t alloc(size_t bytes, const std::string& tag);
  // offset must be one alloc returned. Throws while a transfer to the region is in flight (freeing it
  // then would let a new owner's data race the old transfer): finish with wait() first.
  void free(uint64_t offset);
  size_t capacity() const { return capacity_; }
  size_t used_bytes() const;

  // Asynchronous transfers between a host buffer and [offset, offset + align_up(bytes, 4096)), which must
  // lie inside one allocated region. buf must be 4096-aligned and hold align_up(bytes, 4096) bytes, and
  // must stay valid and untouched (read: unread) until wait() returns. Argument errors throw here;
  // I/O errors surface in wait().
  NvmeTicket write(uint64_t offset, const void* buf, size_t bytes);
  NvmeTicket read(uint64_t offset, void* buf, size_t bytes);
  bool ready(NvmeTicket ticket) const;  // true when wait() would not block
  // Blocks until the transfer ends and releases the ticket (one thread per ticket). Throws lt::Error
  // naming the operation, the failed request's offset and length, the whole transfer, the file and
  // strerror (EIO, ENOSPC, EBADF...), or the short transfer (a request that moved 0 bytes: end of file).
  // A failed transfer leaves the store usable.
  void wait(NvmeTicket ticket);

  // Writes `bytes` (rounded up to 4096) of random data through this same path, fdatasyncs, drops them
  // from the page cache, reads them back and checks them; needs that much free space in the store.
  NvmeProbe probe(size_t bytes);

 private:
  struct Region {
    size_t bytes;
    std::string tag;
    int busy = 0;  // transfers in flight to it: free() refuses while > 0
  };

  NvmeStore() = default;
  static std::unique_ptr<NvmeStore> build(int fd, const std::string& name, const NvmeOptions& options,
                                          NvmeCaching caching, std::vector<std::string> fallbacks);
  NvmeTicket submit(bool is_write, uint64_t region, uint64_t offset, void* buf, size_t bytes);
  // Validates a transfer and marks its region busy; returns the region's offset.
  uint64_t begin_transfer(const char* what, uint64_t offset, const void* buf, size_t bytes);
  void end_transfer(uint64_t region);
  void on_request_done(nvme_detail::Request* request, int err);

  std::string dir_;
  std::string name_;  // the file (or adopted descriptor) as messages name it
  int fd_ = -1;
  size_t capacity_ = 0;
  size_t queue_depth_ = 0;
  size_t chunk_bytes_ = 0;
  NvmeBackend backend_ = NvmeBackend::pread;
  NvmeCaching caching_ = NvmeCaching::buffered;
  std::vector<std::string> fallbacks_;

  mutable std::mutex space_mu_;        // guards free_ and used_
  std::map<uint64_t, size_t> free_;    // offset -> bytes, coalesced
  std::map<uint64_t, Region> used_;    // offset -> region

  std::unique_ptr<nvme_detail::OpTable> ops_;     // tickets and their progress (engine threads complete into it)
  std::unique_ptr<nvme_detail::Engine> engine_;  // destroyed before fd_ is closed
};

}  // namespace lt
