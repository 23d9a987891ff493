#include "dist/comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
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
std::atomic<double> g_patience{1};  // the collective in progress may wait this many timeouts
std::atomic<bool> g_watchdog{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Marks a timed collective for its duration.
class Watched {
 public:
  explicit Watched(const char* call, double patience = 1) {
    g_since_ns.store(now_ns(), std::memory_order_relaxed);
    g_patience.store(patience, std::memory_order_relaxed);
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
    const double limit = g_timeout_s.load(std::memory_order_relaxed) * g_patience.load(std::memory_order_relaxed);
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

void wait_all(std::vector<MPI_Request>& requests, const char* call) {
  int done = 0;
  for (int64_t nap_us = 0, tests = 0;; ++tests) {
    check_mpi(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), call);
    if (done) return;
    if (tests < 64) continue;
    nap_us = nap_us == 0 ? 20 : std::min<int64_t>(2 * nap_us, 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
  }
}

// MPI's counts and displacements are int: a collective whose sizes or offsets exceed the largest message
// (1 GiB; LT_MPI_MAX_MESSAGE lowers it, which the tests use to run this path on small data) goes point to point
// instead, each message in pieces of at most that many bytes. (The 27B model's embedding table is 5 GB of f32.)
size_t g_max_message = size_t(1) << 30;

bool fits(std::span<const size_t> sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [](size_t b) { return b <= g_max_message; });
}

// One rank's part of a point-to-point exchange.
struct Message {
  int peer;
  uint8_t* data;  // read for a send, written for a receive
  size_t bytes;
};

// Every receive and send at once, each in pieces; messages between two ranks arrive in the order sent (MPI's
// non-overtaking rule), so piece k of a message matches piece k. A message to this rank itself is a copy.
void exchange_messages(int me, const std::vector<Message>& sends, const std::vector<Message>& recvs,
                       const char* call) {
  constexpr int kTag = 7101;
  std::vector<MPI_Request> requests;
  for (const Message& m : recvs) {
    if (m.peer == me) continue;
    for (size_t at = 0; at < m.bytes; at += g_max_message) {
      requests.emplace_back();
      check_mpi(MPI_Irecv(m.data + at, int(std::min(g_max_message, m.bytes - at)), MPI_BYTE, m.peer, kTag,
                          MPI_COMM_WORLD, &requests.back()),
                call);
    }
  }
  for (const Message& m : sends) {
    if (m.peer == me) {
      for (const Message& r : recvs)
        if (r.peer == me && r.bytes) std::memmove(r.data, m.data, r.bytes);
      continue;
    }
    for (size_t at = 0; at < m.bytes; at += g_max_message) {
      requests.emplace_back();
      check_mpi(MPI_Isend(m.data + at, int(std::min(g_max_message, m.bytes - at)), MPI_BYTE, m.peer, kTag,
                          MPI_COMM_WORLD, &requests.back()),
                call);
    }
  }
  wait_all(requests, call);
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
  if (const char* v = std::getenv("LT_MPI_MAX_MESSAGE"); v && *v) {
    const long long m = std::atoll(v);
    LT_CHECK(m >= 1 && m <= INT_MAX, "LT_MPI_MAX_MESSAGE={}: expected bytes in [1, {}]", v, INT_MAX);
    g_max_message = size_t(m);
  }
  // srun without an MPI plugin starts N singletons, each a world of one: N runs writing the same outputs.
  LT_CHECK(size_ == launched, "the launcher started {} processes but MPI sees a world of {} (srun: add --mpi=pmix)",
           launched, size_);
}

void Comm::allgather(const void* mine, size_t bytes, void* all) const {
  if (!mpi_) {
    if (bytes) std::memmove(all, mine, bytes);
    return;
  }
  const Watched watch("MPI_Allgather");
  if (bytes > g_max_message) {
    std::vector<Message> sends, recvs;
    for (int r = 0; r < size_; ++r) {
      sends.push_back({r, static_cast<uint8_t*>(const_cast<void*>(mine)), bytes});
      recvs.push_back({r, static_cast<uint8_t*>(all) + size_t(r) * bytes, bytes});
    }
    exchange_messages(rank_, sends, recvs, "MPI_Allgather (point to point)");
    return;
  }
  const int n = byte_count(bytes, "MPI_Allgather");
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
  if (!fits(bytes) || !fits(offsets)) {
    const Watched watch("MPI_Allgatherv");
    std::vector<Message> sends, recvs;
    for (int r = 0; r < size_; ++r) {
      sends.push_back({r, static_cast<uint8_t*>(const_cast<void*>(mine)), my_bytes});
      recvs.push_back({r, static_cast<uint8_t*>(all) + offsets[size_t(r)], bytes[size_t(r)]});
    }
    exchange_messages(rank_, sends, recvs, "MPI_Allgatherv (point to point)");
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
  LT_CHECK(bytes.size() == n && offsets.size() == n && bytes[size_t(rank_)] == my_bytes,
           "Comm::gatherv: {} ranks, but {} sizes and {} offsets", n, bytes.size(), offsets.size());
  if (!fits(bytes) || !fits(offsets)) {
    const Watched watch("MPI_Gatherv");
    std::vector<Message> sends, recvs;
    sends.push_back({0, static_cast<uint8_t*>(const_cast<void*>(mine)), my_bytes});
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r) recvs.push_back({r, static_cast<uint8_t*>(all) + offsets[size_t(r)], bytes[size_t(r)]});
    exchange_messages(rank_, sends, recvs, "MPI_Gatherv (point to point)");
    return;
  }
  std::vector<int> rc(n, 0), ro(n, 0);
  if (rank_ == 0) {
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

void Comm::barrier(double patience) const {
  if (!mpi_) return;
  const Watched watch("MPI_Barrier", patience);
  MPI_Request req;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Barrier");
  wait_for(req, "MPI_Barrier");
}

void Comm::set_timeout(double seconds) const {
  if (!mpi_) return;
  g_timeout_s.store(seconds);
  if (seconds > 0 && !g_watchdog.exchange(true)) std::thread(watchdog, rank_, size_).detach();
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
  // Every rank must take the same path, and each knows only its own sizes: one small allreduce decides.
  const Watched watch("MPI_Alltoallv");
  int mine_fit = fits(send_bytes) && fits(send_offsets) && fits(recv_bytes) && fits(recv_offsets), all_fit = 0;
  MPI_Request flag;
  check_mpi(MPI_Iallreduce(&mine_fit, &all_fit, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &flag), "MPI_Alltoallv");
  wait_for(flag, "MPI_Alltoallv");
  if (!all_fit) {
    std::vector<Message> sends, recvs;
    for (int r = 0; r < size_; ++r) {
      sends.push_back({r, static_cast<uint8_t*>(const_cast<void*>(send)) + send_offsets[size_t(r)], send_bytes[size_t(r)]});
      recvs.push_back({r, static_cast<uint8_t*>(recv) + recv_offsets[size_t(r)], recv_bytes[size_t(r)]});
    }
    exchange_messages(rank_, sends, recvs, "MPI_Alltoallv (point to point)");
    return;
  }
  std::vector<int> sc(n), so(n), rc(n), ro(n);
  for (size_t r = 0; r < n; ++r) {
    sc[r] = byte_count(send_bytes[r], "MPI_Alltoallv");
    so[r] = byte_count(send_offsets[r], "MPI_Alltoallv");
    rc[r] = byte_count(recv_bytes[r], "MPI_Alltoallv");
    ro[r] = byte_count(recv_offsets[r], "MPI_Alltoallv");
  }
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
