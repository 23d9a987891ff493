// cli/cmd_devices.cpp — `lazytrain devices`: the devices this binary can run on. cpu (the emulated
// accelerator on host memory: always), cuda (built or not; the driver's GPUs with memory and compute
// capability) and cuda-sim (the CUDA kernels emulated on the CPU: always). --json prints one object keyed by
// those names, for scripts (make gpu-check reads it).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "cuda/devices.h"
#include "cuda_sim/cuda_sim.h"
#include "device/device.h"
#include "ops/gemm.h"

namespace lt::cli {
namespace {

nlohmann::json devices_json() {
  const size_t host_bytes = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
  nlohmann::json cpu = {{"available", true},
                        {"name", cpu_model_name()},
                        {"vector_path", isa_name(isa_level(cpu_features()))},
                        {"bf16_gemm", bf16_route_name(gemm_bf16_route())},
                        {"threads", num_threads()},
                        {"memory_bytes", host_bytes}};
  const cuda::CudaInventory inv = cuda::query_cuda();
  nlohmann::json gpus = nlohmann::json::array();
  for (const cuda::GpuInfo& g : inv.devices)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"memory_bytes", g.total_bytes},
                    {"free_bytes", g.free_bytes},
                    {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
                    {"multiprocessors", g.multiprocessors},
                    {"pci_bus_id", g.pci_bus_id},
                    {"supported", g.supported}});
  nlohmann::json cuda = {{"built", inv.built}, {"devices", gpus}};
  if (inv.built) {
    cuda["architectures"] = inv.architectures;
    cuda["runtime"] = inv.runtime_version;
    cuda["driver"] = inv.driver_version;
  }
  if (!inv.error.empty()) cuda["error"] = inv.error;
  nlohmann::json sim = {{"available", true},
                        {"warp_size", warpSize},
                        {"max_threads_per_block", 1024},
                        {"max_dynamic_shared_bytes", cuda_sim::kMaxDynamicSharedBytes},
                        {"thread_order", cuda_sim::order_name(cuda_sim::default_order().order)}};
  return {{"cpu", cpu}, {"cuda", cuda}, {"cuda-sim", sim}};
}

void run_devices(bool json) {
  const nlohmann::json j = devices_json();
  if (json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const auto& cpu = j["cpu"];
  std::printf("cpu       %s, %s kernels, bf16 GEMM %s, %d threads, %s host memory\n",
              cpu["name"].get<std::string>().c_str(), cpu["vector_path"].get<std::string>().c_str(),
              cpu["bf16_gemm"].get<std::string>().c_str(), cpu["threads"].get<int>(),
              format_bytes(cpu["memory_bytes"].get<size_t>()).c_str());
  const auto& cuda = j["cuda"];
  if (!cuda["built"].get<bool>()) {
    std::printf("cuda      not built (%s)\n", cuda["error"].get<std::string>().c_str());
  } else {
    const std::string driver = cuda["driver"].get<std::string>();
    std::printf("cuda      built for sm %s, runtime %s, driver %s: %zu device(s)%s\n",
                cuda["architectures"].get<std::string>().c_str(), cuda["runtime"].get<std::string>().c_str(),
                driver.empty() ? "none" : driver.c_str(), cuda["devices"].size(),
                cuda.contains("error") ? (" — " + cuda["error"].get<std::string>()).c_str() : "");
    for (const auto& g : cuda["devices"])
      std::printf("  cuda:%d  %s, %s, compute capability %s, %d SMs, %s%s\n", g["index"].get<int>(),
                  g["name"].get<std::string>().c_str(), format_bytes(g["memory_bytes"].get<size_t>()).c_str(),
                  g["compute_capability"].get<std::string>().c_str(), g["multiprocessors"].get<int>(),
                  g["pci_bus_id"].get<std::string>().c_str(),
                  g["supported"].get<bool>() ? "" : " (not supported by this build's architectures)");
  }
  std::printf("cuda-sim  the CUDA kernels emulated on the CPU (warp 32, thread order %s)\n",
              j["cuda-sim"]["thread_order"].get<std::string>().c_str());
}

}  // namespace

void register_devices(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("devices", "the devices this binary can run on: cpu, cuda (GPUs found), cuda-sim");
  cmd->add_flag("--json", *json, "one JSON object keyed by cpu, cuda, cuda-sim");
  cmd->callback([json]() { run_devices(*json); });
}

}  // namespace lt::cli
