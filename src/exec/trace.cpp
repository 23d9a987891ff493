#include "exec/trace.h"

#include <algorithm>
#include <map>

#include "io/json_file.h"

namespace lt {
namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// See StepSummary::phase_chain_s. Operations of one lane are recorded in that lane's execution order.
double phase_chain_seconds(const std::vector<OpRecord>& ops) {
  const OpRecord* head = nullptr;
  for (const OpRecord& op : ops)
    if (op.lane == "compute" && op.waited_on.empty() && starts_with(op.name, "head")) head = &op;
  if (!head) return 0;
  size_t last_head_upload = 0;  // index + 1 of the last h2d copy of the head's weights
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].lane == "h2d" && (starts_with(ops[i].name, "h2d head") || starts_with(ops[i].name, "h2d lm_head")))
      last_head_upload = i + 1;
  if (last_head_upload == 0)  // the head's weights stayed on the device: the uploads before the head
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].lane == "h2d" && ops[i].end <= head->start) last_head_upload = i + 1;
  double link = 0, after = 0, last_compute_end = head->end;
  for (size_t i = 0; i < last_head_upload; ++i)
    if (ops[i].lane == "h2d" && ops[i].bytes > 0 && ops[i].waited_on.empty()) link += ops[i].end - ops[i].start;
  for (const OpRecord& op : ops)
    if (op.lane == "compute" && op.waited_on.empty() && op.start >= head->end) {
      after += op.end - op.start;
      last_compute_end = std::max(last_compute_end, op.end);
    }
  double tail = 0;  // the shortest download that must follow the last compute
  for (const OpRecord& op : ops)
    if (op.lane == "d2h" && op.bytes > 0 && op.start >= last_compute_end)
      tail = tail == 0 ? op.end - op.start : std::min(tail, op.end - op.start);
  return link + (head->end - head->start) + after + tail;
}

}  // namespace

nlohmann::json StepSummary::to_json() const {
  return {{"compute_s", compute_s},         {"h2d_s", h2d_s},
          {"d2h_s", d2h_s},                 {"h2d_bytes", h2d_bytes},
          {"d2h_bytes", d2h_bytes},         {"nvme_s", nvme_s},
          {"nvme_read_bytes", nvme_read_bytes}, {"nvme_write_bytes", nvme_write_bytes},
          {"host_s", host_s},               {"optimizer_s", optimizer_s},               {"exposed_s", exposed_s},
          {"exposed_h2d_s", exposed_h2d_s}, {"exposed_d2h_s", exposed_d2h_s},
          {"exposed_other_s", exposed_other_s}, {"phase_chain_s", phase_chain_s},
          {"bound_s", bound_s}};
}

void TraceRecorder::record(const OpRecord& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back(op);
}

std::vector<OpRecord> TraceRecorder::ops() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_;
}

void TraceRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.clear();
}

StepSummary TraceRecorder::summarize() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StepSummary s;
  for (const OpRecord& op : ops_) {
    double d = op.end - op.start;
    if (!op.waited_on.empty()) {  // a wait: exposed time if it blocked the compute stream
      if (op.lane != "compute") continue;
      s.exposed_s += d;
      if (op.waited_on == "h2d") s.exposed_h2d_s += d;
      else if (op.waited_on == "d2h") s.exposed_d2h_s += d;
      else s.exposed_other_s += d;
      continue;
    }
    // On the copy lanes only copies (bytes > 0) are link time; host callbacks there (waiting for a
    // staging slot or an NVMe read) are not.
    if (op.lane == "compute") s.compute_s += d;
    else if (op.lane == "h2d" && op.bytes > 0) { s.h2d_s += d; s.h2d_bytes += op.bytes; }
    else if (op.lane == "d2h" && op.bytes > 0) { s.d2h_s += d; s.d2h_bytes += op.bytes; }
    else if (op.lane == "nvme") {
      s.nvme_s += d;
      if (op.name.rfind("read", 0) == 0) s.nvme_read_bytes += op.bytes;
      else s.nvme_write_bytes += op.bytes;
    } else if (op.lane == "host") s.host_s += d;
    else if (op.lane == "optimizer") s.optimizer_s += d;
  }
  s.phase_chain_s = phase_chain_seconds(ops_);
  s.bound_s = std::max({s.compute_s, s.h2d_s, s.d2h_s, s.phase_chain_s});
  return s;
}

nlohmann::json TraceRecorder::chrome_trace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  static const std::map<std::string, int> lane_ids = {{"compute", 1}, {"h2d", 2}, {"d2h", 3}, {"nvme", 4},
                                                      {"host", 5}, {"optimizer", 6}};
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [lane, id] : lane_ids)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id}, {"args", {{"name", lane}}}});
  for (const OpRecord& op : ops_) {
    auto it = lane_ids.find(op.lane);
    nlohmann::json args = {{"bytes", op.bytes}};
    if (op.layer >= 0) args["layer"] = op.layer;
    if (!op.waited_on.empty()) args["waited_on"] = op.waited_on;
    events.push_back({{"name", op.name},
                      {"cat", op.waited_on.empty() ? op.lane : "wait"},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", it == lane_ids.end() ? 9 : it->second},
                      {"ts", op.start * 1e6},
                      {"dur", (op.end - op.start) * 1e6},
                      {"args", args}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void TraceRecorder::write_chrome_trace(const std::string& path) const { write_json_file(path, chrome_trace(), -1); }

}  // namespace lt
