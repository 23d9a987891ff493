// exec/backend.h — what a device name (`--device`, the training config's `device:`) means: the Device the
// executor streams through, the layer compute it launches (model/layer_compute.h), and the activation storage.
//
//   cpu       the CPU device (an emulated accelerator: an arena, stream threads, an emulated link) and the CPU
//             block and head.
//   cuda      a CUDA device (cuda/cuda_device.h) and the GPU block and head (cuda/layers.h). The GPU stores bf16
//             activations: `auto` means bf16 whatever the GEMM dtype, f32 is refused. There is no in-memory path
//             on a GPU: the keep-all plan is its reference, and every plan gives its bits.
//   cuda-sim  the CPU device with the CUDA kernels emulated (cuda/sim_ops.h installs them under the host ops). At
//             bf16 activation storage the executor launches the GPU block and head under cuda-sim — what `cuda`
//             runs, on the CPU; at f32 storage (which the GPU block does not take) and on the in-memory path, the
//             CPU block's sequence of ops, each on its CUDA kernel.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"
#include "exec/working_set.h"
#include "model/layer_compute.h"
#include "model/weights.h"

namespace lt {

// lt::Error unless `device` is cpu, cuda or cuda-sim; `what` names the option ("--device", "device").
void check_device_name(const std::string& device, const std::string& what);

// The activation storage `name` (bf16, f32, auto) resolves to on `device` for GEMMs in `compute`.
DType device_activation_storage(const std::string& device, const std::string& name, ComputeType compute,
                                const std::string& what);

// The layer compute the executor launches on `device` at activation storage `act`.
LayerKernels device_layer_kernels(const std::string& device, DType act);

// The buffers the layer compute `kernels` keeps (model/layer_compute.h's list): the CPU block's, or the GPU block's.
std::vector<ComputeBuffer> layer_compute_buffers(LayerKernels kernels, const ModelConfig& cfg, const BlockShape& s,
                                                 DType matrices);

// Opens the device: for cpu and cuda-sim the CPU device with `capacity` bytes and `link`; for cuda GPU 0 with an
// arena of `capacity` bytes (the link is the hardware's: `link` must be unlimited). Also routes the host ops to the
// cuda-sim kernels for cuda-sim and back for the others (not while a step runs).
std::unique_ptr<Device> open_device(const std::string& device, size_t capacity, LinkSpec link, int gpu = 0);

// Model slabs the streams copy (the weights the device streams, the gradients it writes back) pinned on `device`
// (Device::pin_host; nothing on the CPU device) while this lives: declare it after the slabs and the device, so
// it unpins before either goes.
class PinnedSlabs {
 public:
  explicit PinnedSlabs(Device& device) : device_(device) {}
  ~PinnedSlabs();
  PinnedSlabs(const PinnedSlabs&) = delete;
  PinnedSlabs& operator=(const PinnedSlabs&) = delete;
  void pin(ModelSlabs& slabs, const std::string& what);  // every slab: embedding, layers, head
  double seconds() const { return seconds_; }
  size_t bytes() const { return bytes_; }

 private:
  Device& device_;
  std::vector<void*> bases_;
  double seconds_ = 0;
  size_t bytes_ = 0;
};

}  // namespace lt
