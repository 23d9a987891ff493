// The MILP (CBC) against the exact DP and brute force on the restricted problem, and against its own cost
// model on the full problem (NVMe, transfer windows, optimizer): the objective it reports must be what
// evaluate() gives for the plan and windows it returns, and no better than proven.
#include <gtest/gtest.h>

#include "plan/chain_dp.h"
#include "plan/milp.h"
#include "plan_testing.h"

namespace lt {
namespace {

MilpOptions quick(bool isolate = true) {
  MilpOptions o;
  o.time_limit_s = 20;
  o.isolate = isolate;
  return o;
}

TEST(Milp, EqualsChainDpOnRestrictedInstances) {
  int compared = 0;
  for (uint64_t seed = 3000; seed < 3040; ++seed) {
    Rng rng(seed);
    const int64_t L = 2 + int64_t(rng.below(11));
    const MemoryModel mm = seed % 2 ? MemoryModel::lifetime : MemoryModel::executor;
    Instance in = restrict_instance(testing::random_instance(rng, L, mm, true));
    ChainResult dp = chain_dp(in);
    MilpOptions o = quick(seed % 4 != 0);
    if (seed % 3 == 0 && dp.feasible) o.warm_starts.push_back(dp.plan);  // with and without a warm start
    MilpResult m = solve_milp(in, o);
    if (!dp.feasible) {
      EXPECT_EQ(m.status, SolveStatus::infeasible) << "seed " << seed << " L " << L;
      continue;
    }
    ASSERT_EQ(m.status, SolveStatus::optimal) << "seed " << seed << " L " << L << ": " << m.message;
    ++compared;
    EXPECT_NEAR(m.objective, dp.objective, 1e-6 * dp.objective) << "seed " << seed << " L " << L;
    Prediction p = evaluate(in, m.plan, m.windows);
    EXPECT_TRUE(p.feasible) << "seed " << seed << ": " << (p.violations.empty() ? "" : p.violations[0]);
    EXPECT_NEAR(p.iteration_s, m.objective, 1e-6 * m.objective) << "seed " << seed;
  }
  EXPECT_GE(compared, 25);
}

TEST(Milp, EqualsBruteForceUpToEightLayers) {
  for (uint64_t seed = 4000; seed < 4012; ++seed) {
    Rng rng(seed);
    const int64_t L = seed < 4010 ? 1 + int64_t(rng.below(7)) : 8;
    const MemoryModel mm = seed % 2 ? MemoryModel::lifetime : MemoryModel::executor;
    Instance in = restrict_instance(testing::random_instance(rng, L, mm, true));
    ChainResult bf = brute_force(in);
    MilpResult m = solve_milp(in, quick());
    if (!bf.feasible) {
      EXPECT_EQ(m.status, SolveStatus::infeasible) << "seed " << seed;
      continue;
    }
    ASSERT_EQ(m.status, SolveStatus::optimal) << "seed " << seed << ": " << m.message;
    EXPECT_NEAR(m.objective, bf.objective, 1e-6 * bf.objective) << "seed " << seed << " L " << L;
  }
}

// Full problem: windows, NVMe, the optimizer term. The prediction must equal the cost model of the returned
// plan, the plan must fit, and flexibility can only help: never worse than the restricted optimum.
TEST(Milp, FullProblemMatchesCostModelAndBeatsRestricted) {
  int better = 0, solved = 0;
  for (uint64_t seed = 5000; seed < 5030; ++seed) {
    Rng rng(seed);
    const int64_t L = 2 + int64_t(rng.below(9));
    const MemoryModel mm = seed % 2 ? MemoryModel::lifetime : MemoryModel::executor;
    Instance in = testing::random_instance(rng, L, mm, false, /*nvme=*/seed % 3 != 0);
    ChainResult dp = chain_dp(restrict_instance(in));
    MilpOptions o = quick();
    if (dp.feasible) o.warm_starts.push_back(dp.plan);
    MilpResult m = solve_milp(in, o);
    if (!m.has_solution) {
      EXPECT_FALSE(dp.feasible) << "seed " << seed << ": the restricted problem has a plan, so must the full one";
      continue;
    }
    ++solved;
    EXPECT_EQ(m.status, SolveStatus::optimal) << "seed " << seed << " L " << L;
    Prediction p = evaluate(in, m.plan, m.windows);
    EXPECT_TRUE(p.feasible) << "seed " << seed << ": " << (p.violations.empty() ? "" : p.violations[0]);
    EXPECT_NEAR(p.iteration_s, m.objective, 1e-6 * m.objective) << "seed " << seed;
    if (dp.feasible) {
      // The restricted optimum, priced with this instance's optimizer term, is a feasible full plan.
      const double restricted = evaluate(in, dp.plan).iteration_s;
      EXPECT_LE(m.objective, restricted * (1 + 1e-6)) << "seed " << seed;
      if (m.objective < restricted * (1 - 1e-4)) ++better;
    }
    EXPECT_LE(m.bound, m.objective * (1 + 1e-9));
  }
  EXPECT_GE(solved, 20);
  EXPECT_GE(better, 1) << "windows / NVMe should pay off on some random instance";
}

TEST(Milp, ReturnedPlanFitsTheExecutorsMemoryModel) {
  for (uint64_t seed = 6000; seed < 6010; ++seed) {
    Rng rng(seed);
    Instance in = testing::random_instance(rng, 6, MemoryModel::executor, false);
    MilpResult m = solve_milp(in, quick());
    if (!m.has_solution) continue;
    const std::vector<double> wb = window_device_bytes(in, m.plan, MemoryModel::executor);
    EXPECT_LE(*std::max_element(wb.begin(), wb.end()), double(in.budget.device_bytes)) << "seed " << seed;
  }
}

TEST(Milp, InfeasibleIsReported) {
  Rng rng(7000);
  Instance in = testing::random_instance(rng, 5, MemoryModel::executor, false);
  in.budget.device_bytes = size_t(in.fixed_peak() / 2);
  MilpResult m = solve_milp(in, quick());
  EXPECT_EQ(m.status, SolveStatus::infeasible);
  EXPECT_FALSE(m.has_solution);
}

TEST(Milp, TimeLimitKeepsTheWarmStart) {
  // A 48-layer instance with a limit far too short to prove anything: the status says so, and the answer
  // is never worse than the warm start.
  Rng rng(7100);
  Instance in = testing::random_instance(rng, 48, MemoryModel::executor, false, true);
  in.budget.device_bytes = size_t(evaluate(in, Plan::every(48, 3)).model_device_bytes);
  MilpOptions o = quick();
  o.time_limit_s = 0.3;
  o.warm_starts = {Plan::every(48, 3), Plan::every(48, 4)};
  MilpResult m = solve_milp(in, o);
  ASSERT_TRUE(m.has_solution) << m.message;
  EXPECT_TRUE(m.status == SolveStatus::time_limit || m.status == SolveStatus::optimal);
  EXPECT_LE(m.objective, m.warm_start_objective * (1 + 1e-9));
  EXPECT_LT(m.solve_s, 0.3 + 1.5) << "the wall-clock limit holds";
  if (m.status == SolveStatus::time_limit) EXPECT_GE(m.gap, 0.0);
}

}  // namespace
}  // namespace lt
