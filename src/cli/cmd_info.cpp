// cli/cmd_info.cpp — `lazytrain info`: what this host gives the kernels, as the run will see it. The
// instruction set after LT_MAX_ISA, the bf16 GEMM route (native, or widened to f32 where oneDNN has no bf16
// matmul), the optimizer's vector path, threads. Scripts (make demo) read --json to size their work.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <dnnl.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "optim/kernels.h"

namespace lt::cli {
namespace {

void run_info(bool json) {
  const CpuFeatures& f = cpu_features();
  const dnnl_version_t* v = dnnl_version();
  const char* cap = std::getenv("LT_MAX_ISA");
  nlohmann::json j = {{"cpu", cpu_model_name()},
                      {"vector_path", isa_name(isa_level(f))},
                      {"max_isa", cap && *cap ? cap : "unset"},
                      {"avx512_bf16", f.avx512bf16},
                      {"avx512_vbmi", f.avx512vbmi},
                      {"gemm_bf16", bf16_route_name(gemm_bf16_route())},
                      {"optimizer_path", vector_path_name(best_vector_path())},
                      {"threads", num_threads()},
                      {"onednn", fmt::format("{}.{}.{}", v->major, v->minor, v->patch)}};
  if (json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("cpu:            %s\n", j["cpu"].get<std::string>().c_str());
  std::printf("kernels:        %s (LT_MAX_ISA %s)\n", j["vector_path"].get<std::string>().c_str(),
              j["max_isa"].get<std::string>().c_str());
  std::printf("bf16 GEMM:      %s (oneDNN %s)\n", j["gemm_bf16"].get<std::string>().c_str(),
              j["onednn"].get<std::string>().c_str());
  std::printf("optimizer path: %s\n", j["optimizer_path"].get<std::string>().c_str());
  std::printf("threads:        %d\n", num_threads());
}

}  // namespace

void register_info(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("info", "this host's kernel paths: instruction set, bf16 GEMM route, threads");
  cmd->add_flag("--json", *json, "one JSON line");
  cmd->callback([json]() { run_info(*json); });
}

}  // namespace lt::cli
