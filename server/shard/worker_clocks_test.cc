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

// A primary's clocks log whom they evicted and took back; a follower (a
// backup) evicts nobody, takes a worker back only where told it may, and
// sets what its primary logged.
TEST(WorkerClocksTest, FollowerTakesItsPrimarysEvictionsAndRejoins) {
  auto t0 = std::chrono::steady_clock::now();
  WorkerClocks primary(3, milliseconds(1000), t0);
  WorkerClocks backup(3, milliseconds(1000), t0);
  primary.set_log_changes(true);
  backup.set_follow(true);
  for (WorkerClocks* c : {&primary, &backup}) {
    c->Advance(0, 6);
    c->Advance(1, 7);
    c->Advance(2, 2);
    c->Touch(0, t0 + milliseconds(900));
    c->Touch(1, t0 + milliseconds(900));
  }
  EXPECT_EQ(primary.Expire(t0 + milliseconds(1500)), 1);
  EXPECT_EQ(backup.Expire(t0 + milliseconds(5000)), 0);  // never by itself
  EXPECT_EQ(backup.num_live(), 3);
  EXPECT_EQ(primary.TakeChanged(), std::vector<int>{2});
  EXPECT_TRUE(backup.Set(2, primary.live(2), primary.clock(2),
                         t0 + milliseconds(1500)));
  EXPECT_EQ(backup.MinLiveClock(), primary.MinLiveClock());
  // A heartbeat on the backup is not a rejoin; the primary's is.
  EXPECT_FALSE(backup.Touch(2, t0 + milliseconds(1600), /*may_rejoin=*/false));
  EXPECT_FALSE(backup.live(2));
  EXPECT_TRUE(primary.Touch(2, t0 + milliseconds(1600)));
  EXPECT_EQ(primary.clock(2), 6);
  EXPECT_EQ(primary.TakeChanged(), std::vector<int>{2});
  EXPECT_TRUE(primary.TakeChanged().empty());
  EXPECT_TRUE(backup.Set(2, true, primary.clock(2), t0 + milliseconds(1600)));
  EXPECT_FALSE(backup.Set(2, true, primary.clock(2), t0 + milliseconds(1600)));
  EXPECT_EQ(backup.clocks(), primary.clocks());
  // A request replayed from the primary takes a worker back as there.
  primary.Expire(t0 + milliseconds(4000));
  for (int r = 0; r < 3; ++r) backup.Set(r, false, backup.clock(r), t0);
  EXPECT_TRUE(primary.Touch(1, t0 + milliseconds(4100)));
  EXPECT_TRUE(backup.Touch(1, t0 + milliseconds(4200), /*may_rejoin=*/true));
  EXPECT_EQ(backup.clocks(), primary.clocks());
  EXPECT_EQ(backup.num_live(), 1);
  // Promoted: its own timer again, from when it last heard from each.
  backup.set_follow(false);
  EXPECT_EQ(backup.Expire(t0 + milliseconds(5300)), 1);
}

}  // namespace
}  // namespace asyncps::server
