// EtcdServer: a real etcd (one member, Debian's /usr/bin/etcd) for tests,
// listening on free loopback ports with its data in a directory the test
// owns. Started and stopped by PID; the destructor kills it (SIGKILL), so a
// failing test leaves no etcd behind.
//
// Flags: --heartbeat-interval=50 --election-timeout=250, which make etcd's
// smallest lease TTL 1 s (it is ceil(1.5 * election timeout) seconds; the
// default 1000 ms makes it 2 s) and let it serve ~0.35 s after start. See
// common/etcd_client.h for the lease timings measured with these flags.
// launch/pslaunch/etcd.py starts etcd the same way for local runs.
//
// Thread safety: none; one test thread drives it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/etcd_client.h"
#include "common/status.h"
#include "tests/util/process.h"

namespace asyncps::testing {

class EtcdServer {
 public:
  // Debian's etcd binary.
  static constexpr const char* kBinary = "/usr/bin/etcd";
  // The binary used: $ASYNCPS_TEST_ETCD when set (another etcd, or a
  // missing path to see the tests skip), else kBinary.
  static std::string Binary();
  // The flags that give 1 s leases (see above).
  static constexpr int kHeartbeatMs = 50;
  static constexpr int kElectionMs = 250;

  // True when Binary() exists and is executable.
  static bool Available();

  // Starts etcd with its data in `data_dir` (created if missing) and its
  // output in `log_dir`/etcd.log, on free loopback ports, and waits up to
  // 15 s until /health answers true. Unavailable when etcd exits or cannot
  // get its ports, TimedOut when it does not become healthy.
  static StatusOr<std::unique_ptr<EtcdServer>> Start(
      const std::string& data_dir, const std::string& log_dir);
  // The same, secured as a real deployment runs it (launch/pslaunch/
  // etcd_tls.py): TLS with the run's CA and client certificates required,
  // its certificates made in `tls_dir`, and etcd's authentication on, with
  // users root, asyncps-server (read/write under `prefix`) and
  // asyncps-worker (read <prefix>/elastic and <prefix>/members/).
  // endpoint() is https://.
  // Unavailable without openssl or etcdctl.
  static StatusOr<std::unique_ptr<EtcdServer>> StartSecure(
      const std::string& data_dir, const std::string& log_dir,
      const std::string& tls_dir, const std::string& prefix);
  // With StartSecure: the TLS files and credentials of `user` (one of the
  // above); `with_password` false leaves the password out.
  EtcdSecurity Security(const std::string& user,
                        bool with_password = true) const;
  ~EtcdServer();

  // "http://127.0.0.1:PORT": the client URL.
  const std::string& endpoint() const { return endpoint_; }
  // -1 while stopped.
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  // Everything etcd logged since its last (re)start.
  std::string Log() const;
  // A client of this etcd (default options).
  StatusOr<std::unique_ptr<EtcdClient>> NewClient() const;

  // SIGTERM, then SIGKILL after 10 s; waits for it to exit.
  void Stop();
  // Starts it again on the same data dir and ports, waiting for health.
  Status Restart();

 private:
  EtcdServer() = default;
  Status Launch();

  std::string data_dir_;
  std::string log_dir_;
  std::string tls_dir_;  // StartSecure: the certificates
  int client_port_ = 0;
  int peer_port_ = 0;
  int starts_ = 0;
  std::string endpoint_;
  std::string log_path_;
  std::unique_ptr<Process> process_;
};

}  // namespace asyncps::testing
