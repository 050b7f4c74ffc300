// A mutex, its scoped lock and a condition variable that Clang's
// thread-safety analysis understands (std::mutex carries no annotations in
// libstdc++). Members a mutex protects are declared GUARDED_BY(mu_), and
// functions that must be called with it held REQUIRES(mu_)
// (common/thread_annotations.h); in debug builds AssertHeld() checks that
// the calling thread holds it, backing "REQUIRES:" comments at run time.
//
// Thread safety: Mutex and CondVar are for many threads, MutexLock for the
// thread that made it.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/thread_annotations.h"

namespace asyncps {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Lowercase, as std::mutex's, so that std::condition_variable_any can
  // wait on it (CondVar below).
  void lock() ACQUIRE() {
    mu_.lock();
#ifndef NDEBUG
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  void unlock() RELEASE() {
#ifndef NDEBUG
    owner_.store(std::thread::id(), std::memory_order_relaxed);
#endif
    mu_.unlock();
  }
  // Debug builds: aborts unless the calling thread holds this mutex.
  void AssertHeld() const ASSERT_CAPABILITY(this) {
#ifndef NDEBUG
    assert(owner_.load(std::memory_order_relaxed) ==
           std::this_thread::get_id());
#endif
  }

 private:
  std::mutex mu_;
#ifndef NDEBUG
  std::atomic<std::thread::id> owner_{};
#endif
};

// Holds `mu` for its scope (std::lock_guard for Mutex).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release `mu` while they sleep and hold it again when they return;
// they may wake spuriously, so callers wait in a loop over their condition
// (written in the caller, where the analysis sees the guarded reads):
//   MutexLock l(&mu_);
//   while (!done_) cv_.Wait(&mu_);
class CondVar {
 public:
  void Wait(Mutex* mu) REQUIRES(*mu) { cv_.wait(*mu); }
  // False once `until` has passed.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu,
                 const std::chrono::time_point<Clock, Duration>& until)
      REQUIRES(*mu) {
    return cv_.wait_until(*mu, until) == std::cv_status::no_timeout ||
           Clock::now() < until;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace asyncps
