// Test utilities for multi-process tests: start real ps_server / ps_worker
// processes, wait for their readiness, kill them by PID, and temp dirs.
//
// Every process started here is killed (SIGKILL) when its handle is
// destroyed, so a failing test leaves no orphans.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps::testing {

// A temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string Sub(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

// A child process whose stdout+stderr go to `log_path`.
class Process {
 public:
  static StatusOr<std::unique_ptr<Process>> Start(
      const std::vector<std::string>& argv, const std::string& log_path);
  ~Process();

  pid_t pid() const { return pid_; }
  // Sends `sig` (default SIGKILL) and reaps the process.
  void Kill(int sig = 9);
  // Waits up to `timeout` for the process to exit; returns its exit code,
  // 128 + signal when killed, or TimedOut.
  StatusOr<int> Wait(std::chrono::milliseconds timeout);
  bool Running();
  // The log's contents.
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_path_;
};

// Path of a built binary (ps_server, ps_worker, ...): in the build's bin/,
// or in $ASYNCPS_TEST_BIN_DIR when set (to run a test against other binaries,
// e.g. a build without a fix, to see the test fail).
std::string BinPath(const std::string& name);

// A field of /proc/PID/status in KiB ("VmRSS", "VmHWM"); 0 if unreadable.
uint64_t ProcStatusKib(pid_t pid, const std::string& field);

// Starts ps_server with an ephemeral port and waits for its ready file;
// `endpoint` receives the bound address. `extra` flags are appended. The
// words of $ASYNCPS_TEST_SERVER_PREFIX, when set, go before the binary
// (e.g. "/usr/bin/prlimit --as=4294967296 --").
struct ServerHandle {
  std::unique_ptr<Process> process;
  std::string endpoint;
};
StatusOr<ServerHandle> StartServer(
    const TempDir& dir, const std::string& name,
    const std::vector<std::string>& extra,
    const std::string& endpoint = "tcp://127.0.0.1:0");

// Reads a whole file; empty when missing.
std::string ReadFile(const std::string& path);

}  // namespace asyncps::testing
