#include "server/internal/task_pool.h"

namespace asyncps::server::internal {

TaskPool::TaskPool(int threads) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
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
    std::lock_guard<std::mutex> l(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    joined_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  Drain();
  // Every worker joins every generation, so none can still be about to take
  // an item of this loop when the next one starts.
  std::unique_lock<std::mutex> l(mu_);
  idle_.wait(l, [this] { return joined_ == workers_.size(); });
  fn_ = nullptr;
}

void TaskPool::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    wake_.wait(l, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    l.unlock();
    Drain();
    l.lock();
    if (++joined_ == workers_.size()) idle_.notify_one();
  }
}

}  // namespace asyncps::server::internal
