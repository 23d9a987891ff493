// `lazytrain plan | simulate | profile` end to end: the binary built next to the tests. Bad input gets one
// clear line and a non-zero exit; --json gives the documented object.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "testing/cli_testing.h"

namespace lt {
namespace {

using testing::CmdResult;

CmdResult run(const std::string& args) { return testing::run_lazytrain(args); }

const std::string kModel = std::string(LT_SOURCE_DIR) + "/examples/bench-25m/config.json";

class CmdPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(LT_BINARY_DIR) + "/lazytrain")) << "build the lazytrain target first";
  }
};

TEST_F(CmdPlan, JsonHasEveryPlanAndTheStatus) {
  const CmdResult r = run("plan --model " + kModel +
                          " --hardware rtx3090 --batch 8 --seq 512 --device-memory 3GiB --host-act-memory 4GiB "
                          "--time-limit 5 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"status", "solve_s", "gap", "plans"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["status"], "optimal");
  std::vector<std::string> names;
  for (const auto& p : j["plans"]) {
    names.push_back(p["name"]);
    for (const char* k : {"feasible", "step_s", "tflops", "tokens_per_s", "peak_device_bytes"})
      EXPECT_TRUE(p.contains(k)) << k;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"lazytrain", "keep-all", "every:1", "every:4", "host:1"}));
  EXPECT_TRUE(j["plans"][0]["feasible"].get<bool>());
  EXPECT_LE(j["plans"][0]["peak_device_bytes"].get<double>(), 3.0 * (1 << 30));
}

TEST_F(CmdPlan, TableAndPlanFileTheExecutorReads) {
  const std::string out = ::testing::TempDir() + "lt_cli_plan_" + std::to_string(::getpid()) + ".json";
  const CmdResult r = run("plan --model " + kModel +
                          " --hardware h800 --batch 8 --seq 512 --device-memory 2GiB --host-act-memory 1GiB --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("boundary (input)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every:4"), std::string::npos) << r.out;
  // The simulator takes the plan file as a policy.
  const CmdResult s = run("simulate --profile h800 --model " + kModel + " --batch 8 --seq 512 --policy " + out + " --json");
  std::filesystem::remove(out);
  ASSERT_EQ(s.status, 0) << s.out;
  const nlohmann::json j = nlohmann::json::parse(s.out);
  EXPECT_GT(j["step_s"].get<double>(), 0);
  EXPECT_TRUE(j["fits"].get<bool>());
}

TEST_F(CmdPlan, RanksCountTheExchangeAndNeedTheNetwork) {
  const std::string common = "plan --model " + kModel +
                             " --hardware rtx3090 --batch 8 --seq 512 --device-memory 3GiB --host-act-memory 4GiB "
                             "--time-limit 5 --json";
  const CmdResult one = run(common);
  const CmdResult four = run(common + " --ranks 4 --net-gbps 5");
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(four.status, 0) << four.out;
  const nlohmann::json a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(four.out);
  EXPECT_TRUE(a["data_parallel"].is_null());
  ASSERT_TRUE(b["data_parallel"].is_object());
  EXPECT_EQ(b["data_parallel"]["ranks"], 4);
  EXPECT_GT(b["data_parallel"]["exchange_micro_bytes"].get<double>(), 0);
  EXPECT_GT(b["data_parallel"]["exchange_step_bytes"].get<double>(), 0);
  EXPECT_GT(b["data_parallel"]["host_parameter_bytes_per_rank"].get<double>(), 0);
  // Each rank keeps 1/N of the gradients, states and (bf16) masters: fewer bytes per rank with more ranks.
  const CmdResult two = run(common + " --ranks 2 --net-gbps 5");
  ASSERT_EQ(two.status, 0) << two.out;
  EXPECT_LT(b["data_parallel"]["host_parameter_bytes_per_rank"].get<double>(),
            nlohmann::json::parse(two.out)["data_parallel"]["host_parameter_bytes_per_rank"].get<double>());
  const CmdResult missing = run("simulate --profile rtx3090 --model " + kModel +
                                " --batch 8 --seq 512 --policy every:2 --ranks 2");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("--net-gbps"), std::string::npos) << missing.out;
}

TEST_F(CmdPlan, UnknownHardware) {
  const CmdResult r = run("plan --model " + kModel + " --hardware tpu-v9 --batch 1 --seq 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("h800, h200, rtx3090"), std::string::npos) << r.out;
}

TEST_F(CmdPlan, SizeThatCannotParse) {
  const CmdResult r = run("plan --model " + kModel + " --hardware h800 --batch 1 --seq 64 --device-memory 12XB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--device-memory"), std::string::npos) << r.out;
}

