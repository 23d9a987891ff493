// cuda/kernels/all.cuh — every kernel source, for the two translation units that compile them
// (cuda/kernels_sim.cpp, cuda/native/kernels.cu).
#pragma once

#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/attention_sinks.cuh"
#include "cuda/kernels/bias_grad.cuh"
#include "cuda/kernels/conv_l2norm.cuh"
#include "cuda/kernels/cross_entropy.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/embedding.cuh"
#include "cuda/kernels/gated_delta.cuh"
#include "cuda/kernels/linear_attention.cuh"
#include "cuda/kernels/lora.cuh"
#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/moe.cuh"
#include "cuda/kernels/rmsnorm.cuh"
#include "cuda/kernels/rope.cuh"
#include "cuda/kernels/short_conv.cuh"
