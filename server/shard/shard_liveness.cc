// Shard: workers' liveness in a replica group. A worker silent for longer
// than --worker_timeout_ms leaves the clock minimum (WorkerClocks), which
// closes BSP rounds without it, expires sparse rows by the new minimum and
// frees its pull replica and delay-compensation reads: all state a backup
// must hold exactly as its primary does. So only the primary decides: a
// backup (follower) evicts nobody on its own timer, takes an evicted worker
// back only on a request replayed from the primary, and gets the primary's
// other evictions and rejoins as worker states (a kReplicate liveness
// record, server/replication/replicator.h), set here at the same point of
// the primary's order.
#include <glog/logging.h>

#include <string>

#include "server/shard/shard.h"

namespace asyncps::server {

void Shard::FreeEvicted() {
  // An evicted worker's replica is a copy of the shard it may never ask
  // for again: it resyncs with whole weights if it comes back.
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    if (!clocks_.live(r)) {
      FreeReplica(r);
      FreeDcReads(r);
      DropShm(r);
    }
  }
}

bool Shard::TakeWorkerChanges(std::vector<WorkerLiveness>* states) {
  states->clear();
  for (int r : clocks_.TakeChanged())
    states->push_back(WorkerLiveness{r, clocks_.live(r), clocks_.clock(r)});
  return !states->empty();
}

std::vector<WorkerLiveness> Shard::WorkerStates() const {
  std::vector<WorkerLiveness> all;
  for (int r = 0; r < clocks_.num_workers(); ++r)
    all.push_back(WorkerLiveness{r, clocks_.live(r), clocks_.clock(r)});
  return all;
}

Status Shard::SetWorkerStates(const std::vector<WorkerLiveness>& states,
                              TimePoint now, std::vector<OutgoingReply>* out) {
  const int n = clocks_.num_workers();
  std::vector<uint8_t> seen(n, 0);
  for (const WorkerLiveness& w : states) {
    std::string why;
    if (w.rank < 0 || w.rank >= n) {
      why = "no such rank (" + std::to_string(n) + " workers)";
    } else if (w.clock < 0) {
      why = "negative clock";
    } else if (seen[w.rank]) {
      why = "listed twice";
    }
    if (!why.empty()) {
      return Status::InvalidArgument("worker state of rank " +
                                     std::to_string(w.rank) + " at clock " +
                                     std::to_string(w.clock) + ": " + why);
    }
    seen[w.rank] = 1;
  }
  bool evicted = false;
  for (const WorkerLiveness& w : states) {
    if (clocks_.Set(w.rank, w.live, w.clock, now) && !w.live) evicted = true;
  }
  if (evicted) FreeEvicted();
  OnClocksChanged(out);
  return Status::OK();
}

}  // namespace asyncps::server
