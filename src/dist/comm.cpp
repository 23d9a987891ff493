#include "dist/comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <optional>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace lt {

namespace {

// Throws lt::Error for a failed MPI call, with MPI's own message.
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  LT_FAIL("MPI: {} failed: {}", call, std::string(text, size_t(len)));
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

// MPI counts are int: a message above 2 GiB goes as a count of 1 MiB blocks (callers keep sizes multiples of
// that or small); here only the plain byte form is used, so the size is checked.
// The collective in progress (name and start) for the watchdog; one at a time (calls are serialized).
std::atomic<const char*> g_call{nullptr};
std::atomic<int64_t> g_since_ns{0};
std::atomic<double> g_timeout_s{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Marks a timed collective for its duration.
class Watched {
 public:
  explicit Watched(const char* call) {
    g_since_ns.store(now_ns(), std::memory_order_relaxed);
    g_call.store(call, std::memory_order_release);
  }
  ~Watched() { g_call.store(nullptr, std::memory_order_release); }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
};

// Wakes every second; a collective past the timeout ends the process. The launcher then ends the other ranks.
void watchdog(int rank, int size) {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const char* call = g_call.load(std::memory_order_acquire);
    const double limit = g_timeout_s.load(std::memory_order_relaxed);
    if (!call || limit <= 0) continue;
    const double waited = double(now_ns() - g_since_ns.load(std::memory_order_relaxed)) * 1e-9;
    if (waited < limit || g_call.load(std::memory_order_acquire) != call) continue;
    std::fprintf(stderr,
                 "lazytrain: error (rank %d of %d): %s has waited %.0f s for the other ranks (dist_timeout_s: %.0f): "
                 "a rank has stopped responding or the network is down; ending the job (the last whole checkpoint "
                 "stays)\n",
                 rank, size, call, waited, limit);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

// Waits for a nonblocking collective without holding a core: MPI_Test in a loop, a few times at once, then
// sleeping between tests (20 µs, doubling up to 1 ms). A blocking collective busy-polls while the other ranks
// compute, and where the ranks share the host's cores the poll takes a core from their compute (measured with
// bench/run_dist_scaling.sh: 2 ranks x 1 thread on 2 cores, 3.07 s steps vs 2.31 s for one rank alone).
void wait_for(MPI_Request& request, const char* call) {
  int done = 0;
  for (int64_t nap_us = 0, tests = 0;; ++tests) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done) return;
    if (tests < 64) continue;
    nap_us = nap_us == 0 ? 20 : std::min<int64_t>(2 * nap_us, 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
  }
}

int byte_count(size_t bytes, const char* call) {
  LT_CHECK(bytes <= size_t(INT_MAX), "MPI: {} of {} bytes exceeds one message's limit (2 GiB)", call, bytes);
  return int(bytes);
}

}  // namespace

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (const int n = env_int(name); n > 0) return n;
  return 1;
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

Comm& Comm::world() {
  static Comm comm;
  return comm;
}

Comm::Comm() {
  const int launched = launcher_world_size();
  if (launched <= 1) return;  // a plain run: no MPI at all
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  LT_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI: this MPI library gives thread level {}, serialized ({}) is needed",
           provided, int(MPI_THREAD_SERIALIZED));
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  mpi_ = true;
  // srun without an MPI plugin starts N singletons, each a world of one: N runs writing the same outputs.
  LT_CHECK(size_ == launched, "the launcher started {} processes but MPI sees a world of {} (srun: add --mpi=pmix)",
           launched, size_);
}

void Comm::allgather(const void* mine, size_t bytes, void* all) const {
  if (!mpi_) {
    if (bytes) std::memmove(all, mine, bytes);
    return;
  }
  const int n = byte_count(bytes, "MPI_Allgather");
  const Watched watch("MPI_Allgather");
  MPI_Request req;
  check_mpi(MPI_Iallgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, MPI_COMM_WORLD, &req), "MPI_Allgather");
  wait_for(req, "MPI_Allgather");
}

void Comm::allgatherv(const void* mine, size_t my_bytes, void* all, std::span<const size_t> bytes,
                      std::span<const size_t> offsets) const {
  const size_t n = size_t(size_);
  LT_CHECK(bytes.size() == n && offsets.size() == n && bytes[size_t(rank_)] == my_bytes,
           "Comm::allgatherv: {} ranks, but {} sizes and {} offsets (this rank's: {} of {} bytes)", n, bytes.size(),
           offsets.size(), bytes.size() > size_t(rank_) ? bytes[size_t(rank_)] : 0, my_bytes);
  if (!mpi_) {
    if (my_bytes) std::memmove(static_cast<char*>(all) + offsets[0], mine, my_bytes);
    return;
  }
  std::vector<int> rc(n), ro(n);
  for (size_t r = 0; r < n; ++r) {
    rc[r] = byte_count(bytes[r], "MPI_Allgatherv");
    ro[r] = byte_count(offsets[r], "MPI_Allgatherv");
  }
  const Watched watch("MPI_Allgatherv");
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(mine, byte_count(my_bytes, "MPI_Allgatherv"), MPI_BYTE, all, rc.data(), ro.data(),
                            MPI_BYTE, MPI_COMM_WORLD, &req),
            "MPI_Allgatherv");
  wait_for(req, "MPI_Allgatherv");
}

