// Status -> Python exception, and the Ctrl-C hook of blocking calls.
//
// Every non-OK Status raises the class of asyncps.errors named after its
// code (asyncps.InvalidArgument, asyncps.TimedOut, ...; all derive from
// asyncps.Error), with the Status message as the exception's text.
//
// Interrupter is the ClientOptions::interrupt hook of a client owned by
// Python: while a call waits with the GIL released, the client calls it every
// interrupt_poll; it takes the GIL and runs PyErr_CheckSignals(). A pending
// KeyboardInterrupt (or any exception a signal handler raised) ends the wait
// with Cancelled and stays set, and the binding re-raises it once the call
// is back (RethrowIfInterrupted). Later waits of the same call end at once.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <string>

#include "common/status.h"

namespace asyncps::python {

// Raises the asyncps exception for `s`. REQUIRES: !s.ok(), GIL held.
[[noreturn]] void Raise(const Status& s);

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T ValueOrThrow(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

class Interrupter {
 public:
  // The hook: called without the GIL from the waiting thread.
  Status Check();
  // With the GIL, after the call: throws the pending Python exception if
  // Check() saw a signal handler raise one.
  void RethrowIfInterrupted();
  // For destructors, which must not throw: clears the pending exception of
  // an interrupt and re-arms SIGINT (PyErr_SetInterrupt), so the
  // KeyboardInterrupt is raised at the caller's next bytecode instead.
  void DeferIfInterrupted();

 private:
  std::atomic<bool> interrupted_{false};
};

}  // namespace asyncps::python
