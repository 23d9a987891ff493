// What a device kind means (exec/backend.h): the layer compute, the activation storage, the reference policy, the
// kernels the host ops run on, the device; bad names and a GPU that is not there are errors that say why.
#include <gtest/gtest.h>

#include "core/error.h"
#include "cuda/cuda_device.h"
#include "cuda/sim_ops.h"
#include "exec/backend.h"

namespace lt {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Backend, DeviceKindsCarryTheirComputeStorageAndReference) {
  const Backend cpu = Backend::parse("cpu", "x"), cuda = Backend::parse("cuda", "x"), sim = Backend::parse("cuda-sim", "x");
  EXPECT_EQ(cpu.kind, DeviceKind::cpu);
  EXPECT_EQ(cuda.kind, DeviceKind::cuda);
  EXPECT_EQ(sim.kind, DeviceKind::cuda_sim);
  for (const std::string& name : Backend::names()) EXPECT_EQ(Backend::parse(name, "x").name(), name);
  EXPECT_EQ(cpu.layer_kernels(DType::bf16), LayerKernels::cpu);
  EXPECT_EQ(cuda.layer_kernels(DType::bf16), LayerKernels::cuda);
  EXPECT_EQ(sim.layer_kernels(DType::bf16), LayerKernels::cuda);  // what cuda runs
  EXPECT_EQ(sim.layer_kernels(DType::f32), LayerKernels::cpu);    // the CPU block on the kernels
  // The GPU stores bf16 whatever the GEMMs; the CPU and cuda-sim follow the compute type for auto.
  EXPECT_EQ(cuda.activation_storage("auto", ComputeType::f32, "x"), DType::bf16);
  EXPECT_EQ(cuda.activation_storage("bf16", ComputeType::f32, "x"), DType::bf16);
  EXPECT_EQ(cpu.activation_storage("auto", ComputeType::f32, "x"), DType::f32);
  EXPECT_EQ(sim.activation_storage("auto", ComputeType::bf16, "x"), DType::bf16);
  EXPECT_NE(error_of([&] { cuda.activation_storage("f32", ComputeType::f32, "--activation-dtype"); })
                .find("cuda stores bf16 activations"),
            std::string::npos);
  EXPECT_NE(error_of([] { Backend::parse("tpu", "--device"); }).find("--device tpu: the devices are cpu, cuda and cuda-sim"),
            std::string::npos);
  // A GPU has no in-memory path: keep-all is its reference; only it pins host memory.
  EXPECT_STREQ(cpu.reference_policy(), "in-memory");
  EXPECT_STREQ(sim.reference_policy(), "in-memory");
  EXPECT_STREQ(cuda.reference_policy(), "keep-all");
  EXPECT_TRUE(cuda.pins_host_memory());
  EXPECT_FALSE(cpu.pins_host_memory() || sim.pins_host_memory());
  std::string why;
  EXPECT_EQ(cuda.auto_compute(&why), ComputeType::bf16);
  EXPECT_NE(why.find("GPU"), std::string::npos) << why;
}

// The host ops run on the CUDA kernels while a cuda-sim scope lives, and go back when it ends; scopes nest.
TEST(Backend, KernelScopesRouteTheOpsAndRestore) {
  ASSERT_FALSE(cuda::using_cuda_sim_kernels());
  {
    const KernelScope sim = Backend::parse("cuda-sim", "x").kernels();
    EXPECT_TRUE(cuda::using_cuda_sim_kernels());
    {
      const KernelScope cpu = Backend::parse("cpu", "x").kernels();
      EXPECT_FALSE(cuda::using_cuda_sim_kernels());
    }
    EXPECT_TRUE(cuda::using_cuda_sim_kernels());
  }
  EXPECT_FALSE(cuda::using_cuda_sim_kernels());
}

TEST(Backend, OpensTheDevice) {
  auto dev = Backend::parse("cuda-sim", "x").open(size_t(1) << 20, {});
  EXPECT_FALSE(cuda::is_cuda_device(*dev));
  const Backend cuda = Backend::parse("cuda", "x");
  // An emulated link is the CPU device's; on a GPU the link is the hardware's.
  EXPECT_NE(error_of([&] { cuda.open(size_t(1) << 20, LinkSpec{10, 10, 0}); }).find("host-device link is the hardware's"),
            std::string::npos);
  // Without a GPU (here, and in every CI run): an error naming the reason, not a crash.
  std::unique_ptr<Device> gpu;
  const std::string why = error_of([&] { gpu = cuda.open(size_t(1) << 20, {}); });
  if (gpu) {
    EXPECT_TRUE(cuda::is_cuda_device(*gpu));
  } else {
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace lt
