// Which weight buffer holds which layer (exec/weight_buffers.h): the rule the executor and the planner's
// simulator share, and that the planner's cost model counts.
#include <gtest/gtest.h>

#include <vector>

#include "exec/weight_buffers.h"

namespace lt {
namespace {

// Acquires the layers in order and returns which of them uploaded.
std::vector<int64_t> uploads(WeightBuffers& wb, const std::vector<int64_t>& layers) {
  std::vector<int64_t> up;
  for (int64_t l : layers)
    if (wb.acquire(l).upload) up.push_back(l);
  return up;
}

TEST(WeightBuffers, ForwardFillsRoundRobinAndBackwardReusesTheTopLayers) {
  for (int n = 1; n <= 5; ++n) {
    WeightBuffers wb(n);
    const int64_t L = 8;
    std::vector<int64_t> fwd, bwd;
    for (int64_t l = 0; l < L; ++l) fwd.push_back(l);
    for (int64_t l = L - 1; l >= 0; --l) bwd.push_back(l);
    EXPECT_EQ(uploads(wb, fwd), fwd) << n;
    wb.begin_backward();
    std::vector<int64_t> want;
    for (int64_t l = L - 1 - n; l >= 0; --l) want.push_back(l);  // layers L-n .. L-1 are still there
    EXPECT_EQ(uploads(wb, bwd), want) << n;
  }
}

TEST(WeightBuffers, AnUploadTakesTheLeastRecentlyUsedBuffer) {
  WeightBuffers wb(3);
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(wb.acquire(l).buffer, int(l));
  wb.begin_backward();
  EXPECT_FALSE(wb.acquire(2).upload);
  EXPECT_FALSE(wb.acquire(1).upload);
  const WeightBuffers::Slot s = wb.acquire(7);  // 0 was used longest ago (the forward), then 2
  EXPECT_TRUE(s.upload);
  EXPECT_EQ(s.buffer, 0);
  EXPECT_EQ(wb.acquire(6).buffer, 2);
}

// After the backward's first upload only the layer acquired last is reused, even if another buffer still
// holds the layer: the planner's byte count stays linear in the plan (see the header).
TEST(WeightBuffers, AfterTheBackwardsFirstUploadOnlyTheLastLayerIsReused) {
  WeightBuffers wb(4);
  for (int64_t l = 0; l < 6; ++l) wb.acquire(l);  // buffers hold 4, 5, 2, 3
  wb.begin_backward();
  // A recompute segment from boundary 3 for boundary 5: layers 3 and 4 are there, no upload yet.
  EXPECT_EQ(uploads(wb, {3, 4, 5, 5, 4}), std::vector<int64_t>{});
  // A segment from boundary 1 for boundary 3: layer 1 uploads (into layer 2's buffer), then 2 and 3.
  EXPECT_EQ(uploads(wb, {1, 2, 3, 3}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(wb.layers(), (std::vector<int64_t>{4, 3, 1, 2}));
  // Layers 2 and 1 are still in buffers, but only the last one acquired is reused now.
  EXPECT_EQ(uploads(wb, {2, 2, 1}), (std::vector<int64_t>{2, 1}));
}

TEST(WeightBuffers, CarriedLayersAreUsedAndOverwrittenLowestFirst) {
  WeightBuffers wb(4);
  wb.carry({-1, 1, 0, 2});  // the previous backward ended on layers 2, 1, 0; one buffer empty
  EXPECT_EQ(uploads(wb, {0, 1, 2}), std::vector<int64_t>{});
  EXPECT_EQ(wb.acquire(3).buffer, 0);  // the empty one first
  EXPECT_EQ(wb.acquire(4).buffer, 2);  // then layer 0's
  EXPECT_EQ(wb.acquire(5).buffer, 1);  // then layer 1's
  EXPECT_EQ(wb.layers(), (std::vector<int64_t>{3, 5, 4, 2}));
}

}  // namespace
}  // namespace lt
