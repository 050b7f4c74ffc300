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
// A thread of its own accepts and reads every connection's request head
// (line and headers) with poll(2); only a complete head goes to a pool
// thread, so slow clients never hold one and never delay a scrape. A head
// must arrive within request_timeout of the accept (and io_timeout of its
// last byte), or the connection gets 408 and is closed; more than
// max_headers lines or max_header_bytes get 431; past max_connections the
// oldest connection still sending its head is dropped. A body is never
// read; one request per connection (Connection: close).
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
  // The request line and every header of a request must arrive within this
  // long of its connection being accepted, however steadily they trickle in
  // (io_timeout bounds each wait, this the whole head), and its reply must
  // be written within this long of the head's end; past it the connection
  // is closed (after a 408 if the head was late). Default: 5 s.
  std::chrono::milliseconds request_timeout{5000};
  // Most header lines a request may carry, >= 1; more get 431 and the
  // connection closed. Default: 100.
  int max_headers = 100;
  // Most bytes of a request's line and headers together, in [256, 1 MiB];
  // more get 431 and the connection closed. Default: 16384 (16 KiB).
  int max_header_bytes = 16384;
  // Most connections open at once, >= 1: those still sending their request
  // head, those waiting for a thread, those being answered. One more evicts
  // the oldest connection still sending its head (a correct scraper sends
  // its whole request at once: the slow ones go first); when none is, the
  // new one gets 503. Default: 256.
  int max_connections = 256;
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
