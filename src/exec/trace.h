// exec/trace.h — what happened during a step: every operation on its lane (compute, h2d, d2h, nvme,
// host, optimizer), written as Chrome trace JSON (chrome://tracing, Perfetto) and summarised per lane.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"

namespace lt {

// Per-step totals measured from the operations themselves.
struct StepSummary {
  double compute_s = 0;     // busy time of the compute stream (waits excluded)
  double h2d_s = 0, d2h_s = 0;
  size_t h2d_bytes = 0, d2h_bytes = 0;
  double nvme_s = 0;
  size_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  double host_s = 0;        // host lane: gradient accumulation, embedding backward
  double optimizer_s = 0;   // optimizer lane: the previous step's update, pipelined into the forward
  double exposed_s = 0;     // time the compute stream sat blocked on transfers
  double exposed_h2d_s = 0, exposed_d2h_s = 0, exposed_other_s = 0;
  // A lower bound on the step's length for any schedule of these same operations (their measured
  // durations): max(compute, h2d, d2h) and the chain the step's dependencies force — every upload the
  // head needs (all of the forward's, in h2d order up to the head's weights, or up to the head when its
  // weights stayed on the device from the previous micro-batch), then the head, then every
  // compute operation after it (the backward), then the last gradient download. The phases make it
  // larger than max(compute, transfer) when the forward is link-bound and the backward compute-bound.
  double phase_chain_s = 0;
  double bound_s = 0;
  nlohmann::json to_json() const;
};

class TraceRecorder : public OpSink {
 public:
  void record(const OpRecord& op) override;
  std::vector<OpRecord> ops() const;
  void clear();
  StepSummary summarize() const;
  // Chrome trace JSON: one track per lane, every operation with its layer and bytes.
  nlohmann::json chrome_trace() const;
  void write_chrome_trace(const std::string& path) const;

 private:
  mutable std::mutex mutex_;
  std::vector<OpRecord> ops_;
};

}  // namespace lt
