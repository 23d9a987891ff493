// The step's schedule (exec/step_schedule.h): the executor's order as data. Its structure for random plans
// (deps point back, windows rise, every buffer used within its lifetime, the operations a plan implies), its
// memory as the planner's linear terms, and a moved operation carrying its buffers' lifetimes with it.
#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "exec/step_schedule.h"
#include "testing/exec_testing.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

using testing::random_config;
using testing::random_plan;
using testing::with_random_windows;

int count(const StepSchedule& s, OpKind kind) {
  return int(std::count_if(s.ops.begin(), s.ops.end(), [&](const StepOp& op) { return op.kind == kind; }));
}

int find_op(const StepSchedule& s, const std::string& name) {
  for (int i = 0; i < int(s.ops.size()); ++i)
    if (s.ops[size_t(i)].name == name) return i;
  ADD_FAILURE() << "no operation '" << name << "'";
  return -1;
}

// Layers a backward recomputes whole: for each dropped boundary at the top of a run, the run below it.
int64_t segment_layers(const Plan& p) {
  int64_t n = 0;
  const int64_t L = p.num_layers();
  for (int64_t k = 1; k < L; ++k)
    if (!p.stored(k) && p.stored(k + 1)) n += k - p.source_below(k);
  return n;
}

void expect_well_formed(const StepSchedule& s, const std::string& what) {
  const Plan& p = s.plan;
  const int64_t L = s.L;
  for (int id = 0; id < int(s.ops.size()); ++id) {
    const StepOp& op = s.ops[size_t(id)];
    for (int d : op.waits_for()) {
      EXPECT_LT(d, id) << what << ": " << op.name;
    }
    if (id > 0) {
      EXPECT_GE(op.window, s.ops[size_t(id - 1)].window) << what << ": " << op.name;
    }
    // Every buffer an operation names is present and alive in the operation's window.
    for (int b : {op.in, op.out, op.aux, op.weights, op.grads, op.internals}) {
      if (b < 0) continue;
      const StepBuffer& x = s.buffers[size_t(b)];
      EXPECT_TRUE(x.present) << what << ": " << op.name << " uses " << x.tag;
      EXPECT_GE(op.window, x.first_window) << what << ": " << op.name << " uses " << x.tag;
      EXPECT_LE(op.window, x.last_window) << what << ": " << op.name << " uses " << x.tag;
    }
    if (op.kind == OpKind::forward) {
      EXPECT_EQ(op.window, forward_window(op.layer)) << what;
    }
    if (op.kind == OpKind::backward_mlp) {
      EXPECT_EQ(op.window, backward_window(L, op.layer)) << what;
    }
  }
  // The operations the plan implies.
  int64_t kept = 0;
  for (int64_t l = 0; l < L; ++l) kept += p.keep_internals[size_t(l)];
  EXPECT_EQ(count(s, OpKind::forward), L) << what;
  EXPECT_EQ(count(s, OpKind::backward_mlp), L) << what;
  EXPECT_EQ(count(s, OpKind::backward_attention), L) << what;
  EXPECT_EQ(count(s, OpKind::recompute_internals), L - kept) << what;
  EXPECT_EQ(count(s, OpKind::recompute), segment_layers(p)) << what;
  EXPECT_EQ(count(s, OpKind::accumulate_grads), L) << what;
  EXPECT_EQ(count(s, OpKind::download_grads), 2 * L) << what;
  int64_t nvme = 0;
  for (int64_t i = 1; i < L; ++i) nvme += p.boundary[size_t(i)] == Tier::nvme;
  EXPECT_EQ(count(s, OpKind::nvme_write), nvme) << what;
  // Device memory: the packing's window bytes are the one function's, and its block holds every window.
  const std::vector<size_t> w = window_device_bytes(s.buffers, s.num_windows());
  EXPECT_EQ(s.memory.window_bytes, w) << what;
  EXPECT_GE(s.memory.peak_bytes, *std::max_element(w.begin(), w.end())) << what;
}

