// plan/measure.h — `lazytrain profile`: measure a Profile on the device at the real shapes.
//
// Everything runs through the paths the executor uses: the device's layer compute (model/layer_compute.h: the
// CPU block, or the CUDA block on a CUDA device) launched on its compute stream (times from the device's own operation
// records) with its buffers as it declares them for the executor, copies through
// the device's copy engine (on the CPU device: the emulated link, so what is measured is that link), gradient
// accumulation on a HostWorker, the host optimizer's fused update (optim/adamw.h) and NVMe through the
// executor's NvmeStore (its probe).
#pragma once

#include <string>
#include <vector>

#include "device/device.h"
#include "exec/backend.h"
#include "model/config.h"
#include "ops/linear.h"
#include "plan/profile.h"

namespace lt {

struct MeasureOptions {
  Backend backend;                          // cpu, cuda or cuda-sim (exec/backend.h)
  int gpu = 0;                              // cuda: the device index (a data-parallel rank's local GPU)
  size_t device_memory = size_t(8) << 30;  // the emulated device's capacity (and the profile's default budget)
  LinkSpec link;                           // the emulated link (0 = unlimited)
  ComputeType compute = ComputeType::f32;
  DType activations = DType::f32;  // activation storage (model/block.h)
  int reps = 3;                            // repetitions per measurement (the fastest is kept)
  std::string nvme_dir;                    // empty: NVMe not measured
  size_t nvme_probe_bytes = size_t(256) << 20;
  bool optimizer = true;                   // measure the host optimizer on one layer slab
  uint64_t seed = 1;
  std::string model_name;                  // for the profile's "model" field
};

Profile measure_profile(const ModelConfig& cfg, int64_t B, int64_t T, const MeasureOptions& o);

// The model a profile measures: one layer per (token mixer, dense or sparse MLP) kind `cfg` has, in first-seen
// order; proto[l] (written, [L]) is the prototype measured for cfg's layer l, of the same mixer and MLP kind.
ModelConfig profile_prototypes(const ModelConfig& cfg, std::vector<int64_t>* proto);

}  // namespace lt
