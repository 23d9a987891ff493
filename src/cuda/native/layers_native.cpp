// cuda/native/layers_native.cpp — the composite ops (cuda/layers.h) on nvcc's kernels and cuBLASLt (host code,
// compiled by the host compiler; built only with CUDA).
#define LT_KERNELS_NS native
#define LT_LAYERS_NATIVE 1
#include "cuda/layers/block.inl"
#include "cuda/layers/head.inl"
#include "cuda/layers/compute.inl"
