// TaskPool: a fixed set of threads that run the items of one parallel loop
// together with the calling thread (the shard's large-push apply).
//
// Run(n, fn) calls fn(i) once for every i in [0, n), on the pool's threads
// and the caller, handing items out one at a time (so uneven items balance),
// and returns once every call has returned and every pool thread is idle
// again: nothing fn touches is used after Run() returns.
//
// Thread safety: Run() is called by one thread at a time (the owner's).
// Private to server/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace asyncps::server::internal {

class TaskPool {
 public:
  // `threads`: threads taking part in Run(), the caller included; < 2 means
  // the caller alone (no thread is started).
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Threads taking part in Run(), the caller included (>= 1).
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n); see the header comment. fn must not
  // throw.
  void Run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop();
  // Takes items until none is left.
  void Drain();

  std::vector<std::thread> workers_;
  Mutex mu_;
  CondVar wake_;  // workers: a new generation or stop
  CondVar idle_;  // Run(): the last worker is done
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  size_t joined_ GUARDED_BY(mu_) = 0;  // workers done with this generation
  bool stop_ GUARDED_BY(mu_) = false;
  // The loop of the current generation: valid while Run() waits. Written
  // under mu_ before generation_ moves on, read by the workers once they
  // saw it move (so not marked GUARDED_BY: Drain reads them without mu_).
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
};

}  // namespace asyncps::server::internal
