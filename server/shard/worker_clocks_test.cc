#include "server/shard/worker_clocks.h"

#include <gtest/gtest.h>

namespace asyncps::server {
namespace {

using std::chrono::milliseconds;

TEST(WorkerClocksTest, EvictAndRejoin) {
  auto t0 = std::chrono::steady_clock::now();
  WorkerClocks c(3, milliseconds(1000), t0);
  EXPECT_EQ(c.MinLiveClock(), 0);
  c.Advance(0, 5);
  c.Advance(1, 4);
  EXPECT_EQ(c.MinLiveClock(), 0);  // rank 2 never connected: live until timeout
  c.Touch(0, t0 + milliseconds(900));
  c.Touch(1, t0 + milliseconds(900));
  EXPECT_EQ(c.Expire(t0 + milliseconds(1500)), 1);  // rank 2 evicted
  EXPECT_FALSE(c.live(2));
  EXPECT_EQ(c.MinLiveClock(), 4);
  c.Advance(1, 3);  // clocks never go back
  EXPECT_EQ(c.clock(1), 4);
  EXPECT_TRUE(c.Touch(2, t0 + milliseconds(1600)));  // rejoins at the minimum
  EXPECT_EQ(c.clock(2), 4);
  EXPECT_EQ(c.MinLiveClock(), 4);
  EXPECT_EQ(c.Expire(t0 + milliseconds(10000)), 3);
  EXPECT_EQ(c.MinLiveClock(), 5);  // nobody live: max, nothing waits
}

TEST(WorkerClocksTest, ZeroTimeoutNeverEvicts) {
  auto t0 = std::chrono::steady_clock::now();
  WorkerClocks c(2, milliseconds(0), t0);
  EXPECT_EQ(c.Expire(t0 + std::chrono::hours(1)), 0);
  EXPECT_EQ(c.num_live(), 2);
}

}  // namespace
}  // namespace asyncps::server
