// exec/backend.cpp — device kinds to devices, layer compute, kernels and storage (exec/backend.h).
#include "exec/backend.h"

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/error.h"
#include "ops/gemm.h"
#include "cuda/cuda_device.h"
#include "cuda/layers.h"
#include "cuda/sim_ops.h"

namespace lt {

KernelScope::KernelScope(bool cuda_sim) : previous_(cuda::using_cuda_sim_kernels()) {
  cuda::use_cuda_sim_kernels(cuda_sim);
}

KernelScope::~KernelScope() { cuda::use_cuda_sim_kernels(previous_); }

Backend Backend::parse(const std::string& name, const std::string& what) {
  if (name == "cpu") return Backend{DeviceKind::cpu};
  if (name == "cuda") return Backend{DeviceKind::cuda};
  if (name == "cuda-sim") return Backend{DeviceKind::cuda_sim};
  LT_FAIL("{} {}: the devices are cpu, cuda and cuda-sim (`lazytrain devices` lists what this machine has)", what, name);
}

std::vector<std::string> Backend::names() { return {"cpu", "cuda", "cuda-sim"}; }

const char* Backend::name() const {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
    case DeviceKind::cuda_sim: return "cuda-sim";
  }
  return "?";
}

ComputeType Backend::auto_compute(std::string* why) const {
  if (kind == DeviceKind::cuda) {  // tensor cores: bf16 GEMMs with f32 accumulation
    *why = " (compute_dtype: auto; bf16 on the GPU)";
    return ComputeType::bf16;
  }
  const Bf16Route route = gemm_bf16_route();
  *why = fmt::format(" (compute_dtype: auto; bf16 GEMM on this host ({}): {})", isa_name(isa_level(cpu_features())),
                     bf16_route_name(route));
  return route == Bf16Route::native ? ComputeType::bf16 : ComputeType::f32;
}

DType Backend::activation_storage(const std::string& asked, ComputeType compute, const std::string& what) const {
  if (kind != DeviceKind::cuda) return lt::activation_storage(asked, compute, what);
  LT_CHECK(asked == "auto" || asked == "bf16",
           "{} cuda stores bf16 activations (the CUDA block's storage): activation dtype '{}' is the CPU's; use bf16 "
           "or auto",
           what, asked);
  return DType::bf16;
}

LayerKernels Backend::layer_kernels(DType act) const {
  if (kind == DeviceKind::cuda) return LayerKernels::cuda;
  if (kind == DeviceKind::cuda_sim && act == DType::bf16) return LayerKernels::cuda;
  return LayerKernels::cpu;
}

std::vector<ComputeBuffer> layer_compute_buffers(LayerKernels kernels, const ModelConfig& cfg, const BlockShape& s,
                                                 DType matrices) {
  return kernels == LayerKernels::cuda ? cuda::cuda_compute_buffers(cfg, s, matrices) : cpu_compute_buffers(cfg, s);
}

std::unique_ptr<Device> Backend::open(size_t capacity, LinkSpec link, int gpu) const {
  if (kind != DeviceKind::cuda) return make_cpu_device(capacity, link);
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
