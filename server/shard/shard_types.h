// Private types of server/shard/shard.h shared by the shard_*.cc files. Not
// part of the server API.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/shm_segment.h"
#include "common/wire.h"
#include "server/internal/binary_io.h"
#include "server/shard/memory_budget.h"
#include "server/shard/shard.h"
#include "server/shard/shard_state.h"

namespace asyncps::server {
namespace internal {

// What the reply to a request refused for now (a push held behind another,
// a push to a frozen shard) asks the client to wait before it resends.
inline constexpr uint32_t kRetryMs = 20;

}  // namespace internal

struct ChargedBuffer;

namespace internal {

// One chunk owned by this shard (Shard::Chunk).
struct ShardChunk {
  uint32_t id = 0;
  uint64_t n = 0;              // elements
  std::vector<float> w;        // weights, n
  std::vector<float> state;    // optimizer state, n * state_per_elem
  std::vector<float> acc;      // BSP: sum of this round's gradients, n
  std::vector<float> scratch;  // decoded / realigned gradient, n (lazy)
  uint64_t version = 0;        // updates applied to this chunk
  uint64_t step = 0;           // optimizer steps (Adam bias correction)
  uint32_t contributors = 0;   // BSP: pushes summed into acc this round
  // BSP, per rank: the round whose gradient of this chunk it last pushed
  // (-1: none). One push per rank and round per chunk: an elastic re-route
  // may split one round's push into several to the same shard.
  std::vector<int64_t> pushed_round;
  uint64_t stamp = 0;  // push validation: seen in push #stamp
  // kAssign: the upload whose `state` request set this chunk's optimizer
  // state (kept by that upload's commit; 0: none).
  uint64_t state_upload = 0;
  // Weights as of snapshot_version, shared by the pull replies of that
  // version; charged to the memory budget until the last reply holding it
  // is sent.
  std::shared_ptr<ChargedBuffer> snapshot;
  uint64_t snapshot_version = ~uint64_t{0};
};

}  // namespace internal

// A reply buffer (snapshot, codec payload) and its share of the budget,
// released together by whoever drops the last reference.
struct ChargedBuffer {
  BufferPtr buffer;
  MemoryBudget::Charge charge;
};

// One validated gradient of a push, waiting for phase 2 (apply).
struct Shard::PendingGrad {
  Chunk* chunk = nullptr;
  const float* dense = nullptr;     // dense gradient (frame or scratch), or
  const uint8_t* sparse = nullptr;  // a validated top-k / random-k payload
  size_t bytes = 0;
};

// Elements [begin, end) of one chunk and their gradient: a unit of the
// parallel apply (chunks are cut into pieces, so one large chunk keeps
// every apply thread busy).
struct Shard::WorkPiece {
  Chunk* chunk = nullptr;
  const float* g = nullptr;  // the chunk's whole gradient (element 0)
  size_t begin = 0;
  size_t end = 0;
  bool bad = false;  // NaN/Inf scan: found one
};

struct Shard::ParkedPull {
  std::string peer;
  RequestHeader req;
  std::vector<ByteView> data;  // keys of sparse rows (kept alive here)
  TimePoint since;
  MemoryBudget::Charge charge;  // this object and the request's lists
};

// Owns every frame of one reply and counts bytes of it as unsent until
// ZeroMQ releases the last frame (on its I/O thread).
struct ReplyPin {
  std::vector<std::shared_ptr<const void>> owners;
  // Counters (total, peer, rank) and what this reply added to each.
  std::array<std::shared_ptr<std::atomic<uint64_t>>, 3> counters;
  std::array<uint64_t, 3> added{};
  ~ReplyPin() {
    for (size_t i = 0; i < counters.size(); ++i) {
      if (counters[i])
        counters[i]->fetch_sub(added[i], std::memory_order_relaxed);
    }
  }
};

// Delay compensation: the pull snapshots one worker read at its last
// kDcReadSlots clocks (server/optimizer/staleness_rules.h). The buffers are the
// shared pull snapshots, charged to the budget when they were made.
struct Shard::DcReads {
  struct Slot {
    uint64_t incarnation = 0;
    int64_t clock = -1;                                  // -1: empty
    std::vector<std::shared_ptr<ChargedBuffer>> chunks;  // by local index
  };
  std::array<Slot, kDcReadSlots> slots;
};

struct Shard::PullReplica {
  uint64_t incarnation = 0;
  std::string codec;  // the pull codec spec the replica follows
  uint64_t seq = 0;   // pull_seq of the last reply sent; 0: none
  std::vector<std::vector<float>> chunks;  // by local chunk index
  MemoryBudget::Charge charge;
};

// A client's shared-memory segment, mapped by this shard (shard_shm.cc).
struct Shard::ShmAttachment {
  int rank = -1;
  uint64_t incarnation = 0;
  std::unique_ptr<ShmSegment> segment;
};

}  // namespace asyncps::server
