#include "core/cpu_features.h"

#include <cstdlib>
#include <string_view>

namespace lt {
namespace {

CpuFeatures probe() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  if (const char* cap = std::getenv("LT_CPU_MAX")) {
    std::string_view c(cap);
    if (c == "scalar") f = CpuFeatures{};
    if (c == "avx2") f.avx512f = f.avx512bw = f.avx512vl = f.avx512bf16 = false;
  }
  return f;
}

CpuFeatures probed = probe();
CpuFeatures active = probed;

}  // namespace

const CpuFeatures& cpu_features() { return active; }

void cpu_features_override(const CpuFeatures* forced) { active = forced ? *forced : probed; }

}  // namespace lt
