// plan/simulate.h — a discrete-event simulator of one executor step: the executor's own schedule of the step
// (exec/step_schedule.h: its operations on the streams and host lanes, in its order, with its deps), timed with
// the instance's costs. Each lane runs in order, an operation starting when its lane is free and its deps are
// done; copies in the two directions share the link at the profile's duplex rates while both are busy.
//
// It predicts the step time, exposed time per link (the compute lane waiting on each), the executor's peak
// device memory (the schedule's working set), host activation memory and NVMe space.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/plan.h"
#include "exec/step_schedule.h"
#include "plan/cost_model.h"
#include "plan/instance.h"

namespace lt {

struct SimOpRecord {
  std::string name, lane;  // lane: compute, h2d, d2h, host, nvme
  int layer = -1;
  double start = 0, end = 0;
  double bytes = 0;
};

struct SimResult {
  double step_s = 0;                // first operation to the last (host work included), as StepStats::step_s
  double optimizer_exposed_s = 0;   // host optimizer the next step's uploads would wait for
  double iteration_s = 0;
  double compute_s = 0, recompute_s = 0;
  double h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;
  double h2d_busy_s = 0, d2h_busy_s = 0, host_busy_s = 0;
  // Compute lane blocked, by the lane of the dependency that ended last.
  double exposed_s = 0, exposed_h2d_s = 0, exposed_d2h_s = 0, exposed_host_s = 0, exposed_nvme_s = 0;
  size_t peak_device_bytes = 0;     // the executor's working set: the packed block it allocates
  double window_device_bytes = 0;   // its largest window (the packing can leave holes above it)
  double lifetime_device_bytes = 0; // the cost model's lifetime peak, for comparison
  double host_act_bytes = 0, nvme_bytes = 0;
  std::vector<SimOpRecord> ops;     // filled when asked (trace)
  nlohmann::json to_json() const;
  nlohmann::json chrome_trace() const;
};

struct SimOptions {
  bool record_ops = false;
};

SimResult simulate(const Instance& in, const Plan& plan, const TransferWindows& windows, const SimOptions& o = {});
// One schedule as it is (with the update operations it has, if any): step_s and iteration_s are its length.
SimResult simulate_schedule(const Instance& in, const StepSchedule& schedule, const SimOptions& o = {});
inline SimResult simulate(const Instance& in, const Plan& plan, const SimOptions& o = {}) {
  return simulate(in, plan, TransferWindows::natural(in, plan), o);
}

}  // namespace lt
