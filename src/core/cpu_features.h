// core/cpu_features.h — what the CPU can do, probed once; kernels choose their vector path from it.
//
// LT_MAX_ISA (environment: avx512 | avx2 | plain) caps what the probe reports, so one machine can run
// the paths another host would take: the AVX2-only EPYC hosts of many GPU servers, or the plain loops
// that every vector path is tested against. The GEMM library's own dispatch is capped to match
// (ops/cpu/gemm.cpp sets oneDNN's max ISA unless DNNL_MAX_CPU_ISA is set by the user).
#pragma once

#include <string>
#include <string_view>

namespace lt {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512vbmi = false;
};

// The widest instruction set the kernels may use.
enum class IsaLevel { plain, avx2, avx512 };

// The probed features, masked by LT_MAX_ISA.
const CpuFeatures& cpu_features();
// Overrides the mask in-process (tests). Passing nullptr restores the probe.
void cpu_features_override(const CpuFeatures* forced);

// The cap LT_MAX_ISA asks for (avx512 when unset). An unknown value is an error naming the variable.
IsaLevel max_isa_from_env();
// The level the active features reach: avx512 (F+BW+VL+FMA), avx2 (AVX2+FMA) or plain.
IsaLevel isa_level(const CpuFeatures& f);
std::string_view isa_name(IsaLevel level);
// Features masked down to `cap`.
CpuFeatures cap_features(CpuFeatures f, IsaLevel cap);

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 9654 96-Core Processor"), or "unknown".
std::string cpu_model_name();

}  // namespace lt
