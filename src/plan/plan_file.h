// plan/plan_file.h — plan files as the planner writes them: the executor's format (docs/plan-format.md) plus
// an optional "windows" list (when each activation transfer runs) and a "predicted" summary. The executor
// runs the host-tier offload/reload windows (Plan::offload_parts / reload_parts) and paces NVMe itself.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "exec/plan.h"
#include "plan/cost_model.h"
#include "plan/instance.h"

namespace lt {

nlohmann::json plan_file_json(const Instance& in, const Plan& plan, const TransferWindows& windows,
                              const Prediction* prediction);
void write_plan_file(const std::string& path, const Instance& in, const Plan& plan, const TransferWindows& windows,
                     const Prediction* prediction);

// The plan the executor runs: `plan` with the host-tier transfer windows attached, exactly as a plan file
// written by write_plan_file reads back.
Plan executable_plan(const Instance& in, const Plan& plan, const TransferWindows& windows);

// A policy as the executor's --policy takes it (keep-all, every:K, host:K, nvme:K or a plan file), with the
// file's "windows" if it has them, else the natural windows.
struct PolicyWithWindows {
  Plan plan;
  TransferWindows windows;
};
PolicyWithWindows load_policy(const std::string& spec, const Instance& in);

}  // namespace lt