TEST_F(CmdPlan, ModelThatCannotFit) {
  const CmdResult r = run("plan --model " + kModel + " --hardware rtx3090 --batch 512 --seq 4096 --host-act-memory 1TiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("needs at least"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
}

TEST_F(CmdPlan, MissingModel) {
  const CmdResult r = run("plan --model /nonexistent/config.json --hardware h800 --batch 1 --seq 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
}

// A plan solved with the MLP in chunks (8192 tokens against 1 GiB: choose_mlp_chunk takes 4096) is simulated at the
// memory it was solved for, as `bench step` runs it: the plan file's chunk unless --mlp-chunk says otherwise.
TEST_F(CmdPlan, SimulateRunsAPlanFileWithItsMlpChunk) {
  const std::string out = ::testing::TempDir() + "lt_cli_plan_chunk_" + std::to_string(::getpid()) + ".json";
  const std::string shape = " --model " + kModel + " --batch 16 --seq 512 --device-memory 1GiB --host-act-memory 1GiB";
  CmdResult r = run("plan --hardware h800" + shape + " --time-limit 10 --json --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  ASSERT_EQ(plan["mlp_chunk_tokens"], 4096);
  ASSERT_EQ(plan["plans"][0]["name"], "lazytrain");
  auto peak = [&](const std::string& extra) {
    const CmdResult s = run("simulate --profile h800" + shape + " --policy " + out + extra + " --json");
    EXPECT_EQ(s.status, 0) << s.out;
    return s.status == 0 ? nlohmann::json::parse(s.out)["peak_device_bytes"].get<double>() : 0.0;
  };
  EXPECT_EQ(peak(""), plan["plans"][0]["executor_device_bytes"].get<double>());
  EXPECT_EQ(peak(" --mlp-chunk 4096"), peak(""));
  EXPECT_GT(peak(" --mlp-chunk 0"), peak(""));  // the whole batch's MLP scratch
  r = run("simulate --profile h800" + shape + " --policy " + out + " --mlp-chunk 1000");
  std::filesystem::remove(out);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--mlp-chunk 1000: must be a multiple of 4096"), std::string::npos) << r.out;
}

TEST_F(CmdPlan, ProfileThenSimulate) {
  const std::string prof = ::testing::TempDir() + "lt_cli_profile_" + std::to_string(::getpid()) + ".json";
  const std::string tiny = std::string(LT_SOURCE_DIR) + "/examples/tiny-qwen3/config.json";
  CmdResult r = run("profile --model " + tiny + " --batch 2 --seq 32 --link-gbps 1 --reps 1 --device-memory 256MiB --out " + prof);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("simulate --profile " + prof + " --model " + tiny + " --batch 2 --seq 32 --policy every:2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_GT(nlohmann::json::parse(r.out)["step_s"].get<double>(), 0);
  r = run("plan --model " + tiny + " --hardware " + prof + " --batch 2 --seq 32 --json");
  std::filesystem::remove(prof);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["status"], "optimal");
}

// A Qwen3.5 hybrid end to end: measured per layer kind on the CPU device, simulated, planned to optimality under
// a device budget keep-all does not fit, and the plan run by the streaming executor: gradients byte-identical to
// the in-memory path's.
TEST_F(CmdPlan, HybridProfilePlanRun) {
  const std::string base = ::testing::TempDir() + "lt_cli_hybrid_" + std::to_string(::getpid());
  const std::string prof = base + ".json", plan = base + ".plan.json", model = base + "_model";
  const std::string tiny = std::string(LT_SOURCE_DIR) + "/examples/tiny-qwen35/config.json";
  const std::string batch = std::string(LT_SOURCE_DIR) + "/examples/tiny-qwen3/batch.json";  // B 4, T 64, vocabulary 384
  const std::string shape = " --batch 4 --seq 64";
  CmdResult r = run("profile --model " + tiny + shape + " --link-gbps 1 --reps 1 --device-memory 256MiB --out " + prof);
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(nlohmann::json::parse(std::ifstream(prof))["forward_s"].size(), 4u);
  r = run("simulate --profile " + prof + " --model " + tiny + shape + " --policy every:2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_GT(nlohmann::json::parse(r.out)["step_s"].get<double>(), 0);
  r = run("plan --model " + tiny + " --hardware " + prof + shape + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json roomy = nlohmann::json::parse(r.out);
  double keep_all = 0, every1 = 0;
  for (const auto& b : roomy["plans"]) {
    if (b["name"] == "keep-all") keep_all = b["executor_device_bytes"].get<double>();
    if (b["name"] == "every:1") every1 = b["executor_device_bytes"].get<double>();
  }
  ASSERT_GT(keep_all, every1);
  const std::string budget = std::to_string(int64_t((keep_all + every1) / 2));
  r = run("plan --model " + tiny + " --hardware " + prof + shape + " --device-memory " + budget + " --json --out " + plan);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json tight = nlohmann::json::parse(r.out);
  EXPECT_EQ(tight["status"], "optimal");
  ASSERT_EQ(tight["plans"][0]["name"], "lazytrain");
  EXPECT_LE(tight["plans"][0]["executor_device_bytes"].get<double>(), double(std::stoll(budget)));
  ASSERT_EQ(run("init --config " + tiny + " --out " + model + " --seed 5").status, 0);
  r = run("grad --model " + model + " --batch " + batch + " --out " + base + "_ref.safetensors");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("grad --model " + model + " --batch " + batch + " --out " + base + "_plan.safetensors --policy " + plan +
          " --device-memory " + budget);
  ASSERT_EQ(r.status, 0) << r.out;
  auto bytes = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string ref = bytes(base + "_ref.safetensors");
  EXPECT_FALSE(ref.empty());
  EXPECT_TRUE(ref == bytes(base + "_plan.safetensors")) << "the planned step's gradients differ from the in-memory path's";
  for (const std::string& f : {prof, plan, base + "_ref.safetensors", base + "_plan.safetensors"}) std::filesystem::remove(f);
  std::filesystem::remove_all(model);
}

}  // namespace
}  // namespace lt
