// ps_ctl top: a live terminal view of the shards.
//
// Every interval, the stats document of each shard (the JSON that `ps_ctl
// stats` prints, see Shard::StatsJson) is fetched and one frame is drawn:
// per shard its version and update rate, push/pull rates, bytes in/out per
// second, staleness p50/p99, parked pulls, rejections, and the clock of
// every worker (with '*' for workers evicted from the clock minimum).
// Rates are differences between two consecutive samples of the shard's
// cumulative counters over the time between them; the first frame shows
// totals only.
//
// The drawing is a pure function of the samples (RenderTopFrame), so it is
// tested without a terminal; RunTop() owns the loop and the screen.
// Thread safety: none (one tool thread).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps::server {

// One shard's stats at one time.
struct TopSample {
  std::string endpoint;
  std::chrono::steady_clock::time_point at;
  Status status;      // fetch or parse failure: the row says so
  std::string stats;  // the shard's stats JSON (when status is OK)
};

struct TopOptions {
  // Time between frames. Default: 1 s.
  std::chrono::milliseconds interval{1000};
  // Frames to draw before returning; 0: until `stop` returns true.
  // Default: 0.
  int iterations = 0;
  // Clear the screen before each frame (a terminal); otherwise frames are
  // separated by a blank line (a pipe or a capture). Default: true.
  bool clear_screen = true;
  // Workers listed per shard row before the list is summarised
  // (min/median/max). Default: 16.
  int max_workers_listed = 16;
};

// Renders one frame from the current samples and the previous ones (empty
// on the first frame; matched by index). Never fails: a shard whose sample
// is an error or unparsable JSON gets a row with the reason.
std::string RenderTopFrame(const std::vector<TopSample>& previous,
                           const std::vector<TopSample>& current,
                           const TopOptions& options);

// Draws frames to stdout until options.iterations frames were drawn or
// `stop()` returns true (checked every 50 ms). `fetch(i)` returns the stats
// JSON of shard i (endpoints[i]). Returns OK, or the status of the last frame
// when every shard failed in it.
Status RunTop(const std::vector<std::string>& endpoints,
              const std::function<StatusOr<std::string>(size_t)>& fetch,
              const std::function<bool()>& stop, const TopOptions& options);

}  // namespace asyncps::server
