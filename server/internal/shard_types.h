// Private types of server/shard.h shared by shard.cc, shard_push.cc and
// shard_persist.cc. Not part of the server API.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/wire.h"
#include "server/internal/binary_io.h"
#include "server/shard.h"

namespace asyncps::server {

// One chunk owned by this shard.
struct Shard::Chunk {
  uint32_t id = 0;
  uint64_t n = 0;              // elements
  std::vector<float> w;        // weights, n
  std::vector<float> state;    // optimizer state, n * state_per_elem
  std::vector<float> acc;      // BSP: sum of this round's gradients, n
  std::vector<float> scratch;  // decoded / realigned gradient, n (lazy)
  uint64_t version = 0;        // updates applied to this chunk
  uint64_t step = 0;           // optimizer steps (Adam bias correction)
  uint32_t contributors = 0;   // BSP: pushes summed into acc this round
  uint64_t stamp = 0;          // push validation: seen in push #stamp
  BufferPtr snapshot;          // weights as of snapshot_version (pulls)
  uint64_t snapshot_version = ~uint64_t{0};
};

// One validated gradient of a push, waiting for phase 2 (apply).
struct Shard::PendingGrad {
  Chunk* chunk = nullptr;
  const float* dense = nullptr;     // dense gradient (frame or scratch), or
  const uint8_t* sparse = nullptr;  // a validated top-k / random-k payload
  size_t bytes = 0;
};

struct Shard::ParkedPull {
  std::string peer;
  RequestHeader req;
  std::vector<ByteView> data;  // keys of sparse rows (kept alive here)
};

}  // namespace asyncps::server
