// cuda/kernels_sim.cpp — the kernel sources compiled by the host compiler against cuda-sim, into
// lt::cuda::sim: every launch runs on the CPU before it returns (docs/cuda-sim.md).
#define LT_KERNELS_NS sim
#include "cuda/kernels/all.cuh"
