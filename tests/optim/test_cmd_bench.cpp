// `lazytrain bench optimizer` end to end: the binary built next to the tests, on a small parameter count.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "testing/cli_testing.h"

namespace lt {
namespace {

using testing::CmdResult;

CmdResult run_bench(const std::string& args) { return testing::run_lazytrain("bench optimizer " + args); }

class CmdBench : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(LT_BINARY_DIR) + "/lazytrain"))
        << "build the lazytrain target first";
  }
};

TEST_F(CmdBench, JsonLinePerImplementation) {
  const CmdResult r = run_bench("--params 1234567 --threads 1 --reps 1 --json --bf16-copy");
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<std::string, nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    lines[j.at("impl").get<std::string>()] = j;
  }
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (const char* impl : {"accumulate", "adamw32", "adamw8"}) {
    ASSERT_TRUE(lines.count(impl)) << impl;
    const nlohmann::json& j = lines[impl];
    EXPECT_EQ(j.at("params").get<int64_t>(), 1234567);
    EXPECT_EQ(j.at("threads").get<int>(), 1);
    EXPECT_GT(j.at("mparams_per_s").get<double>(), 0.0);
    EXPECT_GT(j.at("gb_per_s").get<double>(), 0.0);
    EXPECT_GT(j.at("triad_gb_per_s").get<double>(), 0.0);
  }
  EXPECT_EQ(lines["adamw32"].at("state_bytes_per_param").get<double>(), 8.0);
  // 8-bit codes for m and v plus two f32 absmax per 256-element block (the last block of 1234567 is short).
  EXPECT_NEAR(lines["adamw8"].at("state_bytes_per_param").get<double>(), 2.03125, 1e-4);
  EXPECT_EQ(lines["adamw8"].at("bytes_per_param").get<double>(), 12.0 + 4.0 + 16.0 / 256 + 2.0);  // + bf16 copy
}

TEST_F(CmdBench, TableAndBadArguments) {
  const CmdResult table = run_bench("--params 100000 --threads 1 --reps 1");
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("adamw8"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("of triad"), std::string::npos) << table.out;
  EXPECT_NE(run_bench("--params 0").status, 0);
  EXPECT_NE(run_bench("--params 1000 --block 100").status, 0);  // not a multiple of 16
}

}  // namespace
}  // namespace lt
