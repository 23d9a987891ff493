// exec/backend.h — what a device kind (`--device`, the training config's `device:`) means, parsed once into a
// Backend that carries its defaults: the Device the executor streams through, the layer compute it launches
// (model/layer_compute.h), the activation storage, the GEMM dtype `auto` picks, and the reference policy.
//
//   cpu       the CPU device (an emulated accelerator: an arena, stream threads, an emulated link) and the CPU
//             block and head.
//   cuda      a CUDA device (cuda/cuda_device.h) and the CUDA block and head (cuda/layers.h). It stores bf16
//             activations: `auto` means bf16 whatever the GEMM dtype, f32 is refused. There is no in-memory path
//             on a GPU: the keep-all plan is its reference, and every plan gives its bits.
//   cuda-sim  the CPU device with the CUDA kernels emulated (cuda/sim_ops.h routes the host ops to them while a
//             Backend::kernels() scope lives). At bf16 activation storage the executor launches the CUDA block and
//             head under cuda-sim — what `cuda` runs, on the CPU; at f32 storage (which the CUDA block does not take)
//             and on the in-memory path, the CPU block's sequence of ops, each on its CUDA kernel.
//
// Nothing outside this file and the parsers compares device names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "exec/working_set.h"
#include "model/layer_compute.h"
#include "model/weights.h"

namespace lt {

enum class DeviceKind : uint8_t { cpu, cuda, cuda_sim };

// While it lives, the host ops run on the kernels of the backend that made it (cuda-sim: the CUDA kernels under
// cuda-sim; cpu and cuda: the CPU ops, for the host's own work); the previous routing is restored when it goes.
class KernelScope {
 public:
  explicit KernelScope(bool cuda_sim);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  bool previous_;
};

struct Backend {
  DeviceKind kind = DeviceKind::cpu;

  // lt::Error naming `what` (the option: "--device", "device") unless `name` is cpu, cuda or cuda-sim.
  static Backend parse(const std::string& name, const std::string& what);
  static std::vector<std::string> names();  // "cpu", "cuda", "cuda-sim"
  const char* name() const;

  // The GEMM dtype `compute_dtype: auto` means: bf16 on a GPU's tensor cores; on the CPU (and cuda-sim) bf16 where
  // the host's bf16 GEMM is native, else f32 (ops/gemm.h widens bf16 operands there). `why` says which and why.
  ComputeType auto_compute(std::string* why) const;
  // The activation storage `asked` (bf16, f32, auto) resolves to for GEMMs in `compute`; `what` names the option.
  DType activation_storage(const std::string& asked, ComputeType compute, const std::string& what) const;
  // The layer compute the executor launches at activation storage `act`.
  LayerKernels layer_kernels(DType act) const;
  // The reference path: the in-memory model where there is one (cpu, cuda-sim), else the keep-all plan (cuda).
  bool has_in_memory_path() const { return kind != DeviceKind::cuda; }
  const char* reference_policy() const { return has_in_memory_path() ? "in-memory" : "keep-all"; }
  // Whether the host memory the streams copy is worth pinning (a GPU's DMA; the CPU device copies with memcpy).
  bool pins_host_memory() const { return kind == DeviceKind::cuda; }

  // Opens the device: for cpu and cuda-sim the CPU device with `capacity` bytes and `link`; for cuda GPU `gpu` with
  // an arena of `capacity` bytes (the link is the hardware's: `link` must be unlimited). Under cuda-sim, run its
  // work inside kernels().
  std::unique_ptr<Device> open(size_t capacity, LinkSpec link, int gpu = 0) const;
  // The routing of the host ops for this backend's work (see KernelScope).
  KernelScope kernels() const { return KernelScope(kind == DeviceKind::cuda_sim); }
};

// The buffers the layer compute `kernels` keeps (model/layer_compute.h's list): the CPU block's, or the CUDA block's.
std::vector<ComputeBuffer> layer_compute_buffers(LayerKernels kernels, const ModelConfig& cfg, const BlockShape& s,
                                                 DType matrices);

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
