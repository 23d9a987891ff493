// dist/comm.h — the process group of a data-parallel run, on MPI.
//
// `mpirun -np N lazytrain ...` (or srun) starts N processes; each learns its rank and the world's size here. A
// process not started by an MPI launcher is a world of one and never initialises MPI, so a plain run is unchanged.
// What started us is read from the launcher's environment (Open MPI's OMPI_COMM_WORLD_SIZE, PMI's PMI_SIZE, srun's
// SLURM_STEP_NUM_TASKS; a launcher whose processes MPI then sees as separate worlds is refused); then MPI_Init_thread
// runs once, serialized (the trainer's thread between steps, the executor's optimizer lane and then its host lane
// during a step call MPI, each after the one before it is done), and MPI_Finalize at exit.
//
// Sizes: MPI counts bytes in int; a collective with a message or offset beyond 1 GiB (LT_MPI_MAX_MESSAGE bytes)
// goes point to point in pieces instead, so a 5 GB embedding table moves like any slab.
//
// Every collective here is deterministic: sums are never left to the library's reduction order (which MPI does
// not fix); data is gathered and added in rank order by the caller (dist/grad_exchange.h), so N ranks give the
// bits one process gives.
//
// Errors: MPI's error handler is set to return codes, and every failed call throws lt::Error naming the call and
// MPI's message; a rank that dies ends the job through the launcher (Open MPI aborts the other ranks). A rank
// that hangs (stopped, deadlocked, its network gone) would leave the others waiting in a collective forever: with
// set_timeout, a watchdog thread ends this process with a message naming the call once one has waited that long,
// and the launcher then ends the job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace lt {

class Comm {
 public:
  // The world this process belongs to (initialised on first use).
  static Comm& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }

  // Every rank sends `bytes` bytes of `mine` and receives every rank's (its own included) into all[size() ·
  // bytes], in rank order.
  void allgather(const void* mine, size_t bytes, void* all) const;
  // The same with each rank's own size: rank r's bytes[r] bytes land at all + offsets[r].
  void allgatherv(const void* mine, size_t my_bytes, void* all, std::span<const size_t> bytes,
                  std::span<const size_t> offsets) const;
  // To rank 0 only: rank r's my_bytes land at all + offsets[r] (bytes[r] of them; `all` is written on rank 0
  // only; `bytes` and `offsets` are the same on every rank).
  void gatherv(const void* mine, size_t my_bytes, void* all, std::span<const size_t> bytes,
               std::span<const size_t> offsets) const;
  // Every rank's int, in rank order (e.g. a flag every rank must agree on, or a size before an allgatherv).
  std::vector<int64_t> allgather_int(int64_t mine) const;
  // `patience`: this wait may last that many times the timeout (kWaitForLead: the others wait for rank 0's
  // evaluation or checkpoint writing, legitimately long, yet not forever).
  static constexpr double kWaitForLead = 20;
  void barrier(double patience = 1) const;
  // Any collective that waits longer than `seconds` for the other ranks ends the process (exit 1) with a message;
  // 0: wait forever. No effect in a world of one.
  void set_timeout(double seconds) const;
  // Ends every rank of the job at once (a rank that failed: the others may be waiting in a collective).
  [[noreturn]] void abort(int code) const;
  // Every rank r sends send[dest] (send_bytes[dest] bytes at send_offsets[dest]) to each rank dest and receives
  // from each rank src recv_bytes[src] bytes at recv_offsets[src] (a rank's message to itself included). The
  // sizes must agree pairwise.
  void alltoallv(const void* send, std::span<const size_t> send_bytes, std::span<const size_t> send_offsets,
                 void* recv, std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets) const;

 private:
  Comm();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

// The exchange's speed between the ranks: an alltoallv of `bytes` from every rank to every other, timed (best of
// three, the slowest rank's); returns GB/s each rank sends (and receives). Collective; 0 in a world of one.
double measure_exchange_gbps(const Comm& comm, size_t bytes = size_t(32) << 20);

// Whether this process was started by an MPI launcher (the environment says so), and with how many ranks.
int launcher_world_size();
// This process's rank among the ranks on its host (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID,
// srun's SLURM_LOCALID); 0 without a launcher. Rank r of a host takes its local GPU r.
int launcher_local_rank();

}  // namespace lt
