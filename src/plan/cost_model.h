// plan/cost_model.h — the planner's model of one step: a plan and its transfer windows -> time per window,
// step time, memory per window and per tier. The MILP (plan/milp.h) optimises exactly this function; the DP
// and brute force (plan/chain_dp.h) minimise it over the restricted chain problem; the simulator
// (plan/simulate.h) checks it against the executor's real dependencies.
//
// Per window w (docs/planner.md has the full formulation):
//   T_w = max( compute_w,  h2d_w / bw_h2d,  d2h_w / bw_d2h,  (h2d_w + d2h_w) / bw_both,
//              nvme_read_w / bw_r + nvme_write_w / bw_w,  host_w )
//   step = prologue + Σ_w T_w + fence + epilogue;   objective = step + exposed host optimizer.
// With the executor's head fence (a backward buffer packed into the head gradients' memory), B(L-1)'s compute
// waits for the head gradients' download: fence = HG / bw_d2h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/plan.h"
#include "plan/instance.h"

namespace lt {

// A share of one boundary's transfer placed in a window.
struct WindowPart {
  int window = 0;
  double fraction = 0;  // of the boundary's bytes
};

// When each activation transfer runs: per boundary (index 0..L), the windows of its offload (D2H),
// reload (H2D), NVMe write and NVMe read. Empty lists for transfers the plan does not make.
struct TransferWindows {
  std::vector<std::vector<WindowPart>> offload, reload, nvme_write, nvme_read;  // [L + 1]

  // Each transfer in its natural window: offload of boundary i in F(i) (the window after it is produced),
  // reload in the window before B(i), NVMe write with the offload, NVMe read with the reload.
  static TransferWindows natural(const Instance& in, const Plan& plan);
  // The "windows" field of a plan file (docs/planner.md): one entry per transfer part.
  nlohmann::json to_json(const Instance& in) const;
  static TransferWindows from_json(const nlohmann::json& j, const Instance& in, const std::string& source);
  bool is_natural(const Instance& in, const Plan& plan) const;
};

// Windows each transfer of boundary i may use (the MILP's choice set; natural only when restricted).
std::vector<int> offload_windows(const Instance& in, int64_t i);
std::vector<int> reload_windows(const Instance& in, int64_t i);
std::vector<int> nvme_write_windows(const Instance& in, int64_t i);
std::vector<int> nvme_read_windows(const Instance& in, int64_t i);

// For each layer k: if boundary k is the top of a dropped run (k dropped, k + 1 stored), the stored
// boundary the backward recomputes from (layers source .. k-1 run again in B(k)); else -1.
std::vector<int64_t> segment_sources(const Plan& plan);

struct WindowCost {
  double compute_s = 0, recompute_s = 0;
  double h2d_bytes = 0, d2h_bytes = 0;
  double nvme_read_bytes = 0, nvme_write_bytes = 0;
  double host_s = 0;
  double time_s = 0;
  std::string bound;          // the channel that sets time_s: compute, h2d, d2h, link, nvme, host
  double device_bytes = 0;    // lifetime model
  double host_bytes = 0;      // host-tier activations and NVMe staging
};

struct Prediction {
  bool feasible = true;
  std::vector<std::string> violations;  // why not, one sentence each
  double step_s = 0;               // forward + head + backward, as the executor's step measures it
  double optimizer_exposed_s = 0;  // host optimizer time the next forward cannot hide
  double iteration_s = 0;          // step_s + optimizer_exposed_s: the objective
  double prologue_s = 0, epilogue_s = 0;
  double fence_s = 0;              // after the head, before B(L-1) (Instance::head_fence): HG's download
  double compute_s = 0, recompute_s = 0;
  double h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;
  double exposed_h2d_s = 0, exposed_d2h_s = 0, exposed_link_s = 0, exposed_nvme_s = 0, exposed_host_s = 0;
  double lifetime_device_bytes = 0;   // max over windows, lifetime model
  double executor_window_bytes = 0;   // max over windows of the executor's working set, as the MILP writes it
  size_t executor_device_bytes = 0;   // predict_peak_device_bytes(): the packed block (0: what-if or restricted)
  double model_device_bytes = 0;      // what the instance's memory model constrains (max over windows)
  double host_act_bytes = 0, nvme_bytes = 0;
  double real_flops = 0;              // every forward, recompute, backward and head FLOP of the step
  std::vector<WindowCost> windows;

  double tokens_per_s(const Instance& in) const { return double(in.B * in.T) / iteration_s; }
  // The paper's convention: 6 · parameters · tokens / time (recompute not counted).
  double tflops_6nd(const Instance& in) const {
    return 6.0 * double(in.parameters) * double(in.B * in.T) / iteration_s / 1e12;
  }
  double tflops_real() const { return real_flops / iteration_s / 1e12; }
  nlohmann::json to_json(const Instance& in) const;
};

// The cost model for a plan (boundary 0 "drop" reads as "host") and its windows. Never throws for a
// well-formed plan: an infeasible one comes back with feasible = false and the reasons.
Prediction evaluate(const Instance& in, const Plan& plan, const TransferWindows& windows);
inline Prediction evaluate(const Instance& in, const Plan& plan) {
  return evaluate(in, plan, TransferWindows::natural(in, plan));
}

// Device bytes alive in each window under a memory model, as the MILP and the DP write them. For
// MemoryModel::executor this equals plan_working_set(...).window_bytes (tests/plan check it).
std::vector<double> window_device_bytes(const Instance& in, const Plan& plan, MemoryModel model);

}  // namespace lt
