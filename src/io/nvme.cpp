#include "io/nvme.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <unordered_map>

#include "core/aligned.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/nvme_engine.h"

namespace lt {

namespace nvme_detail {

// One transfer: its requests, how many are still out, and the first error.
struct Op {
  bool is_write = false;
  uint64_t region = 0;  // offset of the region it targets
  uint64_t offset = 0;
  size_t bytes = 0;  // rounded up to 4096
  size_t requests_left = 0;
  std::string error;  // "" while fine
  bool done = false;
  bool waited = false;  // a thread is in wait() for it
  std::vector<std::unique_ptr<Request>> requests;
};

struct OpTable {
  std::mutex mu;  // guards everything below; engine threads take it to report completions
  std::condition_variable cv;
  std::unordered_map<uint64_t, Op> ops;
  uint64_t next_ticket = 1;
  size_t active = 0;  // ops not done
};

}  // namespace nvme_detail

namespace {

using nvme_detail::Op;
using nvme_detail::OpTable;
using nvme_detail::Request;

std::string human_bytes(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.1f} GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt::format("{:.1f} MiB", b / double(1ull << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{} B", b);
}

std::string errno_text(int err) { return fmt::format("{} (errno {})", std::strerror(err), err); }

std::atomic<uint64_t> g_file_counter{0};

// Opens an unnamed file in dir: O_TMPFILE, else a unique name unlinked at once. Returns -1 and sets errno.
// *named tells which way it went.
int open_unnamed(const std::string& dir, int flags, bool* named) {
  *named = false;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | flags, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  // No O_TMPFILE here (older kernels, some network filesystems). A crash between open and unlink would
  // leave this file behind, so its name says what it is.
  std::string path = fmt::format("{}/lazytrain-nvme-{}-{}.spill", dir, ::getpid(), g_file_counter++);
  fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | flags, 0600);
  if (fd < 0) return fd;
  *named = true;
  if (::unlink(path.c_str()) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// A 4096-byte write and read at offset 0: some filesystems accept O_DIRECT at open and refuse the I/O.
int direct_io_error(int fd) {
  AlignedBuffer<uint8_t> page(kPageAlign);
  std::memset(page.data(), 0x5a, kPageAlign);
  if (::pwrite(fd, page.data(), kPageAlign, 0) != ssize_t(kPageAlign)) return errno != 0 ? errno : EIO;
  if (::pread(fd, page.data(), kPageAlign, 0) != ssize_t(kPageAlign)) return errno != 0 ? errno : EIO;
  return 0;
}

// "" when O_DIRECT with 4096-byte alignment suits this file, else why not. Filesystems that do not report
// their direct I/O alignment (statx STATX_DIOALIGN, Linux 6.1) leave the decision to direct_io_error.
std::string direct_alignment_problem(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 || (sx.stx_mask & STATX_DIOALIGN) == 0) return "";
  if (sx.stx_dio_mem_align == 0 || sx.stx_dio_offset_align == 0)
    return "the filesystem reports no direct I/O support for the file (statx)";
  if (sx.stx_dio_mem_align > kPageAlign || sx.stx_dio_offset_align > kPageAlign)
    return fmt::format("direct I/O there needs {}-byte aligned buffers and {}-byte aligned offsets (statx), "
                       "more than the store's 4096",
                       sx.stx_dio_mem_align, sx.stx_dio_offset_align);
#else
  (void)fd;
#endif
  return "";
}

void check_options(const NvmeOptions& o) {
  LT_CHECK(o.capacity_bytes > 0, "NVMe tier: capacity_bytes must be positive");
  LT_CHECK(o.queue_depth >= 1 && o.queue_depth <= 4096, "NVMe tier: queue_depth must be in 1..4096 (got {})",
           o.queue_depth);
  LT_CHECK(o.chunk_bytes >= kPageAlign && o.chunk_bytes % kPageAlign == 0 && o.chunk_bytes <= (size_t(1) << 30),
           "NVMe tier: chunk_bytes must be a multiple of 4096 between 4 KiB and 1 GiB (got {})", o.chunk_bytes);
  LT_CHECK(o.pread_threads >= 1 && o.pread_threads <= 64, "NVMe tier: pread_threads must be in 1..64 (got {})",
           o.pread_threads);
}

}  // namespace

const char* to_string(NvmeBackend backend) { return backend == NvmeBackend::io_uring ? "io_uring" : "pread"; }
const char* to_string(NvmeCaching caching) { return caching == NvmeCaching::direct ? "O_DIRECT" : "buffered"; }

std::string NvmeProbe::describe() const {
  return fmt::format("write {:.2f} GB/s, read {:.2f} GB/s ({})", write_gbps, read_gbps, human_bytes(double(bytes)));
}

void ensure_nvme_dir(const std::string& dir) {
  LT_CHECK(!dir.empty(), "NVMe tier: no directory configured for the scratch file");
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    LT_CHECK(S_ISDIR(st.st_mode), "NVMe tier: '{}' is not a directory (the scratch file goes inside it)", dir);
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    LT_FAIL("NVMe tier: directory '{}' for the scratch file does not exist and cannot be created: {} — "
            "configure another",
            dir, ec.message());
}

std::unique_ptr<NvmeStore> NvmeStore::open(const NvmeOptions& options) {
  check_options(options);
  const std::string& dir = options.dir;
  ensure_nvme_dir(dir);

  size_t capacity = align_up(options.capacity_bytes, kPageAlign);
  std::vector<std::string> fallbacks;
  NvmeCaching caching = options.caching;
  bool named = false;
  int fd = -1;
  if (caching == NvmeCaching::direct) {
    fd = open_unnamed(dir, O_DIRECT, &named);
    if (fd < 0 && errno == EINVAL) {
      fallbacks.push_back(fmt::format("buffered instead of O_DIRECT: the filesystem of {} refuses it (open: {}); "
                                      "spills go through the page cache and occupy host memory until written back",
                                      dir, errno_text(EINVAL)));
      caching = NvmeCaching::buffered;
    } else if (fd >= 0) {
      std::string why = direct_alignment_problem(fd);
      if (why.empty()) {
        int err = direct_io_error(fd);
        if (err != 0) why = fmt::format("O_DIRECT I/O fails there ({})", errno_text(err));
      }
      if (!why.empty()) {
        int flags = ::fcntl(fd, F_GETFL);
        if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) {
          int err = errno;
          ::close(fd);
          LT_FAIL("NVMe tier: cannot turn O_DIRECT off on the scratch file in {}: {}", dir, errno_text(err));
        }
        fallbacks.push_back(fmt::format("buffered instead of O_DIRECT on the filesystem of {}: {}; spills go "
                                        "through the page cache and occupy host memory until written back",
                                        dir, why));
        caching = NvmeCaching::buffered;
      }
    }
  }
  if (caching == NvmeCaching::buffered && fd < 0) fd = open_unnamed(dir, 0, &named);
  if (fd < 0) {
    int err = errno;
    LT_FAIL("NVMe tier: cannot create the scratch file in '{}': {}{}", dir, errno_text(err),
            err == EACCES || err == EPERM || err == EROFS ? " — the directory is not writable" : "");
  }

