#include "server/ctl/ctl_top.h"

#include <gtest/gtest.h>

namespace asyncps::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TopSample Sample(steady_clock::time_point at, const std::string& stats) {
  TopSample s;
  s.endpoint = "tcp://127.0.0.1:1";
  s.at = at;
  s.stats = stats;
  return s;
}

// The stats keys RenderTopFrame reads, as Shard::StatsJson writes them.
std::string Stats(int version, int pushes, int pulls, int bytes_in,
                  const std::string& clocks, const std::string& live) {
  return "{\"version\":" + std::to_string(version) +
         ",\"pushes\":" + std::to_string(pushes) +
         ",\"pulls\":" + std::to_string(pulls) +
         ",\"bytes_in\":" + std::to_string(bytes_in) +
         ",\"bytes_out\":0,\"parked_pulls\":2,\"rejected_total\":5,"
         "\"consistency\":\"ssp\",\"staleness_bound\":3,"
         "\"staleness\":{\"p50\":1,\"p99\":7},\"worker_clocks\":" +
         clocks + ",\"worker_live\":" + live + "}";
}

TEST(CtlTop, RatesFromConsecutiveSamples) {
  const auto t0 = steady_clock::now();
  std::vector<TopSample> before = {
      Sample(t0, Stats(100, 100, 50, 1000000, "[4,5]", "[true,true]"))};
  std::vector<TopSample> now = {
      Sample(t0 + milliseconds(2000),
             Stats(300, 300, 250, 5000000, "[9,7]", "[true,false]"))};
  const std::string first = RenderTopFrame({}, before, TopOptions());
  const std::string frame = RenderTopFrame(before, now, TopOptions());
  // First frame: no rates yet.
  EXPECT_NE(first.find("    100       -       -       -        -"),
            std::string::npos)
      << first;
  // 200 updates, 200 pushes, 200 pulls and 4 MB in over 2 s.
  EXPECT_NE(frame.find("    300     100     100     100     2.0M"),
            std::string::npos)
      << frame;
  EXPECT_NE(frame.find("ssp s=3"), std::string::npos) << frame;
  EXPECT_NE(frame.find("0:9 1:7*"), std::string::npos) << frame;
  EXPECT_NE(frame.find("          1    7       2         5"), std::string::npos)
      << frame;
}

TEST(CtlTop, FailuresAndBadJsonGetARow) {
  TopSample down;
  down.endpoint = "tcp://127.0.0.1:9";
  down.status = Status::TimedOut("no reply within 5000 ms");
  std::vector<TopSample> now = {down, Sample(steady_clock::now(), "{not json")};
  const std::string frame = RenderTopFrame({}, now, TopOptions());
  EXPECT_NE(frame.find("tcp://127.0.0.1:9: TimedOut: no reply within 5000 ms"),
            std::string::npos)
      << frame;
  EXPECT_NE(frame.find("unparsable stats"), std::string::npos) << frame;
}

TEST(CtlTop, ManyWorkersAreSummarised) {
  std::string clocks = "[", live = "[";
  for (int r = 0; r < 40; ++r) {
    clocks += (r ? "," : "") + std::to_string(100 + r);
    live += r ? (r < 3 ? ",false" : ",true") : "true";
  }
  TopOptions o;
  o.max_workers_listed = 16;
  const std::string frame =
      RenderTopFrame({},
                     {Sample(steady_clock::now(),
                             Stats(1, 1, 1, 1, clocks + "]", live + "]"))},
                     o);
  EXPECT_NE(frame.find("n=40 min 100 med 120 max 139 (2 out)"),
            std::string::npos)
      << frame;
}

TEST(CtlTop, RunTopDrawsFramesUntilStopped) {
  int fetches = 0;
  auto fetch = [&](size_t) -> StatusOr<std::string> {
    ++fetches;
    return Stats(fetches, fetches, 0, 0, "[1]", "[true]");
  };
  TopOptions o;
  o.interval = milliseconds(10);
  o.iterations = 3;
  o.clear_screen = false;
  testing::internal::CaptureStdout();
  Status s = RunTop(
      {"a", "b"}, fetch, [] { return false; }, o);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fetches, 6);  // 3 frames x 2 shards
  size_t headers = 0;
  for (size_t at = out.find("shard  version"); at != std::string::npos;
       at = out.find("shard  version", at + 1)) {
    ++headers;
  }
  EXPECT_EQ(headers, 3u);

  // Stopped from outside (Ctrl-C): returns after the first frame.
  o.iterations = 0;
  o.interval = milliseconds(60000);
  testing::internal::CaptureStdout();
  const auto start = steady_clock::now();
  s = RunTop(
      {"a"}, fetch, [] { return true; }, o);
  (void)testing::internal::GetCapturedStdout();
  EXPECT_TRUE(s.ok());
  EXPECT_LT(steady_clock::now() - start, milliseconds(5000));

  // Every shard down: the error is returned.
  o.iterations = 1;
  testing::internal::CaptureStdout();
  s = RunTop(
      {"a"},
      [](size_t) -> StatusOr<std::string> {
        return Status::Unavailable("down");
      },
      [] { return false; }, o);
  (void)testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace asyncps::server
