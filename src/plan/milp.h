// plan/milp.h — the schedule as a mixed-integer program, solved by CBC (coinor-libcbc, C API).
//
// Variables (docs/planner.md writes them out with the math):
//   x[s,e]   binary, 0 <= s < e <= L: boundaries s and e are consecutive stored boundaries (all between
//            dropped); the chosen edges form one path 0 -> L
//   dev[i], host[i], nvme[i]   binary tier of boundary i (one of them iff i is stored)
//   keep[l]  binary: layer l keeps its internals (needs its input stored)
//   y, R     the executor's static working set: some layer recomputes internals; deepest recompute run
//   u[e]     source of the recompute segment below e on the host: one more reload
//   off[i,w], rel[i,w], nw[i,w], nr[i,w]   share of boundary i's offload / reload / NVMe write / read in window w
//   T[w]     length of window w; E the host optimizer's exposed time
// Objective: prologue + Σ_w T[w] + epilogue + E (evaluate() of the decoded plan gives the same number).
//
// CBC pitfalls handled here: "sec" counts CPU time unless timeMode is elapsed (set); presolve cannot be
// interrupted, so by default the solve runs in a forked child that the caller kills at the wall-clock limit
// (its warm start then stands); CBC is not thread-safe for concurrent solves (in-process solves serialise).
#pragma once

#include <string>
#include <vector>

#include "exec/plan.h"
#include "plan/cost_model.h"
#include "plan/instance.h"

namespace lt {

enum class SolveStatus : uint8_t {
  optimal,         // proven optimal (within CBC's default tolerances)
  time_limit,      // stopped at the time limit with a solution; gap says how far from proven
  no_solution,     // stopped at the time limit before any solution (and no warm start was feasible)
  infeasible,      // proven infeasible: no plan fits the budgets
  error,           // CBC failed (numerical trouble, the child died); message in MilpResult::message
};
const char* solve_status_name(SolveStatus s);  // "optimal", "time limit", ...

struct MilpOptions {
  double time_limit_s = 10;   // wall clock, whole solve
  int threads = 1;            // CBC threads
  bool verbose = false;       // CBC's log on stderr
  bool isolate = true;        // solve in a child process so the wall-clock limit always holds
  std::vector<Plan> warm_starts;  // the best feasible one (by evaluate) becomes CBC's MIP start
};

struct MilpResult {
  SolveStatus status = SolveStatus::error;
  std::string message;
  bool has_solution = false;
  Plan plan;
  TransferWindows windows;
  double objective = 0;   // the MILP's prediction of iteration_s for `plan`
  double bound = 0;       // best proven lower bound on iteration_s
  double gap = 0;         // (objective - bound) / objective
  double solve_s = 0;
  int rows = 0, cols = 0, integers = 0;
  std::string warm_start;  // name of the warm-start plan used ("" if none)
  double warm_start_objective = 0;
};

MilpResult solve_milp(const Instance& in, const MilpOptions& options);

}  // namespace lt
