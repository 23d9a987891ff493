#include "plan/plan_file.h"

#include <filesystem>

#include "io/json_file.h"
#include "io/paths.h"

namespace lt {

nlohmann::json plan_file_json(const Instance& in, const Plan& plan, const TransferWindows& windows,
                              const Prediction* pred) {
  Plan p = normalize_plan(plan);
  p.mlp_chunk_tokens = in.opt.exec.mlp_chunk_tokens;  // what the plan's memory was computed with
  nlohmann::json j = p.to_json();
  j["windows"] = windows.to_json(in);
  j["shape"] = {{"batch", in.B}, {"seq", in.T}, {"profile", in.profile_name}};
  if (pred)
    j["predicted"] = {{"step_s", pred->step_s},
                      {"iteration_s", pred->iteration_s},
                      {"tokens_per_s", pred->tokens_per_s(in)},
                      {"peak_device_bytes", pred->model_device_bytes},
                      {"executor_device_bytes", pred->executor_device_bytes},
                      {"host_act_bytes", pred->host_act_bytes},
                      {"nvme_bytes", pred->nvme_bytes}};
  return j;
}

void write_plan_file(const std::string& path, const Instance& in, const Plan& plan, const TransferWindows& windows,
                     const Prediction* pred) {
  write_json_file(path, plan_file_json(in, plan, windows, pred), 2);
}

Plan executable_plan(const Instance& in, const Plan& plan, const TransferWindows& windows) {
  Plan p = Plan::from_json(plan_file_json(in, plan, windows, nullptr), plan.name, in.L);
  p.validate_windows(in.L, in.opt.exec.boundary_ring);
  return p;
}

PolicyWithWindows load_policy(const std::string& spec, const Instance& in) {
  PolicyWithWindows p;
  p.plan = normalize_plan(Plan::parse(spec, in.L));
  p.windows = TransferWindows::natural(in, p.plan);
  if (path_exists(spec)) {
    const nlohmann::json j = read_json_file(spec);
    if (j.is_object() && j.contains("windows")) p.windows = TransferWindows::from_json(j["windows"], in, spec);
  }
  return p;
}

}  // namespace lt
