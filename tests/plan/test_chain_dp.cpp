// The exact chain DP against brute-force enumeration through the cost model, on random restricted
// instances under both memory models.
#include <gtest/gtest.h>

#include "plan/chain_dp.h"
#include "plan_testing.h"

namespace lt {
namespace {

void expect_dp_equals_brute_force(MemoryModel memory, int cases, uint64_t seed0) {
  int feasible = 0;
  for (int c = 0; c < cases; ++c) {
    const uint64_t seed = seed0 + uint64_t(c);
    Rng rng(seed);
    const int64_t L = 1 + int64_t(rng.below(6));
    Instance in = restrict_instance(testing::random_instance(rng, L, memory, true));
    ChainResult bf = brute_force(in);
    ChainResult dp = chain_dp(in);
    ASSERT_EQ(dp.feasible, bf.feasible) << "seed " << seed << " L " << L;
    if (!bf.feasible) continue;
    ++feasible;
    EXPECT_NEAR(dp.objective, bf.objective, 1e-9 * bf.objective) << "seed " << seed << " L " << L;
    Prediction p = evaluate(in, dp.plan);
    EXPECT_TRUE(p.feasible) << "seed " << seed << ": " << (p.violations.empty() ? "" : p.violations[0]);
    EXPECT_NEAR(p.iteration_s, dp.objective, 1e-12);
  }
  EXPECT_GT(feasible, cases / 2) << "the generator should give mostly feasible instances";
}

TEST(ChainDp, EqualsBruteForceExecutorMemory) { expect_dp_equals_brute_force(MemoryModel::executor, 60, 1000); }

TEST(ChainDp, EqualsBruteForceLifetimeMemory) { expect_dp_equals_brute_force(MemoryModel::lifetime, 60, 2000); }

TEST(ChainDp, EightLayers) {
  for (uint64_t seed : {11u, 12u}) {
    Rng rng(seed);
    Instance in = restrict_instance(testing::random_instance(rng, 8, seed % 2 ? MemoryModel::lifetime
                                                                           : MemoryModel::executor, true));
    ChainResult bf = brute_force(in);
    ChainResult dp = chain_dp(in);
    ASSERT_EQ(dp.feasible, bf.feasible) << "seed " << seed;
    if (bf.feasible) {
      EXPECT_NEAR(dp.objective, bf.objective, 1e-9 * bf.objective) << "seed " << seed;
    }
  }
}

TEST(ChainDp, KeepAllWhenMemoryIsAmple) {
  Rng rng(5);
  Instance in = restrict_instance(testing::random_instance(rng, 6, MemoryModel::executor, true));
  in.budget.device_bytes = size_t(1) << 40;
  ChainResult dp = chain_dp(in);
  ASSERT_TRUE(dp.feasible);
  EXPECT_NEAR(dp.objective, evaluate(in, Plan::keep_all(6)).iteration_s, 1e-12);
}

TEST(ChainDp, InfeasibleBudget) {
  Rng rng(6);
  Instance in = restrict_instance(testing::random_instance(rng, 5, MemoryModel::executor, true));
  in.budget.device_bytes = size_t(in.fixed_peak());  // not even the scratch fits
  EXPECT_FALSE(chain_dp(in).feasible);
  EXPECT_FALSE(brute_force(in).feasible);
}

TEST(ChainDp, RefusesUnrestrictedInstances) {
  Rng rng(7);
  Instance in = testing::random_instance(rng, 3, MemoryModel::executor, false);
  EXPECT_THROW(chain_dp(in), Error);
}

}  // namespace
}  // namespace lt
