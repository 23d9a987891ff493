// exec/backend.cpp — device names to devices, layer compute and activation storage (exec/backend.h).
#include "exec/backend.h"

#include "core/error.h"
#include "cuda/cuda_device.h"
#include "cuda/layers.h"
#include "cuda/sim_ops.h"

namespace lt {

void check_device_name(const std::string& device, const std::string& what) {
  LT_CHECK(device == "cpu" || device == "cuda" || device == "cuda-sim",
           "{} {}: the devices are cpu, cuda and cuda-sim (`lazytrain devices` lists what this machine has)", what,
           device);
}

DType device_activation_storage(const std::string& device, const std::string& name, ComputeType compute,
                                const std::string& what) {
  check_device_name(device, what);
  if (device != "cuda") return activation_storage(name, compute, what);
  LT_CHECK(name == "auto" || name == "bf16",
           "{} cuda stores bf16 activations (the GPU block's storage): activation dtype '{}' is the CPU's; use bf16 "
           "or auto",
           what, name);
  return DType::bf16;
}

LayerKernels device_layer_kernels(const std::string& device, DType act) {
  if (device == "cuda") return LayerKernels::gpu;
  if (device == "cuda-sim" && act == DType::bf16) return LayerKernels::gpu;
  return LayerKernels::cpu;
}

std::vector<ComputeBuffer> layer_compute_buffers(LayerKernels kernels, const ModelConfig& cfg, const BlockShape& s,
                                                 DType matrices) {
  return kernels == LayerKernels::gpu ? cuda::gpu_compute_buffers(cfg, s, matrices) : cpu_compute_buffers(cfg, s);
}

std::unique_ptr<Device> open_device(const std::string& device, size_t capacity, LinkSpec link, int gpu) {
  check_device_name(device, "device");
  cuda::use_cuda_sim_kernels(device == "cuda-sim");
  if (device != "cuda") return make_cpu_device(capacity, link);
  LT_CHECK(link.h2d_gbps == 0 && link.d2h_gbps == 0 && link.latency_s == 0,
           "device cuda: the host-device link is the hardware's; an emulated link (--link-gbps, link_gbps) is for "
           "the cpu and cuda-sim devices");
  cuda::CudaDeviceOptions o;
  o.capacity = capacity;
  o.gpu = gpu;
  return cuda::make_cuda_device(o);
}

PinnedSlabs::~PinnedSlabs() {
  for (void* base : bases_) {
    try {
      device_.unpin_host(base);
    } catch (...) {  // a destructor must not throw; the device unpins what is left when it goes
    }
  }
}

void PinnedSlabs::pin(ModelSlabs& slabs, const std::string& what) {
  auto one = [&](SlabKind kind, int64_t layer, const std::string& name) {
    const size_t n = slabs.layout(kind, layer).bytes();
    uint8_t* base = slabs.slab(kind, layer);
    seconds_ += device_.pin_host(base, n, what + " " + name);
    bases_.push_back(base);
    bytes_ += n;
  };
  one(SlabKind::embedding, 0, "embedding");
  for (int64_t l = 0; l < slabs.config().num_layers; ++l) one(SlabKind::layer, l, "layer " + std::to_string(l));
  one(SlabKind::head, 0, "head");
}

}  // namespace lt
