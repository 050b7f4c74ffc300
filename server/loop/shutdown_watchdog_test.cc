// Issue 13 (small ones): a shard whose event loop is stuck must still stop
// on SIGTERM. ps_server's signal thread feeds this watchdog.
#include "server/loop/shutdown_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace asyncps::server {
namespace {

using std::chrono::milliseconds;

struct Recorder {
  std::atomic<int> calls{0};
  std::string why;
  ShutdownWatchdog::Options Options(milliseconds grace) {
    ShutdownWatchdog::Options o;
    o.grace = grace;
    o.force_exit = [this](const std::string& w) {
      why = w;
      ++calls;
    };
    return o;
  }
};

TEST(ShutdownWatchdogTest, StuckLoopIsEndedAfterTheGracePeriod) {
  Recorder rec;
  ShutdownWatchdog w(rec.Options(milliseconds(100)));
  std::atomic<bool> stop{false};
  // A loop that never looks at `stop` (stuck), like the pre-fix BSP round.
  std::thread stuck([&] {
    while (rec.calls.load() == 0) std::this_thread::sleep_for(milliseconds(5));
  });
  stop = true;
  w.StopRequested();
  stuck.join();  // returns only because force_exit ran
  EXPECT_EQ(rec.calls.load(), 1);
  EXPECT_NE(rec.why.find("did not stop"), std::string::npos) << rec.why;
}

TEST(ShutdownWatchdogTest, SecondSignalEndsAtOnce) {
  Recorder rec;
  ShutdownWatchdog w(rec.Options(milliseconds(60000)));
  w.StopRequested();
  EXPECT_EQ(rec.calls.load(), 0);
  w.StopRequested();
  EXPECT_EQ(rec.calls.load(), 1);
  EXPECT_NE(rec.why.find("second"), std::string::npos) << rec.why;
}

TEST(ShutdownWatchdogTest, LoopThatStopsInTimeIsLeftAlone) {
  Recorder rec;
  {
    ShutdownWatchdog w(rec.Options(milliseconds(200)));
    w.StopRequested();
    std::this_thread::sleep_for(milliseconds(20));
    w.Done();
    std::this_thread::sleep_for(milliseconds(300));
    w.StopRequested();  // after Done: nothing
  }
  EXPECT_EQ(rec.calls.load(), 0);
}

}  // namespace
}  // namespace asyncps::server
