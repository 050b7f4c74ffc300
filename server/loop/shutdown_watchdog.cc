#include "server/loop/shutdown_watchdog.h"

namespace asyncps::server {

ShutdownWatchdog::ShutdownWatchdog(Options options)
    : options_(std::move(options)), thread_([this] { Run(); }) {}

ShutdownWatchdog::~ShutdownWatchdog() {
  Done();
  if (thread_.joinable()) thread_.join();
}

void ShutdownWatchdog::StopRequested() {
  bool second = false;
  {
    MutexLock l(&mu_);
    if (done_) return;
    second = ++requests_ >= 2;
  }
  cv_.SignalAll();
  if (second) Force("a second stop request");
}

void ShutdownWatchdog::Done() {
  {
    MutexLock l(&mu_);
    done_ = true;
  }
  cv_.SignalAll();
}

void ShutdownWatchdog::Force(const std::string& why) {
  {
    MutexLock l(&mu_);
    if (forced_ || done_) return;
    forced_ = true;
  }
  options_.force_exit(why);
}

void ShutdownWatchdog::Run() {
  {
    MutexLock l(&mu_);
    while (!done_ && requests_ == 0) cv_.Wait(&mu_);
    if (done_) return;
    const auto until = std::chrono::steady_clock::now() + options_.grace;
    while (!done_ && cv_.WaitUntil(&mu_, until)) {
    }
    if (done_) return;
  }
  Force("the event loop did not stop within " +
        std::to_string(options_.grace.count()) + " ms");
}

}  // namespace asyncps::server
