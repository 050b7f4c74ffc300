// ShmPulls: the shared-memory side of pulls (ClientOptions::
// shared_memory_bytes). It owns the sealed segment (common/shm_segment.h)
// that the client attaches to the shards on its host, hands out buffers in
// it (Client::AllocateShared), chooses the slot and the offsets of a pull
// written there by the shard itself, and checks such a pull's reply. Which
// shards hold the segment is ShardConn::shm_ok; sending the segment
// (kAttachShm) is ClientCore's.
//
// Thread safety: none; used by the Client's thread only (the shards write
// into the segment from their processes, one armed slot per pull).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/layout.h"
#include "common/shm_segment.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/client.h"

namespace asyncps::worker::client {

class ShmPulls {
 public:
  // Shared-memory pulls in flight per shard, at most.
  static constexpr uint32_t kSlotsPerShard = 8;

  // A segment of `bytes` with slots for `num_shards` shards.
  static StatusOr<std::unique_ptr<ShmPulls>> Create(size_t bytes,
                                                    int num_shards);

  // A buffer of num_floats floats in the segment, or nullptr.
  float* Allocate(size_t num_floats);

  // Fills h with a pull of every chunk of `shard` into shared memory, if
  // one of the shard's kSlotsPerShard slots is free and every destination
  // lies in the segment; false (h untouched) otherwise. REQUIRES: the
  // shard holds the segment.
  bool Destinations(int shard, const Layout& layout,
                    const std::vector<float*>& tensors, RequestHeader* h);
  // Armed before the request can leave: the shard writes only into an
  // armed slot.
  void Arm(uint32_t slot, uint64_t id) { segment_->Arm(slot, id); }
  // Frees a slot; if its shard is writing it right now, waits for it to
  // finish first (bounded: a shard that died mid-write never will).
  void Disarm(uint32_t slot, uint64_t id);
  // True when the shard finished writing pull `id` into `slot`.
  bool IsDone(uint32_t slot, uint64_t id) const {
    return segment_->IsDone(slot, id);
  }
  // The kAttachShm fields naming the segment.
  void FillAttach(RequestHeader* h) const;

  // A pull answered in shared memory: the shard wrote every chunk `ids`
  // where the request said; checks that the reply says so and counts the
  // bytes into *result.
  static Status CheckReply(const Layout& layout,
                           const std::vector<uint32_t>& ids,
                           const ReplyHeader& reply, TicketResult* result);

 private:
  explicit ShmPulls(std::unique_ptr<ShmSegment> segment)
      : segment_(std::move(segment)) {}
  std::unique_ptr<ShmSegment> segment_;
};

}  // namespace asyncps::worker::client
