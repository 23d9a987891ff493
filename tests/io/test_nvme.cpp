// Tests for io/nvme.h, the NVMe tier: round trips of seeded random data through every path (io_uring and
// pread, O_DIRECT and buffered), the fallbacks and what describe() says about them, every user error,
// real I/O errors surfacing through wait() (ENOSPC on a full tmpfs, EBADF on a read-only descriptor),
// the scratch file vanishing with the store, and the bandwidth probe.
//
// Tests that need to mount a filesystem (ramfs refuses O_DIRECT; a 1 MiB tmpfs runs out of space; a
// read-only tmpfs is unwritable even for root) skip with the reason where mount(2) is not permitted.
// NvmeBandwidth.AllPaths prints each path's measured bandwidth; LT_NVME_PROBE_MB (default 16) and
// LT_NVME_DIR (default the test temp dir) size and place it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/nvme.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using testing::expect_error;

namespace fs = std::filesystem;
constexpr size_t MiB = size_t(1) << 20;

// Runs f, expects lt::Error, and checks that its message contains every needle.
// align_up(bytes, 4096) bytes of seeded random data; never all zeros.
AlignedBuffer<uint8_t> random_buffer(size_t bytes, uint64_t seed) {
  AlignedBuffer<uint8_t> b(align_up(bytes, kPageAlign));
  Rng rng(seed);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t x = rng.next_u64() | 1;  // an odd word: no all-zero page
    std::memcpy(b.data() + i, &x, 8);
  }
  return b;
}