void Comm::gatherv(const void* mine, size_t my_bytes, void* all, std::span<const size_t> bytes,
                   std::span<const size_t> offsets) const {
  const size_t n = size_t(size_);
  if (!mpi_) {
    if (my_bytes) std::memmove(static_cast<char*>(all) + offsets[0], mine, my_bytes);
    return;
  }
  std::vector<int> rc(n, 0), ro(n, 0);
  if (rank_ == 0) {
    LT_CHECK(bytes.size() == n && offsets.size() == n, "Comm::gatherv: {} ranks, but {} sizes and {} offsets", n,
             bytes.size(), offsets.size());
    for (size_t r = 0; r < n; ++r) {
      rc[r] = byte_count(bytes[r], "MPI_Gatherv");
      ro[r] = byte_count(offsets[r], "MPI_Gatherv");
    }
  }
  const Watched watch("MPI_Gatherv");
  MPI_Request req;
  check_mpi(MPI_Igatherv(mine, byte_count(my_bytes, "MPI_Gatherv"), MPI_BYTE, all, rc.data(), ro.data(), MPI_BYTE, 0,
                         MPI_COMM_WORLD, &req),
            "MPI_Gatherv");
  wait_for(req, "MPI_Gatherv");
}

std::vector<int64_t> Comm::allgather_int(int64_t mine) const {
  std::vector<int64_t> all(static_cast<size_t>(size_));
  allgather(&mine, sizeof mine, all.data());
  return all;
}

void Comm::barrier(bool timed) const {
  if (!mpi_) return;
  std::optional<Watched> w;
  if (timed) w.emplace("MPI_Barrier");
  MPI_Request req;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Barrier");
  wait_for(req, "MPI_Barrier");
}

void Comm::set_timeout(double seconds) const {
  if (!mpi_) return;
  const bool started = g_timeout_s.load() > 0;
  g_timeout_s.store(seconds);
  if (!started && seconds > 0) std::thread(watchdog, rank_, size_).detach();
}

void Comm::abort(int code) const {
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Comm::alltoallv(const void* send, std::span<const size_t> send_bytes, std::span<const size_t> send_offsets,
                     void* recv, std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets) const {
  const size_t n = size_t(size_);
  LT_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
           "Comm::alltoallv: {} ranks, but {} / {} / {} / {} sizes and offsets", n, send_bytes.size(),
           send_offsets.size(), recv_bytes.size(), recv_offsets.size());
  if (!mpi_) {
    LT_CHECK_EQ(send_bytes[0], recv_bytes[0], "Comm::alltoallv: a rank's message to itself");
    if (send_bytes[0])
      std::memmove(static_cast<char*>(recv) + recv_offsets[0], static_cast<const char*>(send) + send_offsets[0],
                   send_bytes[0]);
    return;
  }
  std::vector<int> sc(n), so(n), rc(n), ro(n);
  for (size_t r = 0; r < n; ++r) {
    sc[r] = byte_count(send_bytes[r], "MPI_Alltoallv");
    so[r] = byte_count(send_offsets[r], "MPI_Alltoallv");
    rc[r] = byte_count(recv_bytes[r], "MPI_Alltoallv");
    ro[r] = byte_count(recv_offsets[r], "MPI_Alltoallv");
  }
  const Watched watch("MPI_Alltoallv");
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(), MPI_BYTE, MPI_COMM_WORLD,
                           &req),
            "MPI_Alltoallv");
  wait_for(req, "MPI_Alltoallv");
}

double measure_exchange_gbps(const Comm& comm, size_t bytes) {
  const size_t n = size_t(comm.size());
  if (n == 1) return 0;
  const size_t each = bytes / n;
  std::vector<uint8_t> send(each * n, 1), recv(each * n);
  std::vector<size_t> sizes(n, each), offsets(n);
  for (size_t r = 0; r < n; ++r) offsets[r] = r * each;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    const int64_t t0 = now_ns();
    comm.alltoallv(send.data(), sizes, offsets, recv.data(), sizes, offsets);
    const std::vector<int64_t> took = comm.allgather_int(now_ns() - t0);
    best = std::min(best, double(*std::max_element(took.begin(), took.end())) * 1e-9);
  }
  return double(each * (n - 1)) / best / 1e9;
}

}  // namespace lt
