// plan/chain_dp.h — exact algorithms for the restricted chain problem (InstanceOptions::restricted):
// boundaries on the device or the host or dropped, each layer keeping its internals or not, every transfer
// in its natural window, no NVMe and no optimizer term. They cross-check the MILP and warm-start it.
//
// chain_dp: a dynamic program over the stored boundaries, rotor/POFO style. Between two consecutive stored
// boundaries s < e everything is dropped, so the windows F(s+1..e), B(s+1..e) depend only on (s, tier of s,
// e, tier of e, keep of e): the step time is a sum of edge costs along a path 0 -> L. Memory is carried in
// the state as (device boundaries, kept internals) so far; per-window lifetime checks are local to an edge,
// the executor's static sum is checked at the end with the recompute depth and the scratch enumerated
// outside. O(L² · R · states).
//
// brute_force: every plan of the restricted space through evaluate() — the specification the DP and the
// MILP are tested against (up to ~8 layers).
#pragma once

#include <optional>

#include "exec/plan.h"
#include "plan/cost_model.h"
#include "plan/instance.h"

namespace lt {

struct ChainResult {
  bool feasible = false;
  bool complete = true;   // false: stopped at the work or time limit (the result, if any, is the best found)
  Plan plan;
  double objective = 0;   // evaluate(plan).iteration_s under the restricted rules
  double seconds = 0;     // wall time spent
  int64_t states = 0;     // states expanded
};

// `work_limit`: maximum edge relaxations before giving up (0 = none); `time_limit_s`: wall seconds before
// giving up (0 = none). Stopped early, the result is the best plan of the passes that finished.
ChainResult chain_dp(const Instance& restricted_instance, int64_t work_limit = 0, double time_limit_s = 0);

// Every plan of the restricted space (2·5^(L-1) of them); refuses L > 10.
ChainResult brute_force(const Instance& restricted_instance);

// The same instance with the restricted rules switched on (natural windows, no NVMe, no optimizer).
Instance restrict_instance(const Instance& in);

}  // namespace lt
