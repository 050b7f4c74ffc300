// Uploads: the client side of kAssign (common/protocol.capnp): one upload
// request to a shard (Assign: begin, values, state, rows, commit, clear),
// reads of the shards' optimizer state and of row records, and pages of
// table scans. Each is a ticket over the core (worker/client/core.h) whose
// replies its own ReplyReader checks and copies out. The whole upload
// protocol (claims, retries, commits) is worker/upload.h's.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/client.h"

namespace asyncps::worker::client {

class ClientCore;

class Uploads {
 public:
  explicit Uploads(ClientCore* core) : core_(core) {}

  // Client::Assign, ReadOptimizerState, ReadRowRecords and ScanRows.
  Status Assign(int shard, AssignRequest request, bool* claimed,
                std::chrono::milliseconds timeout);
  Status ReadOptimizerState(OptimizerState* out,
                            std::chrono::milliseconds timeout);
  Status ReadRowRecords(uint32_t table, const uint64_t* keys, size_t n,
                        uint8_t* out, std::chrono::milliseconds timeout);
  Status ScanRows(int shard, uint32_t table, uint64_t from, size_t max_rows,
                  std::vector<uint64_t>* keys, std::vector<uint8_t>* records,
                  std::chrono::milliseconds timeout, uint64_t* snapshot);

 private:
  ClientCore* core_;  // not owned; owns this
};

}  // namespace asyncps::worker::client
