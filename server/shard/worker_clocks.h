// Vector clock of a shard's workers with liveness.
//
// Each worker rank 0..num_workers-1 has a clock (iterations done, as the
// worker reports it), the time it was last heard from, and a live flag. The
// clock minimum that gates BSP rounds and SSP pulls is taken over live
// workers only, so a dead worker cannot block the others:
//   - every ranks starts live, "last heard" = the shard's start time, so the
//     first round waits for everybody until `timeout` after start;
//   - a worker silent for longer than `timeout` is evicted (Expire());
//   - an evicted worker that talks again rejoins with clock
//     max(its clock, the current minimum), so it does not drag the minimum
//     back.
//
// A backup of a replica group follows its primary (set_follow(true)): it
// evicts nobody on its own timer, and only requests it replays from the
// primary take an evicted worker back (Touch with may_rejoin); the
// primary's other evictions and rejoins reach it as worker states to set
// (Set()), recorded on the primary by set_log_changes(true) / TakeChanged().
//
// Times are passed in (steady clock) so tests control them.
// Thread safety: none (owned by one shard's event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace asyncps::server {

class WorkerClocks {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // `timeout` <= 0 disables eviction.
  WorkerClocks(int num_workers, std::chrono::milliseconds timeout,
               TimePoint start);

  int num_workers() const { return static_cast<int>(clocks_.size()); }

  // Marks `rank` as heard from at `now`. Returns true if it was evicted and
  // has rejoined (its clock was raised to the current minimum); a follower
  // takes it back only when `may_rejoin`.
  // REQUIRES: 0 <= rank < num_workers().
  bool Touch(int rank, TimePoint now, bool may_rejoin = true);

  // Raises rank's clock to `clock` (clocks never go backwards).
  void Advance(int rank, int64_t clock);

  // Evicts workers silent for longer than the timeout; returns how many.
  // A follower evicts nobody.
  int Expire(TimePoint now);

  // Follower mode (a backup of a replica group): see the header comment.
  void set_follow(bool on) { follow_ = on; }
  bool follow() const { return follow_; }
  // Sets rank's liveness and clock as its primary holds them (heard from at
  // `now` when live). Returns true when its liveness changed.
  // REQUIRES: 0 <= rank < num_workers().
  bool Set(int rank, bool live, int64_t clock, TimePoint now);
  // Records the ranks whose liveness Expire() and Touch() change, for
  // TakeChanged() (off by default: nothing is kept).
  void set_log_changes(bool on) {
    log_changes_ = on;
    if (!on) changed_.clear();
  }
  // The ranks whose liveness changed since the last call (each once, in
  // the order of their first change).
  std::vector<int> TakeChanged();

  // Minimum clock over live workers; with none live, the maximum clock of
  // all (so nothing waits on an empty set).
  int64_t MinLiveClock() const;

  int64_t clock(int rank) const { return clocks_[rank]; }
  bool live(int rank) const { return live_[rank] != 0; }
  int num_live() const;

  // Restores persisted clocks (all ranks live, heard from at `now`).
  void Restore(const std::vector<int64_t>& clocks, TimePoint now);
  const std::vector<int64_t>& clocks() const { return clocks_; }

 private:
  std::chrono::milliseconds timeout_;
  std::vector<int64_t> clocks_;
  std::vector<TimePoint> last_heard_;
  std::vector<uint8_t> live_;
  bool follow_ = false;
  bool log_changes_ = false;
  std::vector<int> changed_;
  void NoteChanged(int rank);
};

}  // namespace asyncps::server
