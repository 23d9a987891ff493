#include "core/cpu_features.h"

#include <fstream>

#include <cstdlib>

#include "core/error.h"

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
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
  return f;
}

// Probed once, before main: a bad LT_MAX_ISA is reported where it is first asked for (max_isa_from_env),
// not here, so the static initialiser cannot throw.
IsaLevel env_cap_or_default() {
  try {
    return max_isa_from_env();
  } catch (...) {
    return IsaLevel::avx512;
  }
}

CpuFeatures probed = cap_features(probe(), env_cap_or_default());
CpuFeatures active = probed;

}  // namespace

const CpuFeatures& cpu_features() { return active; }

void cpu_features_override(const CpuFeatures* forced) { active = forced ? *forced : probed; }

IsaLevel max_isa_from_env() {
  const char* cap = std::getenv("LT_MAX_ISA");
  if (!cap || !*cap) return IsaLevel::avx512;
  const std::string_view c(cap);
  if (c == "avx512") return IsaLevel::avx512;
  if (c == "avx2") return IsaLevel::avx2;
  if (c == "plain") return IsaLevel::plain;
  LT_FAIL("LT_MAX_ISA={}: expected avx512, avx2 or plain", c);
}

IsaLevel isa_level(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.fma) return IsaLevel::avx512;
  if (f.avx2 && f.fma) return IsaLevel::avx2;
  return IsaLevel::plain;
}

std::string_view isa_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::avx512: return "avx512";
    case IsaLevel::avx2: return "avx2";
    case IsaLevel::plain: return "plain";
  }
  return "?";
}

CpuFeatures cap_features(CpuFeatures f, IsaLevel cap) {
  if (cap == IsaLevel::plain) return CpuFeatures{};
  if (cap == IsaLevel::avx2) f.avx512f = f.avx512bw = f.avx512vl = f.avx512bf16 = f.avx512vbmi = false;
  return f;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace lt
