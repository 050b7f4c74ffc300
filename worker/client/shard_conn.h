// ShardConn: everything a Client keeps about one shard connection: the
// shard's replica group and the member talked to, the socket to it, what
// the shard said of its limits, and what this worker told it (its clock,
// the sparse pull numbering, the shared-memory segment). One per shard,
// owned by ClientCore (worker/client/core.h), in shard order.
//
// Thread safety: none; used by the Client's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/transport.h"

namespace asyncps::worker::client {

struct ShardConn {
  // The replica group's endpoints (one for an unreplicated shard; grows
  // when a redirect names a member not listed).
  std::vector<std::string> members;
  size_t current = 0;  // members[current] is the member talked to
  std::unique_ptr<ClientSocket> socket;  // connected to members[current]
  int connects = 0;  // connections this socket has seen (1 = its first)
  // Largest reply accepted, bytes (raised to what a pull can need).
  int64_t reply_limit = 0;
  // The member last left for silence (SIZE_MAX: none), and when.
  size_t abandoned = SIZE_MAX;
  std::chrono::steady_clock::time_point abandoned_at;
  // When the member last answered anything, and when it was last probed.
  std::chrono::steady_clock::time_point last_reply_at;
  std::chrono::steady_clock::time_point probed_at;
  // The highest clock started to it (StartClock, StartClockShards); -1:
  // none.
  int64_t announced_clock = -1;
  uint64_t pull_seq = 0;    // the last sparse pull reply applied
  int64_t limit_bytes = 0;  // the shard's request limit, bytes
  int64_t limit_frame = 0;  // the shard's frame limit, bytes
  bool shm_ok = false;      // the shared-memory segment is attached
};

}  // namespace asyncps::worker::client
