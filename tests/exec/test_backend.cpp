// What a device name means (exec/backend.h): the layer compute, the activation storage, the device; bad names
// and a GPU that is not there are errors that say why.
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

TEST(Backend, DeviceNamesMapToTheirComputeAndStorage) {
  EXPECT_EQ(device_layer_kernels("cpu", DType::bf16), LayerKernels::cpu);
  EXPECT_EQ(device_layer_kernels("cuda", DType::bf16), LayerKernels::gpu);
  EXPECT_EQ(device_layer_kernels("cuda-sim", DType::bf16), LayerKernels::gpu);  // what cuda runs
  EXPECT_EQ(device_layer_kernels("cuda-sim", DType::f32), LayerKernels::cpu);   // the CPU block on the kernels
  // The GPU stores bf16 whatever the GEMMs; the CPU and cuda-sim follow the compute type for auto.
  EXPECT_EQ(device_activation_storage("cuda", "auto", ComputeType::f32, "x"), DType::bf16);
  EXPECT_EQ(device_activation_storage("cuda", "bf16", ComputeType::f32, "x"), DType::bf16);
  EXPECT_EQ(device_activation_storage("cpu", "auto", ComputeType::f32, "x"), DType::f32);
  EXPECT_EQ(device_activation_storage("cuda-sim", "auto", ComputeType::bf16, "x"), DType::bf16);
  EXPECT_NE(error_of([] { device_activation_storage("cuda", "f32", ComputeType::f32, "--activation-dtype"); })
                .find("cuda stores bf16 activations"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_device_name("tpu", "--device"); }).find("--device tpu: the devices are cpu, cuda and cuda-sim"),
            std::string::npos);
}

TEST(Backend, OpensTheDeviceAndRoutesTheOps) {
  auto dev = open_device("cuda-sim", size_t(1) << 20, {});
  EXPECT_TRUE(cuda::using_cuda_sim_kernels());
  EXPECT_FALSE(cuda::is_cuda_device(*dev));
  dev = open_device("cpu", size_t(1) << 20, {});
  EXPECT_FALSE(cuda::using_cuda_sim_kernels());
  // An emulated link is the CPU device's; on a GPU the link is the hardware's.
  EXPECT_NE(error_of([] { open_device("cuda", size_t(1) << 20, LinkSpec{10, 10, 0}); }).find("host-device link is the hardware's"),
            std::string::npos);
  // Without a GPU (here, and in every CI run): an error naming the reason, not a crash.
  std::unique_ptr<Device> gpu;
  const std::string why = error_of([&] { gpu = open_device("cuda", size_t(1) << 20, {}); });
  if (gpu) {
    EXPECT_TRUE(cuda::is_cuda_device(*gpu));
  } else {
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace lt
