// train/settings.h — a training config resolved into typed settings before anything runs: the device kind and
// what `auto` means on it (GEMM dtype, activation storage), the executor's options, the batch shape, the budgets,
// the checkpoint to resume from; and the host-memory arithmetic the start-up check and the plan's check share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "device/device.h"
#include "exec/backend.h"
#include "exec/working_set.h"
#include "model/config.h"
#include "optim/adamw.h"
#include "train/config.h"

namespace lt {

class Comm;

struct TrainSettings {
  TrainConfig c;             // the config, compute_dtype and activation_dtype resolved (as checkpoints record them)
  Backend backend;           // the device kind, parsed once
  std::string compute_why;   // why `compute_dtype: auto` chose what it did ("" when the config named one)
  ComputeType compute = ComputeType::f32;
  DType activations = DType::f32;
  ExecOptions exec;          // the executor's options (the MLP chunk comes with the plan)
  int64_t B = 0, T = 0;      // the largest batch shape: rows per micro-batch, tokens per row
  size_t device_bytes = 0;   // device_memory
  LinkSpec link;             // the emulated link (cpu, cuda-sim)
  std::string resume_dir;    // the checkpoint to resume from; empty: a new run
  int rank = 0, ranks = 1;   // data parallel (dist/comm.h)
  int gpu = 0;               // this rank's GPU (its local rank)
  bool lead() const { return rank == 0; }
};

// Resolves `asked` on this machine and checks what can be checked before any file is written or weight read (the
// host memory the parameters alone need). Throws naming the key on a value that cannot work.
TrainSettings resolve_train_settings(const TrainConfig& asked, const Comm& comm);

// The optimizer's settings from the config.
AdamWConfig adamw_config(const TrainConfig& c);
// The host memory the run may use: host_memory, or MemAvailable (0: unknown, unchecked); and what it is called.
size_t host_memory_budget(const TrainConfig& c);
const char* host_memory_name(const TrainConfig& c);
// Host bytes a rank keeps for the parameters at its peak (masters, gradients, compute copy, optimizer states).
double host_parameter_bytes(const TrainConfig& c, const ModelConfig& mc, int ranks, bool from_scratch);

}  // namespace lt
