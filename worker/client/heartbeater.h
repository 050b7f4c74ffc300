// Heartbeater: sends a heartbeat to every member of every shard's replica
// group each ClientOptions::heartbeat_interval, so shards count this
// worker as alive while it computes. It owns its sockets (one per member,
// apart from the Client's) and one thread.
//
// Thread safety: Start, Add and Stop are called by the Client's thread;
// the sending thread touches only its own sockets and the members marked
// GUARDED_BY(mu_).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/transport.h"
#include "worker/client.h"

namespace asyncps::worker::client {

class Heartbeater {
 public:
  Heartbeater(const ClientOptions& o, uint64_t incarnation)
      : options_(o), incarnation_(incarnation) {}
  ~Heartbeater() { Stop(); }

  // Connects to every member of options.servers and starts the thread.
  [[nodiscard]] Status Start();
  // A shard that joined the fleet (elastic layouts) gets heartbeats too,
  // every replica of it when it is a replica group.
  [[nodiscard]] Status Add(const std::string& group);
  // Ends the thread (idempotent).
  void Stop();

 private:
  void Run();

  ClientOptions options_;
  uint64_t incarnation_;
  std::vector<std::unique_ptr<ClientSocket>> sockets_;  // the thread's
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<ClientSocket>> added_ GUARDED_BY(mu_);
};

}  // namespace asyncps::worker::client
