// optim/optim.h — what the optimizer module owns, in one include.
//
//   quant_map.h  the dynamic (tree) quantisation maps of bitsandbytes and the exact nearest-code lookup
//   kernels.h    the fused AdamW kernels (f32 and blockwise 8-bit states) and gradient accumulation:
//                plain C++ (the specification), AVX2 and AVX-512, bit-identical, chosen at run time
//   clip.h       gradient accumulation returning partial sums of squares; global norm; clip coefficient
//   adamw.h      per-slab optimizer state (f32 or 8-bit per tensor), the fused per-slab update, the step
//                plan (skip on a non-finite norm, clipping), state report, checkpoint save/load
//
// docs/optimizer.md has the design, the math and the measured figures.
#pragma once

#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/kernels.h"
#include "optim/quant_map.h"
