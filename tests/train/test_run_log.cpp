// Run logs: the learning-rate schedules, metrics.jsonl and TensorBoard scalars from one run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/json_file.h"
#include "train/run_log.h"
#include "train/schedule.h"

namespace lt {
namespace {

TEST(LrSchedule, MatchesTransformers) {
  LrSchedule lin{"linear", 1e-3, 10, 110};
  EXPECT_DOUBLE_EQ(lin.at(0), 0.0);
  EXPECT_DOUBLE_EQ(lin.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(lin.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(lin.at(60), 5e-4);
  EXPECT_DOUBLE_EQ(lin.at(110), 0.0);
  LrSchedule cos{"cosine", 1e-3, 0, 100};
  EXPECT_DOUBLE_EQ(cos.at(0), 1e-3);
  EXPECT_NEAR(cos.at(50), 5e-4, 1e-15);
  EXPECT_NEAR(cos.at(100), 0.0, 1e-18);
  LrSchedule con{"constant", 2e-4, 4, 100};
  EXPECT_DOUBLE_EQ(con.at(2), 1e-4);
  EXPECT_DOUBLE_EQ(con.at(90), 2e-4);
}

TEST(RunLog, WritesMetricsAndTensorBoard) {
  std::string dir = ::testing::TempDir() + "lt_runlog";
  std::filesystem::remove_all(dir);
  {
    RunLog log(dir, 20, false);
    for (int64_t s = 1; s <= 20; s += 5)
      log.log_step({{"step", s}, {"loss", 3.0 / double(s)}, {"lr", 1e-3}, {"tokens_per_s", 1000.0}, {"grad_norm", 0.5}});
    log.log_eval(20, {{"exact_match", 0.75}});
    log.finish();
  }
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("step"));
    ++n;
  }
  EXPECT_EQ(n, 5);
  std::string tb;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/tensorboard")) tb = e.path().string();
  auto scalars = read_tensorboard_scalars(tb);
  int losses = 0, em = 0;
  for (const auto& s : scalars) {
    losses += s.tag == "train/loss";
    em += s.tag == "eval/exact_match";
  }
  EXPECT_EQ(losses, 4);
  EXPECT_EQ(em, 1);
}

}  // namespace
}  // namespace lt
