#include "server/shard/worker_clocks.h"

#include <glog/logging.h>

#include <algorithm>
#include <limits>

namespace asyncps::server {

WorkerClocks::WorkerClocks(int num_workers, std::chrono::milliseconds timeout,
                           TimePoint start)
    : timeout_(timeout),
      clocks_(num_workers, 0),
      last_heard_(num_workers, start),
      live_(num_workers, 1) {}

bool WorkerClocks::Touch(int rank, TimePoint now, bool may_rejoin) {
  last_heard_[rank] = now;
  if (live_[rank] || (follow_ && !may_rejoin)) return false;
  int64_t min = MinLiveClock();
  bool any_live = num_live() > 0;
  live_[rank] = 1;
  if (any_live) clocks_[rank] = std::max(clocks_[rank], min);
  LOG(INFO) << "worker " << rank << " rejoined at clock " << clocks_[rank];
  NoteChanged(rank);
  return true;
}

bool WorkerClocks::Set(int rank, bool live, int64_t clock, TimePoint now) {
  const bool changed = (live_[rank] != 0) != live;
  clocks_[rank] = clock;
  live_[rank] = live ? 1 : 0;
  if (live) last_heard_[rank] = now;
  if (changed) {
    LOG(INFO) << "worker " << rank << (live ? " rejoined" : " evicted")
              << " at clock " << clock << " (as on the primary)";
    NoteChanged(rank);
  }
  return changed;
}

void WorkerClocks::NoteChanged(int rank) {
  if (log_changes_ &&
      std::find(changed_.begin(), changed_.end(), rank) == changed_.end())
    changed_.push_back(rank);
}

std::vector<int> WorkerClocks::TakeChanged() {
  std::vector<int> c;
  c.swap(changed_);
  return c;
}

void WorkerClocks::Advance(int rank, int64_t clock) {
  clocks_[rank] = std::max(clocks_[rank], clock);
}

int WorkerClocks::Expire(TimePoint now) {
  if (timeout_.count() <= 0 || follow_) return 0;
  int n = 0;
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (live_[r] && now - last_heard_[r] > timeout_) {
      live_[r] = 0;
      ++n;
      NoteChanged(static_cast<int>(r));
      LOG(WARNING) << "worker " << r << " silent for more than "
                   << timeout_.count()
                   << " ms: dropped from the clock minimum (clock "
                   << clocks_[r] << ")";
    }
  }
  return n;
}

int64_t WorkerClocks::MinLiveClock() const {
  int64_t min = std::numeric_limits<int64_t>::max();
  int64_t max = 0;
  bool any = false;
  for (size_t r = 0; r < clocks_.size(); ++r) {
    max = std::max(max, clocks_[r]);
    if (live_[r]) {
      min = std::min(min, clocks_[r]);
      any = true;
    }
  }
  return any ? min : max;
}

int WorkerClocks::num_live() const {
  return static_cast<int>(std::count(live_.begin(), live_.end(), uint8_t{1}));
}

void WorkerClocks::Restore(const std::vector<int64_t>& clocks, TimePoint now) {
  for (size_t r = 0; r < clocks_.size() && r < clocks.size(); ++r)
    clocks_[r] = clocks[r];
  std::fill(last_heard_.begin(), last_heard_.end(), now);
  std::fill(live_.begin(), live_.end(), uint8_t{1});
}

}  // namespace asyncps::server
