// plan/planner.h — the planner end to end: baselines, the exact chain DP, the MILP warm-started from the
// best of them, validation against the executor's memory function, and the batch search.
//
// plan/ owns (one header each):
//   profile.h     measured or derived costs of a machine (JSON)      hardware.h   built-in machines, FLOPs
//   measure.h     `lazytrain profile` on a device                     instance.h   one planning problem
//   cost_model.h  windows -> step time and memory (the model)        chain_dp.h   exact DP + brute force
//   milp.h        the MILP on CBC                                     simulate.h   discrete-event simulator
//   planner.h     this file                                           plan_file.h  plan JSON with windows
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/chain_dp.h"
#include "plan/cost_model.h"
#include "plan/instance.h"
#include "plan/milp.h"
#include "plan/profile.h"

namespace lt {

struct PlanRequest {
  ModelConfig cfg;
  std::string model_name;
  int64_t B = 1, T = 1;
  Profile profile;
  Budgets budget;
  InstanceOptions options;
  MilpOptions milp;
  int64_t dp_work_limit = 400'000'000;  // edge relaxations; beyond it the DP is skipped (reported)
  // Tokens per MLP chunk (model/block.h): -1 chooses from the budget (choose_mlp_chunk), 0 runs the MLP in one
  // chunk, anything else is taken as given. Resolved into options.exec.mlp_chunk_tokens.
  int64_t mlp_chunk_tokens = -1;
};

// The MLP chunk for a shape and a device budget: one chunk (0) when the MLP's chunk-sized scratch for the
// whole batch — gate, up, h and their gradients, 6 · N · I f32 — is at most an eighth of the budget, else the
// largest power-of-two multiple of kTokenSlice whose scratch is (at least kTokenSlice). The chunk changes
// memory, not bits; GEMMs of kTokenSlice rows already run at full rate, so the rest of the budget is better
// spent keeping activations.
int64_t choose_mlp_chunk(const ModelConfig& cfg, int64_t B, int64_t T, size_t device_bytes);

struct PlanCandidate {
  std::string name;
  Plan plan;
  TransferWindows windows;
  Prediction prediction;
};

struct PlanReport {
  Instance instance;
  SolveStatus status = SolveStatus::error;
  std::string message;
  double solve_s = 0, gap = 0, bound = 0;
  std::string proof;                      // "cbc", or "chain-dp" when the exact DP proved the optimum
  bool found = false;
  PlanCandidate best;                     // "lazytrain"
  std::vector<PlanCandidate> baselines;   // keep-all, every:1, every:4, host:1
  ChainResult dp;                         // the restricted optimum (when run)
  bool dp_run = false;
  double milp_objective = 0;              // the MILP's own prediction for `best`
  size_t executor_device_bytes = 0;       // predict_peak_device_bytes(best.plan) (0 under a what-if)
  int resolves = 0;                       // re-solves with a tightened budget after the executor's check
  std::vector<std::string> notes;
  nlohmann::json to_json() const;
  std::string table() const;              // the human-readable report
};

// Plans one step. Throws lt::Error with what would be needed when no plan can fit.
PlanReport make_plan(const PlanRequest& request);

// The least device memory any plan needs at this shape, given the host and NVMe budgets (the executor's
// static working set with everything it can offload offloaded and the shortest recompute runs), and a
// sentence saying what it is made of.
struct MemoryNeed {
  double device_bytes = 0;
  std::string breakdown;
};
MemoryNeed minimum_device_memory(const Instance& in);

struct BatchSearch {
  int64_t max_batch = 0;        // the largest batch with a feasible plan (0: none)
  int64_t best_batch = 0;       // the batch with the best predicted tokens/s (restricted DP)
  double best_tokens_per_s = 0;
  std::vector<std::pair<int64_t, double>> curve;  // (batch, tokens/s) evaluated
  nlohmann::json to_json() const;
};
// Searches B in [1, limit] at the request's T, budgets and profile (profiles re-targeted per batch).
BatchSearch search_batch(const PlanRequest& request, int64_t limit);

}  // namespace lt
