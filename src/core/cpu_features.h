// core/cpu_features.h — what the CPU can do, probed once; kernels choose their vector path from it.
#pragma once

namespace lt {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
};

// The probed features, masked by LT_CPU_MAX (env: "scalar", "avx2", "avx512") so tests can force
// each vector path and compare it with the plain one.
const CpuFeatures& cpu_features();
// Overrides the mask in-process (tests). Passing nullptr restores the probe.
void cpu_features_override(const CpuFeatures* forced);

}  // namespace lt
