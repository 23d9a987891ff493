// cuda/native/kernels.cu — the kernel sources compiled by nvcc into lt::cuda::native (built only when CMake
// finds nvcc; flags in CMakeLists.txt: -fmad=false so products and sums round as the CPU ops').
#define LT_KERNELS_NS native
#include "cuda/kernels/all.cuh"