bool same_bytes(const AlignedBuffer<uint8_t>& a, const AlignedBuffer<uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// Open descriptors of this process whose target lies in dir (an unnamed file shows as "<dir>/#123 (deleted)").
int fds_into(const fs::path& dir) {
  int n = 0;
  std::string prefix = dir.string() + "/";
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    fs::path target = fs::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

size_t bytes_free(const fs::path& dir) {
  struct statvfs v {};
  EXPECT_EQ(::statvfs(dir.c_str(), &v), 0);
  return size_t(v.f_bavail) * v.f_frsize;
}

// A filesystem mounted for one test (needs CAP_SYS_ADMIN); unmounted and removed at scope exit.
class ScopedMount {
 public:
  ScopedMount(fs::path where, const char* type, unsigned long flags, const char* data) : where_(std::move(where)) {
    fs::create_directories(where_);
    ok_ = ::mount(type, where_.c_str(), type, flags, data) == 0;
    if (!ok_) why_ = std::string("mount -t ") + type + " not permitted here: " + std::strerror(errno);
  }
  ~ScopedMount() {
    if (ok_) ::umount2(where_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove(where_, ec);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const fs::path& path() const { return where_; }

 private:
  fs::path where_;
  bool ok_ = false;
  std::string why_;
};

class Nvme : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(t->test_suite_name()) + "_" + t->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = fs::path(::testing::TempDir()) / ("lt_nvme_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  NvmeOptions options(size_t capacity, NvmeBackend backend = NvmeBackend::io_uring,
                      NvmeCaching caching = NvmeCaching::direct) const {
    NvmeOptions o;
    o.dir = dir_.string();
    o.capacity_bytes = capacity;
    o.backend = backend;
    o.caching = caching;
    return o;
  }
  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------
// Round trips through every path

struct PathCase {
  NvmeBackend backend;
  NvmeCaching caching;
};
void PrintTo(const PathCase& c, std::ostream* os) { *os << to_string(c.backend) << ", " << to_string(c.caching); }

class NvmeRoundTrip : public Nvme, public ::testing::WithParamInterface<PathCase> {};

TEST_P(NvmeRoundTrip, OddSizesManyInFlightInterleaved) {
  NvmeOptions o = options(32 * MiB, GetParam().backend, GetParam().caching);
  o.chunk_bytes = 64 * 1024;  // small requests, so one transfer is many requests and the queue fills
  o.queue_depth = 8;
  auto store = NvmeStore::open(o);
  std::cout << "[ path     ] " << store->describe() << "\n";
  if (GetParam().backend == NvmeBackend::io_uring && store->backend() != NvmeBackend::io_uring) {
    GTEST_SKIP() << "io_uring unavailable here: " << store->describe();
  }
  if (GetParam().caching == NvmeCaching::buffered) {
    EXPECT_EQ(store->caching(), NvmeCaching::buffered);
  }
  EXPECT_EQ(store->backend(), GetParam().backend);

  const std::vector<size_t> sizes = {1, 4095, 4097, 12345, 65537, MiB + 333, 3 * MiB + 7, 5 * MiB - 1};
  const uint64_t seed = 1000;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<uint64_t> offsets;
  std::vector<AlignedBuffer<uint8_t>> first, second, back;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets.push_back(store->alloc(sizes[i], "region " + std::to_string(i)));
    first.push_back(random_buffer(sizes[i], seed + i));
    second.push_back(random_buffer(sizes[i], seed + 100 + i));
    back.emplace_back(align_up(sizes[i], kPageAlign));
  }
  // Every region written at once: 8 transfers, ~160 requests, 8 in flight.
  std::vector<NvmeTicket> tickets;
  for (size_t i = 0; i < sizes.size(); ++i) tickets.push_back(store->write(offsets[i], first[i].data(), sizes[i]));
  for (NvmeTicket t : tickets) store->wait(t);

  // Interleaved: read the even regions while overwriting the odd ones; wait in reverse order.
  tickets.clear();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i % 2 == 0)
      tickets.push_back(store->read(offsets[i], back[i].data(), sizes[i]));
    else
      tickets.push_back(store->write(offsets[i], second[i].data(), sizes[i]));
  }
  for (size_t k = tickets.size(); k-- > 0;) store->wait(tickets[k]);
  for (size_t i = 0; i < sizes.size(); i += 2) EXPECT_TRUE(same_bytes(back[i], first[i])) << "region " << i;

  // The odd regions hold the second data; poll ready() before waiting.
  tickets.clear();
  for (size_t i = 1; i < sizes.size(); i += 2) tickets.push_back(store->read(offsets[i], back[i].data(), sizes[i]));
  for (NvmeTicket t : tickets) {
    while (!store->ready(t)) std::this_thread::yield();
    store->wait(t);
  }
  for (size_t i = 1; i < sizes.size(); i += 2) EXPECT_TRUE(same_bytes(back[i], second[i])) << "region " << i;
}

INSTANTIATE_TEST_SUITE_P(AllPaths, NvmeRoundTrip,
                         ::testing::Values(PathCase{NvmeBackend::io_uring, NvmeCaching::direct},
                                           PathCase{NvmeBackend::io_uring, NvmeCaching::buffered},
                                           PathCase{NvmeBackend::pread, NvmeCaching::direct},
                                           PathCase{NvmeBackend::pread, NvmeCaching::buffered}),
                         [](const auto& info) {
                           return std::string(info.param.backend == NvmeBackend::io_uring ? "io_uring" : "pread") +
                                  (info.param.caching == NvmeCaching::direct ? "_direct" : "_buffered");
                         });

TEST_F(Nvme, ThreadsShareOneStore) {
  auto store = NvmeStore::open(options(16 * MiB));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint64_t off = store->alloc(MiB + 4096 * t + 1, "thread " + std::to_string(t));
      for (int round = 0; round < 10; ++round) {
        size_t n = MiB + 4096 * t + 1;
        auto out = random_buffer(n, 7000 + 100 * t + round);
        AlignedBuffer<uint8_t> in(align_up(n, kPageAlign));
        store->wait(store->write(off, out.data(), n));
        store->wait(store->read(off, in.data(), n));
        if (!same_bytes(out, in)) ++mismatches[t];
      }
      store->free(off);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_EQ(store->used_bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------------
// Fallbacks

// io_uring forbidden the way container runtimes forbid it (a seccomp filter answering ENOSYS), in a forked
// child: the store must fall back to pread, say why, and still move data.
TEST_F(Nvme, IoUringForbiddenFallsBackToPreadAndSaysWhy) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  NvmeOptions o = options(4 * MiB);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    auto say = [&](const std::string& text, int code) {
      ssize_t unused = ::write(pipe_fds[1], text.data(), text.size());
      (void)unused;
      ::_exit(code);
    };
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{(unsigned short)(sizeof(filter) / sizeof(filter[0])), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      say(std::string("seccomp not available: ") + std::strerror(errno), 4);
    try {
      auto store = NvmeStore::open(o);
      uint64_t off = store->alloc(MiB + 1, "h");
      auto out = random_buffer(MiB + 1, 81);
      AlignedBuffer<uint8_t> in(out.size());
      store->wait(store->write(off, out.data(), MiB + 1));
      store->wait(store->read(off, in.data(), MiB + 1));
      say(store->describe(), store->backend() == NvmeBackend::pread && same_bytes(out, in) ? 0 : 2);
    } catch (const std::exception& e) {
      say(e.what(), 3);
    }
  }
  ::close(pipe_fds[1]);
  std::string text;
  char chunk[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) text.append(chunk, size_t(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  if (WEXITSTATUS(status) == 4) GTEST_SKIP() << text;
  std::cout << "[ seccomp  ] " << text << "\n";
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  for (const char* needle : {"pread, ", "pread instead of io_uring: io_uring_queue_init failed: Function not "
                             "implemented (errno 38)", "seccomp"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle << " not in: " << text;
}

TEST_F(Nvme, DirectRefusedFallsBackToBufferedAndSaysSo) {
  ScopedMount ramfs(dir_ / "ramfs", "ramfs", 0, nullptr);
  if (!ramfs.ok()) GTEST_SKIP() << ramfs.why();
  NvmeOptions o = options(4 * MiB);
  o.dir = ramfs.path().string();
  auto store = NvmeStore::open(o);
  std::cout << "[ ramfs    ] " << store->describe() << "\n";
  EXPECT_EQ(store->caching(), NvmeCaching::buffered);
  ASSERT_GE(store->fallbacks().size(), 1u);  // ramfs has no fallocate either, which is the second
  EXPECT_EQ(store->fallbacks()[0].rfind("buffered instead of O_DIRECT", 0), 0u) << store->fallbacks()[0];
  std::string d = store->describe();
  for (const char* needle : {"buffered instead of O_DIRECT", "refuses it (open: Invalid argument", "page cache"})
    EXPECT_NE(d.find(needle), std::string::npos) << needle << " not in: " << d;
  EXPECT_NE(d.find(o.dir), std::string::npos) << d;

  uint64_t off = store->alloc(100000, "boundary 3");
  auto out = random_buffer(100000, 31);
  AlignedBuffer<uint8_t> in(out.size());
  store->wait(store->write(off, out.data(), 100000));
  store->wait(store->read(off, in.data(), 100000));
  EXPECT_TRUE(same_bytes(out, in));
}

// tmpfs accepts O_DIRECT since Linux 6.6; before that it refuses and the store must say so.
TEST_F(Nvme, DevShmEitherDirectOrSaysWhyNot) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  NvmeOptions o = options(4 * MiB);
  o.dir = "/dev/shm";
  auto store = NvmeStore::open(o);
  std::string d = store->describe();
  std::cout << "[ /dev/shm ] " << d << "\n";
  if (store->caching() == NvmeCaching::buffered) {
    EXPECT_NE(d.find("buffered instead of O_DIRECT"), std::string::npos) << d;
  } else {
    EXPECT_NE(d.find("O_DIRECT, /dev/shm"), std::string::npos) << d;
  }
  uint64_t off = store->alloc(3 * MiB + 5, "h");
  auto out = random_buffer(3 * MiB + 5, 32);
  AlignedBuffer<uint8_t> in(out.size());
  store->wait(store->write(off, out.data(), 3 * MiB + 5));
  store->wait(store->read(off, in.data(), 3 * MiB + 5));
  EXPECT_TRUE(same_bytes(out, in));
}

// ---------------------------------------------------------------------------------------------------
// User errors

TEST_F(Nvme, MisalignedOrOutOfRegionTransfersAreRefused) {
  auto store = NvmeStore::open(options(4 * MiB));
  uint64_t off = store->alloc(8192, "boundary 5");
  AlignedBuffer<uint8_t> buf(3 * 4096);
  expect_error([&] { store->write(off, buf.data() + 1, 100); },
               {"NVMe write of 100 bytes", "not 4096-byte aligned", "AlignedBuffer"});
  expect_error([&] { store->read(off, buf.data() + 512, 4096); }, {"NVMe read", "not 4096-byte aligned"});
  expect_error([&] { store->write(off + 512, buf.data(), 100); }, {"offset " + std::to_string(off + 512),
                                                                   "not a multiple of 4096"});
  expect_error([&] { store->write(off, buf.data(), 8193); },
               {"12288 rounded up to 4096", "does not fit the allocated region 'boundary 5'"});
  expect_error([&] { store->read(off + 8192, buf.data(), 4096); }, {"does not fit", "boundary 5"});
  expect_error([&] { store->write(off, buf.data(), 0); }, {"0 bytes"});
  expect_error([&] { store->read(2 * MiB, buf.data(), 4096); }, {"does not fit"});
}

TEST_F(Nvme, CapacityIsEnforcedAndFreedSpaceCoalesces) {
  auto store = NvmeStore::open(options(MiB));
  EXPECT_EQ(store->capacity(), MiB);
  uint64_t a = store->alloc(600000, "boundary 1");
  expect_error([&] { store->alloc(600000, "boundary 7"); },
               {"NVMe tier full", "'boundary 7'", "capacity 1048576", "602112 bytes in use in 1 regions",
                "largest free hole 446464"});
  store->free(a);
  EXPECT_EQ(store->used_bytes(), 0u);
  // Four quarters fill it; freeing the middle two in either order leaves one hole of half the capacity.
  std::vector<uint64_t> q;
  for (const char* tag : {"q0", "q1", "q2", "q3"}) q.push_back(store->alloc(MiB / 4, tag));
  expect_error([&] { store->alloc(1, "one more"); }, {"NVMe tier full", "0 bytes free"});
  store->free(q[2]);
  store->free(q[1]);
  uint64_t half = store->alloc(MiB / 2, "half");
  EXPECT_EQ(half, q[1]);
  expect_error([&] { store->free(half + 4096); }, {"not the start of an allocated region"});
  expect_error([&] { store->alloc(0, "empty"); }, {"0 bytes", "empty"});
}

// Freeing a region under a transfer would let its next owner's data race the old transfer: refused.
TEST_F(Nvme, RegionsUnderTransferCannotBeFreed) {
  for (NvmeBackend backend : {NvmeBackend::io_uring, NvmeBackend::pread}) {
    SCOPED_TRACE(to_string(backend));
    NvmeOptions o = options(64 * MiB, backend);
    o.chunk_bytes = 64 * 1024;
    o.queue_depth = 2;  // slow enough that the transfer is still in flight at free()
    auto store = NvmeStore::open(o);
    uint64_t off = store->alloc(48 * MiB, "boundary 4");
    auto out = random_buffer(48 * MiB, 71);
    NvmeTicket t = store->write(off, out.data(), 48 * MiB);
    bool refused = false;
    try {
      store->free(off);
    } catch (const Error& e) {
      refused = true;
      EXPECT_NE(std::string(e.what()).find("'boundary 4'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos) << e.what();
    }
    store->wait(t);
    if (!refused) {
      std::cout << "[ note     ] the 48 MiB write ended before free(); the refusal was not exercised\n";
    } else {
      store->free(off);  // after wait() it is allowed
    }
    EXPECT_EQ(store->used_bytes(), 0u);
  }
}

TEST_F(Nvme, BadOptionsAreRefused) {
  NvmeOptions o = options(MiB);
  o.chunk_bytes = 1000;
  expect_error([&] { NvmeStore::open(o); }, {"chunk_bytes", "1000"});
  o = options(MiB);
  o.queue_depth = 0;
  expect_error([&] { NvmeStore::open(o); }, {"queue_depth"});
  expect_error([&] { NvmeStore::open(options(0)); }, {"capacity_bytes"});
  o = options(MiB);
  o.dir = "";
  expect_error([&] { NvmeStore::open(o); }, {"no directory"});
}

TEST_F(Nvme, TicketsAreWaitedForOnce) {
  auto store = NvmeStore::open(options(MiB));
  uint64_t off = store->alloc(4096, "t");
  auto buf = random_buffer(4096, 5);
  NvmeTicket t = store->write(off, buf.data(), 4096);
  store->wait(t);
  expect_error([&] { store->wait(t); }, {"ticket", "already waited"});
  expect_error([&] { store->ready(NvmeTicket{12345}); }, {"ticket 12345"});
}

TEST_F(Nvme, MissingDirectoryIsCreated) {
  std::string missing = (dir_ / "no" / "such").string();
  NvmeOptions o = options(MiB);
  o.dir = missing;
  auto store = NvmeStore::open(o);
  EXPECT_TRUE(fs::is_directory(missing));
  const uint64_t off = store->alloc(4096, "t");
  auto buf = random_buffer(4096, 6);
  AlignedBuffer<uint8_t> back(4096);
  store->wait(store->write(off, buf.data(), 4096));
  store->wait(store->read(off, back.data(), 4096));
  EXPECT_EQ(0, std::memcmp(buf.data(), back.data(), 4096));
}

TEST_F(Nvme, UncreatableDirectoryIsNamed) {
  std::string file = (dir_ / "in_the_way").string();
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  std::string below_file = file + "/spill";
  NvmeOptions o = options(MiB);
  o.dir = below_file;
  expect_error([&] { NvmeStore::open(o); }, {"'" + below_file + "'", "cannot be created", "configure another"});
}

TEST_F(Nvme, FileInsteadOfDirectoryIsNamed) {
  std::string file = (dir_ / "a_file").string();
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  NvmeOptions o = options(MiB);
  o.dir = file;
  expect_error([&] { NvmeStore::open(o); }, {"'" + file + "'", "is not a directory"});
}

TEST_F(Nvme, UnwritableDirectoryIsNamed) {
  NvmeOptions o = options(MiB);
  std::unique_ptr<ScopedMount> ro;
  if (::geteuid() == 0) {  // root ignores permission bits: use a read-only filesystem instead
    ro = std::make_unique<ScopedMount>(dir_ / "ro", "tmpfs", MS_RDONLY, "size=1M");
    if (!ro->ok()) GTEST_SKIP() << "running as root, and " << ro->why();
    o.dir = ro->path().string();
  } else {
    fs::create_directories(dir_ / "locked");
    fs::permissions(dir_ / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    o.dir = (dir_ / "locked").string();
  }
  expect_error([&] { NvmeStore::open(o); }, {"cannot create the scratch file in '" + o.dir + "'", "not writable"});
  if (!ro) fs::permissions(dir_ / "locked", fs::perms::owner_all);
}

// ---------------------------------------------------------------------------------------------------
// Real I/O errors

TEST_F(Nvme, NoSpaceAtOpenNamesDirAndSizes) {
  ScopedMount tiny(dir_ / "tiny", "tmpfs", 0, "size=1M");
  if (!tiny.ok()) GTEST_SKIP() << tiny.why();
  NvmeOptions o = options(8 * MiB);
  o.dir = tiny.path().string();
  size_t free_bytes = bytes_free(tiny.path());
  expect_error([&] { NvmeStore::open(o); },
               {"cannot reserve 8388608 bytes (8.0 MiB)", "'" + o.dir + "'", "No space left on device",
                std::to_string(free_bytes) + " bytes", "free"});
  EXPECT_EQ(bytes_free(tiny.path()), free_bytes) << "the failed reservation must not keep space";
  EXPECT_EQ(fds_into(tiny.path()), 0);
}

// A file on a full filesystem, not preallocated: the write runs out of space mid-transfer, and the
// ENOSPC comes back through wait() on both backends.
TEST_F(Nvme, NoSpaceDuringWriteSurfacesInWait) {
  ScopedMount tiny(dir_ / "tiny", "tmpfs", 0, "size=1M");
  if (!tiny.ok()) GTEST_SKIP() << tiny.why();
  for (NvmeBackend backend : {NvmeBackend::io_uring, NvmeBackend::pread}) {
    SCOPED_TRACE(to_string(backend));
    std::string path = (tiny.path() / "spill").string();
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    NvmeOptions o = options(4 * MiB, backend, NvmeCaching::buffered);
    auto store = NvmeStore::adopt(fd, path, o);
    std::cout << "[ adopted  ] " << store->describe() << "\n";
    uint64_t off = store->alloc(2 * MiB, "boundary 9");
    auto out = random_buffer(2 * MiB, 41);
    expect_error([&] { store->wait(store->write(off, out.data(), 2 * MiB)); },
                 {"NVMe write failed", "No space left on device (errno 28)", "part of a write of 2097152 bytes at "
                  "offset 0", path});
    store.reset();
    ::unlink(path.c_str());
  }
}

TEST_F(Nvme, IoErrorsPropagateThroughWaitWithStrerror) {
  std::string path = (dir_ / "readonly").string();
  {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 4 * MiB), 0);
    ::close(fd);
  }
  for (NvmeBackend backend : {NvmeBackend::io_uring, NvmeBackend::pread}) {
    SCOPED_TRACE(to_string(backend));
    NvmeOptions o = options(4 * MiB, backend, NvmeCaching::buffered);
    o.chunk_bytes = 256 * 1024;
    auto store = NvmeStore::adopt(::open(path.c_str(), O_RDONLY), path, o);
    if (backend == NvmeBackend::io_uring && store->backend() != NvmeBackend::io_uring) {
      GTEST_SKIP() << "io_uring unavailable here: " << store->describe();
    }
    uint64_t off = store->alloc(MiB, "boundary 2");
    auto out = random_buffer(MiB, 51);
    expect_error([&] { store->wait(store->write(off, out.data(), MiB)); },
                 {"NVMe write failed: 262144 bytes at offset", "part of a write of 1048576 bytes at offset 0",
                  "Bad file descriptor (errno 9)", path, std::string("[") + to_string(backend) + ", buffered]"});
    // The store stays usable: reads work, and the file was preallocated with zeros by ftruncate.
    AlignedBuffer<uint8_t> in(MiB);
    in[0] = 1;
    store->wait(store->read(off, in.data(), MiB));
    EXPECT_EQ(in[0], 0);
  }
  // Reading past the end of a file is a short transfer, reported as such.
  NvmeOptions o = options(8 * MiB, NvmeBackend::pread, NvmeCaching::buffered);
  auto store = NvmeStore::adopt(::open(path.c_str(), O_RDONLY), path, o);
  uint64_t off = store->alloc(8 * MiB, "past the end");
  AlignedBuffer<uint8_t> in(8 * MiB);
  expect_error([&] { store->wait(store->read(off, in.data(), 8 * MiB)); }, {"NVMe read failed", "short read"});
}

// ---------------------------------------------------------------------------------------------------
// Lifetime

TEST_F(Nvme, ScratchFileVanishesWithTheStore) {
  auto store = NvmeStore::open(options(8 * MiB));
  EXPECT_TRUE(fs::is_empty(dir_)) << "the scratch file must have no name";
  EXPECT_EQ(fds_into(dir_), 1);
  // Transfers still in flight at destruction are waited for, not torn down under the kernel.
  uint64_t off = store->alloc(6 * MiB, "in flight");
  auto out = random_buffer(6 * MiB, 61);
  for (int i = 0; i < 3; ++i) store->write(off, out.data(), 6 * MiB);
  store.reset();
  EXPECT_EQ(fds_into(dir_), 0);
  EXPECT_TRUE(fs::is_empty(dir_));

  // Unwinding from an exception closes it too.
  try {
    auto s = NvmeStore::open(options(MiB));
    EXPECT_EQ(fds_into(dir_), 1);
    throw std::runtime_error("step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(fds_into(dir_), 0);
}

TEST_F(Nvme, ReservedSpaceReturnsWhenTheStoreCloses) {
  ScopedMount fs64(dir_ / "fs64", "tmpfs", 0, "size=64M");
  if (!fs64.ok()) GTEST_SKIP() << fs64.why();
  NvmeOptions o = options(32 * MiB);
  o.dir = fs64.path().string();
  size_t before = bytes_free(fs64.path());
  auto store = NvmeStore::open(o);
  EXPECT_LE(bytes_free(fs64.path()) + 32 * MiB, before) << "fallocate must reserve the capacity";
  store.reset();
  EXPECT_EQ(bytes_free(fs64.path()), before);
}

TEST_F(Nvme, ProbeMeasuresPositiveBandwidth) {
  for (NvmeBackend backend : {NvmeBackend::io_uring, NvmeBackend::pread}) {
    auto store = NvmeStore::open(options(16 * MiB, backend));
    NvmeProbe p = store->probe(8 * MiB);
    std::cout << "[ probe    ] " << store->describe() << ": " << p.describe() << "\n";
    EXPECT_EQ(p.bytes, 8 * MiB);
    EXPECT_GT(p.write_gbps, 0);
    EXPECT_GT(p.read_gbps, 0);
    EXPECT_EQ(store->used_bytes(), 0u) << "the probe must give its region back";
  }
  auto small = NvmeStore::open(options(MiB));
  expect_error([&] { small->probe(2 * MiB); }, {"NVMe tier full", "bandwidth probe"});
}

// The measurement for the log and the docs: every path, LT_NVME_PROBE_MB each (default 16) in LT_NVME_DIR
// (default the test temp dir); LT_NVME_CHUNK_KB and LT_NVME_QUEUE_DEPTH override the defaults.
size_t env_or(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? size_t(std::atoll(v)) : fallback;
}

TEST(NvmeBandwidth, AllPaths) {
  const char* dir_env = std::getenv("LT_NVME_DIR");
  size_t bytes = env_or("LT_NVME_PROBE_MB", 16) * MiB;
  fs::path dir = dir_env ? fs::path(dir_env) : fs::path(::testing::TempDir());
  NvmeOptions defaults;
  for (NvmeBackend backend : {NvmeBackend::io_uring, NvmeBackend::pread}) {
    for (NvmeCaching caching : {NvmeCaching::direct, NvmeCaching::buffered}) {
      NvmeOptions o;
      o.dir = dir.string();
      o.capacity_bytes = bytes;
      o.backend = backend;
      o.caching = caching;
      o.chunk_bytes = env_or("LT_NVME_CHUNK_KB", defaults.chunk_bytes / 1024) * 1024;
      o.queue_depth = env_or("LT_NVME_QUEUE_DEPTH", defaults.queue_depth);
      auto store = NvmeStore::open(o);
      NvmeProbe p = store->probe(bytes);
      std::cout << "[ bandwidth] " << store->describe() << ": " << p.describe() << "\n";
      EXPECT_GT(p.write_gbps, 0);
      EXPECT_GT(p.read_gbps, 0);
    }
  }
}

}  // namespace
}  // namespace lt
