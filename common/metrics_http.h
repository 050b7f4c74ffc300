// MetricsServer: serves a metrics Registry over HTTP for Prometheus.
//
//   GET /metrics   the registry in the text exposition format 0.0.4
//   GET /          a one-line index pointing at /metrics
//   anything else  404 (unknown path) or 405 (other methods)
//
// The HTTP library is cpp-httplib (Debian's libcpp-httplib); this adapter
// keeps its types out of the header. Requests are served by a small pool of
// threads of its own, so a scrape never runs on (or waits for) a caller's
// event loop or training step: rendering reads the registry's atomics.
// Slow or idle clients are cut after the read/write timeouts; connections
// beyond the pool wait in the accept queue. A request line or header larger
// than the library's limits gets 4xx, a body is never read.
//
// Ownership: the registry must outlive the server. Destroying the server
// stops it and joins its threads.
// Thread safety: port() and endpoint() may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/status.h"

namespace asyncps::metrics {

struct MetricsServerOptions {
  // Address to bind. Default: "127.0.0.1" (loopback only); "0.0.0.0" for
  // scrapes from other hosts.
  std::string bind = "127.0.0.1";
  // TCP port; 0 picks a free one (see port()). Default: 0.
  int port = 0;
  // If set, the bound port is written to this file (decimal, newline)
  // atomically (tmp + rename) once serving, for launchers and tests.
  // Default: "".
  std::string port_file;
  // Threads serving requests, >= 1. Default: 2.
  int threads = 2;
  // A client that sends nothing (or reads nothing) for this long is
  // disconnected. Default: 2 s.
  std::chrono::milliseconds io_timeout{2000};
};

class MetricsServer {
 public:
  // Binds and starts serving `registry` on a thread of its own.
  // InvalidArgument for bad options, Unavailable when the address cannot be
  // bound.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, const Registry* registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  // "http://<bind>:<port>/metrics"
  std::string endpoint() const;
  // Scrapes answered so far.
  uint64_t scrapes() const;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncps::metrics
