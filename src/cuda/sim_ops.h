// cuda/sim_ops.h — `--device cuda-sim`: the ops of a step run on the CUDA kernels under cuda-sim.
//
// Installs an OpsOverride (ops/override.h) whose every op calls the kernel launchers of lt::cuda::sim (and
// the emulated cuBLASLt calls of cuda/gemm.h) on the op's own host buffers, so the in-memory path, the
// streaming executor with every plan, the profiler and training run the kernel sources end to end, with the
// CPU device's memory, streams and copies. The block's sequence of ops (model/block.cpp) stays the one the
// CPU runs; what changes is every kernel and GEMM under it. Deterministic: the kernels use no atomics and
// the emulated GEMM's rows do not depend on how many there are, so every plan gives the in-memory path's bits
// here as on the CPU.
#pragma once

namespace lt::cuda {

// Routes the ops to the cuda-sim kernels (true) or back to the CPU ops (false). Not while a step runs.
void use_cuda_sim_kernels(bool on);
bool using_cuda_sim_kernels();

// The same routing to the native kernels on GPU 0, each call copying its operands to the device and its results back
// (cuda/native/native_ops.cpp): the op table's native rows. Only with a GPU (cuda_native_available) in a CUDA
// build; without CUDA, use_cuda_native_kernels(true) is an lt::Error.
bool cuda_native_available();
void use_cuda_native_kernels(bool on);

}  // namespace lt::cuda
