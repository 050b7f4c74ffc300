// AdminCalls: the operator's requests every active shard answers: stats
// (one JSON text per shard), checkpoint, shutdown, heartbeat. Each is one
// ticket over the core (worker/client/core.h); Stats' texts are read by
// the ticket's own ReplyReader.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire.h"

namespace asyncps::worker::client {

class ClientCore;

class AdminCalls {
 public:
  explicit AdminCalls(ClientCore* core) : core_(core) {}

  // replies->at(s): shard s's stats text ("" for a shard not asked).
  Status Stats(std::vector<std::string>* replies,
               std::chrono::milliseconds timeout);
  Status Checkpoint(std::chrono::milliseconds timeout) {
    return Simple(RequestKind::kCheckpoint, timeout);
  }
  Status Shutdown(std::chrono::milliseconds timeout) {
    return Simple(RequestKind::kShutdown, timeout);
  }
  Status Heartbeat(std::chrono::milliseconds timeout) {
    return Simple(RequestKind::kHeartbeat, timeout);
  }

 private:
  Status Simple(RequestKind kind, std::chrono::milliseconds timeout);
  ClientCore* core_;  // not owned; owns this
};

}  // namespace asyncps::worker::client
