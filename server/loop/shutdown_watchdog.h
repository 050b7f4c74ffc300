// ShutdownWatchdog: makes a stop request final even when the event loop does
// not come back to see it.
//
// ps_server stops on SIGTERM/SIGINT by setting a flag its event loop reads
// between messages. Should the loop be stuck (a bug, a store that hangs), the
// signal alone would change nothing. The watchdog runs beside the loop: the
// first StopRequested() starts a grace period; a second request, or the
// grace period running out before Done(), calls `force_exit` (ps_server:
// log, flush the logs, _exit) — best effort after the loop had its chance to
// write a final checkpoint.
//
// Thread safety: all methods may be called from any thread; `force_exit`
// runs on the watchdog's own thread or on the caller of the second
// StopRequested().
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"

namespace asyncps::server {

class ShutdownWatchdog {
 public:
  struct Options {
    // Time the loop gets to stop after the first request. Default: 60 s.
    std::chrono::milliseconds grace{60000};
    // Called (once) when the loop did not stop in time or a second stop was
    // requested; `why` says which. Required.
    std::function<void(const std::string& why)> force_exit;
  };

  explicit ShutdownWatchdog(Options options);
  // Joins the timer thread (as Done()).
  ~ShutdownWatchdog();
  ShutdownWatchdog(const ShutdownWatchdog&) = delete;
  ShutdownWatchdog& operator=(const ShutdownWatchdog&) = delete;

  // A stop was asked for (a signal).
  void StopRequested();
  // The loop has returned: no forced exit any more.
  void Done();

 private:
  void Run();
  void Force(const std::string& why) EXCLUDES(mu_);

  Options options_;
  Mutex mu_;
  CondVar cv_;
  int requests_ GUARDED_BY(mu_) = 0;
  bool done_ GUARDED_BY(mu_) = false;
  bool forced_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace asyncps::server