  // Reserve the space now, so a full disk fails here and not in the middle of a step.
  int r = ::fallocate(fd, 0, 0, off_t(capacity));
  if (r != 0 && errno == EINTR) r = ::fallocate(fd, 0, 0, off_t(capacity));
  if (r != 0) {
    int err = errno;
    if (err == EOPNOTSUPP) {
      fallbacks.push_back(fmt::format("space not reserved: the filesystem of {} has no fallocate, so a full disk "
                                      "shows up as ENOSPC on a write",
                                      dir));
      r = ::ftruncate(fd, off_t(capacity));
      err = errno;
    }
    if (r != 0) {
      ::close(fd);  // first, so the free space below does not count what the failed file held
      struct statvfs vfs {};
      std::string free_text = ::statvfs(dir.c_str(), &vfs) == 0
                                  ? fmt::format("{} bytes ({}) free", uint64_t(vfs.f_bavail) * vfs.f_frsize,
                                                human_bytes(double(vfs.f_bavail) * double(vfs.f_frsize)))
                                  : "free space unknown";
      LT_FAIL("NVMe tier: cannot reserve {} bytes ({}) for the scratch file in '{}': {}; {} there — free space "
              "or lower the NVMe capacity",
              capacity, human_bytes(double(capacity)), dir, errno_text(err), free_text);
    }
  }
  std::string name = named ? fmt::format("{} (unlinked file)", dir) : fmt::format("{} (unnamed file)", dir);
  try {
    auto store = build(fd, name, options, caching, std::move(fallbacks));
    store->dir_ = dir;
    return store;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::unique_ptr<NvmeStore> NvmeStore::adopt(int fd, const std::string& name, const NvmeOptions& options) {
  try {
    check_options(options);
    int flags = ::fcntl(fd, F_GETFL);
    LT_CHECK(flags >= 0, "NVMe tier: descriptor {} for '{}' is not open: {}", fd, name, errno_text(errno));
    NvmeCaching caching = (flags & O_DIRECT) != 0 ? NvmeCaching::direct : NvmeCaching::buffered;
    std::vector<std::string> fallbacks;
    if (caching != options.caching)
      fallbacks.push_back(fmt::format("{} instead of {}: the adopted descriptor was opened {} O_DIRECT",
                                      to_string(caching), to_string(options.caching),
                                      caching == NvmeCaching::direct ? "with" : "without"));
    auto store = build(fd, name, options, caching, std::move(fallbacks));
    store->dir_ = name;
    return store;
  } catch (...) {
    if (fd >= 0) ::close(fd);  // taken over even when adopting fails
    throw;
  }
}

std::unique_ptr<NvmeStore> NvmeStore::build(int fd, const std::string& name, const NvmeOptions& options,
                                            NvmeCaching caching, std::vector<std::string> fallbacks) {
  std::unique_ptr<NvmeStore> s(new NvmeStore());
  s->name_ = name;
  s->capacity_ = align_up(options.capacity_bytes, kPageAlign);
  s->queue_depth_ = options.queue_depth;
  s->chunk_bytes_ = options.chunk_bytes;
  s->caching_ = caching;
  s->fallbacks_ = std::move(fallbacks);
  s->free_[0] = s->capacity_;
  s->ops_ = std::make_unique<OpTable>();
  NvmeStore* self = s.get();
  auto completion = [self](Request* r, int err) { self->on_request_done(r, err); };
  if (options.backend == NvmeBackend::io_uring) {
    std::string why_not;
    s->engine_ = nvme_detail::make_uring_engine(fd, options.queue_depth, completion, &why_not);
    if (s->engine_ != nullptr)
      s->backend_ = NvmeBackend::io_uring;
    else
      s->fallbacks_.push_back("pread instead of io_uring: " + why_not);
  }
  if (s->engine_ == nullptr) {
    s->engine_ = nvme_detail::make_pool_engine(fd, options.pread_threads, completion);
    s->backend_ = NvmeBackend::pread;
  }
  s->fd_ = fd;  // owned from here on: the destructor closes it
  return s;
}

NvmeStore::~NvmeStore() {
  if (ops_ != nullptr) {
    std::unique_lock<std::mutex> lock(ops_->mu);
    ops_->cv.wait(lock, [this] { return ops_->active == 0; });
  }
  engine_.reset();
  if (fd_ >= 0) ::close(fd_);
}

std::string NvmeStore::describe() const {
  std::string s = fmt::format("{}, {}, {}: {} reserved", to_string(backend_), to_string(caching_), name_,
                              human_bytes(double(capacity_)));
  if (backend_ == NvmeBackend::io_uring)
    s += fmt::format(", up to {} requests of {} in flight", queue_depth_, human_bytes(double(chunk_bytes_)));
  else
    s += fmt::format(", requests of {}", human_bytes(double(chunk_bytes_)));
  for (const std::string& f : fallbacks_) s += "; " + f;
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Space

uint64_t NvmeStore::alloc(size_t bytes, const std::string& tag) {
  LT_CHECK(bytes > 0, "NVMe tier: cannot allocate 0 bytes for '{}'", tag);
  size_t need = align_up(bytes, kPageAlign);
  std::lock_guard<std::mutex> lock(space_mu_);
  // Best fit: the smallest hole that holds it, so large holes stay whole for large boundaries.
  auto best = free_.end();
  size_t free_total = 0, largest = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    free_total += it->second;
    largest = std::max(largest, it->second);
    if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end())
    LT_FAIL("NVMe tier full: cannot allocate {} bytes ({}) for '{}': capacity {} bytes ({}), {} bytes in use in {} "
            "regions, {} bytes free, largest free hole {} bytes — raise the NVMe capacity or spill less",
            need, human_bytes(double(need)), tag, capacity_, human_bytes(double(capacity_)), capacity_ - free_total,
            used_.size(), free_total, largest);
  uint64_t offset = best->first;
  size_t hole = best->second;
  free_.erase(best);
  if (hole > need) free_[offset + need] = hole - need;
  used_[offset] = Region{need, tag};
  return offset;
}

void NvmeStore::free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(space_mu_);
  auto it = used_.find(offset);
  LT_CHECK(it != used_.end(), "NVMe tier: free of offset {}, which is not the start of an allocated region", offset);
  LT_CHECK(it->second.busy == 0,
           "NVMe tier: free of region '{}' at offset {} while {} transfer(s) to it are in flight; wait for their "
           "tickets first",
           it->second.tag, offset, it->second.busy);
  size_t bytes = it->second.bytes;
  used_.erase(it);
  auto [hole, inserted] = free_.emplace(offset, bytes);
  auto next = std::next(hole);
  if (next != free_.end() && hole->first + hole->second == next->first) {
    hole->second += next->second;
    free_.erase(next);
  }
  if (hole != free_.begin()) {
    auto prev = std::prev(hole);
    if (prev->first + prev->second == hole->first) {
      prev->second += hole->second;
      free_.erase(hole);
    }
  }
}

size_t NvmeStore::used_bytes() const {
  std::lock_guard<std::mutex> lock(space_mu_);
  size_t n = 0;
  for (const auto& [off, r] : used_) n += r.bytes;
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Transfers

uint64_t NvmeStore::begin_transfer(const char* what, uint64_t offset, const void* buf, size_t bytes) {
  LT_CHECK(bytes > 0, "NVMe {} of 0 bytes at offset {}", what, offset);
  LT_CHECK(reinterpret_cast<uintptr_t>(buf) % kPageAlign == 0,
           "NVMe {} of {} bytes at offset {}: host buffer {} is not 4096-byte aligned (O_DIRECT needs page-aligned "
           "buffers; allocate them with lt::AlignedBuffer)",
           what, bytes, offset, buf);
  LT_CHECK(offset % kPageAlign == 0, "NVMe {} of {} bytes: file offset {} is not a multiple of 4096", what, bytes,
           offset);
  size_t rounded = align_up(bytes, kPageAlign);
  std::lock_guard<std::mutex> lock(space_mu_);
  auto it = used_.upper_bound(offset);
  bool inside = it != used_.begin() && offset + rounded <= std::prev(it)->first + std::prev(it)->second.bytes;
  if (!inside) {
    if (it == used_.begin())
      LT_FAIL("NVMe {} of {} bytes ({} rounded up to 4096) at offset {}: no allocated region there", what, bytes,
              rounded, offset);
    auto r = std::prev(it);
    LT_FAIL("NVMe {} of {} bytes ({} rounded up to 4096) at offset {}: does not fit the allocated region '{}' "
            "[{}, {})",
            what, bytes, rounded, offset, r->second.tag, r->first, r->first + r->second.bytes);
  }
  auto region = std::prev(it);
  ++region->second.busy;
  return region->first;
}

void NvmeStore::end_transfer(uint64_t region) {
  std::lock_guard<std::mutex> lock(space_mu_);
  --used_.at(region).busy;
}

NvmeTicket NvmeStore::write(uint64_t offset, const void* buf, size_t bytes) {
  uint64_t region = begin_transfer("write", offset, buf, bytes);
  return submit(true, region, offset, const_cast<void*>(buf), bytes);  // the engine only reads from it
}

NvmeTicket NvmeStore::read(uint64_t offset, void* buf, size_t bytes) {
  uint64_t region = begin_transfer("read", offset, buf, bytes);
  return submit(false, region, offset, buf, bytes);
}

NvmeTicket NvmeStore::submit(bool is_write, uint64_t region, uint64_t offset, void* buf, size_t bytes) {
  size_t rounded = align_up(bytes, kPageAlign);
  std::vector<Request*> requests;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(ops_->mu);
    ticket = ops_->next_ticket++;
    Op& op = ops_->ops[ticket];
    op.is_write = is_write;
    op.region = region;
    op.offset = offset;
    op.bytes = rounded;
    for (size_t at = 0; at < rounded; at += chunk_bytes_) {
      auto r = std::make_unique<Request>();
      r->ticket = ticket;
      r->is_write = is_write;
      r->offset = offset + at;
      r->buf = static_cast<char*>(buf) + at;
      r->bytes = std::min(chunk_bytes_, rounded - at);
      requests.push_back(r.get());
      op.requests.push_back(std::move(r));
    }
    op.requests_left = requests.size();
    ++ops_->active;
  }
  engine_->submit(requests);
  return NvmeTicket{ticket};
}

void NvmeStore::on_request_done(Request* r, int err) {
  std::lock_guard<std::mutex> lock(ops_->mu);
  Op& op = ops_->ops.at(r->ticket);
  if ((err != 0 || r->done < r->bytes) && op.error.empty()) {
    const char* what = op.is_write ? "write" : "read";
    std::string cause = err != 0 ? errno_text(err)
                                 : fmt::format("short {}: {} of {} bytes moved, then 0 (end of file?)", what,
                                               r->done, r->bytes);
    op.error = fmt::format("NVMe {} failed: {} bytes at offset {} (part of a {} of {} bytes at offset {}) on {} "
                           "[{}, {}]: {}",
                           what, r->bytes, r->offset, what, op.bytes, op.offset, name_, to_string(backend_),
                           to_string(caching_), cause);
  }
  if (--op.requests_left == 0) {
    end_transfer(op.region);  // lock order: ops, then space; nothing takes them the other way round
    op.done = true;
    op.requests.clear();
    --ops_->active;
    ops_->cv.notify_all();
  }
}

bool NvmeStore::ready(NvmeTicket ticket) const {
  std::lock_guard<std::mutex> lock(ops_->mu);
  auto it = ops_->ops.find(ticket.id);
  LT_CHECK(it != ops_->ops.end(), "NVMe tier: ticket {} is unknown or was already waited for", ticket.id);
  return it->second.done;
}

void NvmeStore::wait(NvmeTicket ticket) {
  std::string error;
  {
    std::unique_lock<std::mutex> lock(ops_->mu);
    auto it = ops_->ops.find(ticket.id);
    LT_CHECK(it != ops_->ops.end(), "NVMe tier: ticket {} is unknown or was already waited for", ticket.id);
    Op& op = it->second;  // references survive rehashing by other submitters; iterators would not
    LT_CHECK(!op.waited, "NVMe tier: ticket {} is already being waited for by another thread", ticket.id);
    op.waited = true;
    ops_->cv.wait(lock, [&] { return op.done; });
    error = std::move(op.error);
    ops_->ops.erase(ticket.id);
  }
  if (!error.empty()) LT_FAIL("{}", error);
}

NvmeProbe NvmeStore::probe(size_t bytes) {
  size_t n = align_up(bytes, kPageAlign);
  uint64_t offset = alloc(n, "bandwidth probe");
  struct Release {
    NvmeStore* s;
    uint64_t off;
    ~Release() { s->free(off); }
  } release{this, offset};

  AlignedBuffer<uint64_t> out(n / 8), back(n / 8);
  Rng rng(0x6e766d65);  // "nvme"
  for (uint64_t& x : out) x = rng.next_u64();

  NvmeProbe p;
  p.bytes = n;
  Timer t;
  wait(write(offset, out.data(), n));
  LT_CHECK(::fdatasync(fd_) == 0, "NVMe tier: fdatasync on {} failed: {}", name_, errno_text(errno));
  p.write_seconds = t.seconds();
  // Without this, a buffered read would come from the page cache and measure memory, not the disk.
  if (caching_ == NvmeCaching::buffered) ::posix_fadvise(fd_, off_t(offset), off_t(n), POSIX_FADV_DONTNEED);
  t.reset();
  wait(read(offset, back.data(), n));
  p.read_seconds = t.seconds();
  LT_CHECK(std::memcmp(out.data(), back.data(), n) == 0,
           "NVMe tier: bandwidth probe on {} read back different bytes than it wrote", name_);
  p.write_gbps = double(n) / p.write_seconds / 1e9;
  p.read_gbps = double(n) / p.read_seconds / 1e9;
  return p;
}

}  // namespace lt
