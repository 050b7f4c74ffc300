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
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    second = ++requests_ >= 2;
  }
  cv_.notify_all();
  if (second) Force("a second stop request");
}

void ShutdownWatchdog::Done() {
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

void ShutdownWatchdog::Force(const std::string& why) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (forced_ || done_) return;
    forced_ = true;
  }
  options_.force_exit(why);
}

void ShutdownWatchdog::Run() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return done_ || requests_ > 0; });
  if (done_) return;
  if (cv_.wait_for(l, options_.grace, [this] { return done_; })) return;
  l.unlock();
  Force("the event loop did not stop within " +
        std::to_string(options_.grace.count()) + " ms");
}

}  // namespace asyncps::server
