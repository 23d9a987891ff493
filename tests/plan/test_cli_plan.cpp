// `lazytrain plan | simulate | profile` end to end: the binary built next to the tests. Bad input gets one
// clear line and a non-zero exit; --json gives the documented object.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

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

}  // namespace
}  // namespace lt