TEST(StepSchedule, RandomPlansAreWellFormed) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = random_config(rng);
    const int64_t L = cfg.num_layers;
    ExecOptions o;
    o.weight_buffers = 1 + int(rng.below(3));
    o.grad_buffers = 1 + int(rng.below(2));
    o.activations = rng.below(2) ? DType::bf16 : DType::f32;
    o.resident_head = rng.below(2);
    StepScheduleOptions so;
    so.update = rng.below(2);
    so.grads_in_place = rng.below(2);
    for (Plan plan : {Plan::keep_all(L), Plan::every(L, 2), random_plan(L, rng), random_plan(L, rng)}) {
      if (seed % 2) plan = with_random_windows(testing::random_host_plan(L, rng), rng);
      const std::string what = fmt::format("seed {} plan {}", seed, plan.to_json().dump());
      expect_well_formed(build_step_schedule(cfg, 2, 16, plan, o, so), what);
      if (HasFailure()) return;
    }
  }
}

// The planner's linear terms (MemoryTerms) give every plan's window bytes exactly, for both layer computes and for
// hybrid models (whose layers' internals differ).
TEST(StepSchedule, MemoryTermsAreTheSchedulesWindowBytes) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    Rng rng(seed);
    ModelConfig cfg = seed % 3 == 0 ? testing::random_hybrid_config(rng) : random_config(rng);
    const int64_t L = cfg.num_layers;
    ExecOptions o;
    o.activations = seed % 2 ? DType::bf16 : DType::f32;
    if (seed % 4 == 1) o.kernels = LayerKernels::cuda;  // bf16 storage: the CUDA block's buffers
    const MemoryTerms t = memory_terms(cfg, 2, 16, o);
    for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 3), random_plan(L, rng)}) {
      const std::vector<size_t> want = build_step_schedule(cfg, 2, 16, plan, o).memory.window_bytes;
      const std::vector<double> got = t.window_bytes(plan);
      ASSERT_EQ(got.size(), want.size());
      for (size_t w = 0; w < want.size(); ++w)
        EXPECT_EQ(got[w], double(want[w])) << "seed " << seed << " plan " << plan.to_json().dump() << " window " << w;
    }
  }
}

// Moving an operation moves the lifetimes of the buffers it uses: the head's weights uploaded at the start of the
// step are on the device through every forward window.
TEST(StepSchedule, AMovedOperationCarriesItsBuffersLifetimes) {
  Rng rng(5);
  const ModelConfig cfg = random_config(rng);
  const int64_t L = cfg.num_layers;
  const StepSchedule s = build_step_schedule(cfg, 2, 16, Plan::keep_all(L), ExecOptions{});
  const size_t head = s.buffer("head weights").bytes;
  StepSchedule moved = s;
  move_operation(moved, find_op(s, "h2d head"), find_op(s, "fwd L0"), forward_window(0));
  EXPECT_EQ(moved.buffer("head weights").first_window, forward_window(0));
  for (int w = 0; w < s.num_windows(); ++w)
    EXPECT_EQ(moved.memory.window_bytes[size_t(w)], s.memory.window_bytes[size_t(w)] + (w < L ? head : 0)) << w;
  // The head now waits for an earlier upload; nothing may wait for a later operation.
  EXPECT_LT(find_op(moved, "h2d head"), find_op(moved, "fwd L0"));
  StepSchedule bad = s;
  EXPECT_THROW(move_operation(bad, find_op(s, "h2d W0"), int(s.ops.size()), s.num_windows() - 1), Error);
  bad = s;
  EXPECT_THROW(move_operation(bad, find_op(s, "h2d head"), find_op(s, "fwd L0"), forward_window(1)), Error);
}

TEST(StepSchedule, RefusesTransferWindowsTheRingCannotHold) {
  Rng rng(9);
  ModelConfig cfg = random_config(rng);
  cfg.num_layers = 6;
  Plan p = Plan::every(6, 1, Tier::host);
  p.keep_internals.assign(6, false);
  // An offload spread over two windows holds its ring slot into the next window, which two slots do not allow.
  ExecOptions o;
  o.boundary_ring = 2;
  p.offload_parts.assign(7, {});
  p.offload_parts[1] = {{1, 0.5}, {2, 0.5}};
  EXPECT_THROW(build_step_schedule(cfg, 2, 16, p, o), Error);
}

}  // namespace
}  // namespace lt
