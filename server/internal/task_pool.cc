#include "server/internal/task_pool.h"

namespace asyncps::server::internal {

TaskPool::TaskPool(int threads) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

TaskPool::~TaskPool() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::Drain() {
  for (size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn_)(i);
  }
}

void TaskPool::Run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    MutexLock l(&mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    joined_ = 0;
    ++generation_;
  }
  wake_.SignalAll();
  Drain();
  // Every worker joins every generation, so none can still be about to take
  // an item of this loop when the next one starts.
  MutexLock l(&mu_);
  while (joined_ != workers_.size()) idle_.Wait(&mu_);
  fn_ = nullptr;
}

void TaskPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      MutexLock l(&mu_);
      while (!stop_ && generation_ == seen) wake_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
    }
    Drain();
    MutexLock l(&mu_);
    if (++joined_ == workers_.size()) idle_.Signal();
  }
}

}  // namespace asyncps::server::internal
