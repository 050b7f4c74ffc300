// ShmPulls (worker/client/shm_pulls.h): slots, offsets and reply checks of
// pulls written into shared memory.
#include "worker/client/shm_pulls.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace asyncps::worker::client {

using std::chrono::milliseconds;

StatusOr<std::unique_ptr<ShmPulls>> ShmPulls::Create(size_t bytes,
                                                     int num_shards) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<ShmSegment> segment,
      ShmSegment::Create(bytes, static_cast<uint32_t>(std::min<uint64_t>(
                                    uint64_t{kSlotsPerShard} *
                                        static_cast<uint64_t>(num_shards),
                                    ShmSegment::kMaxSlots))));
  return std::unique_ptr<ShmPulls>(new ShmPulls(std::move(segment)));
}

float* ShmPulls::Allocate(size_t num_floats) {
  if (num_floats > SIZE_MAX / sizeof(float)) return nullptr;
  return static_cast<float*>(segment_->Allocate(num_floats * sizeof(float)));
}

bool ShmPulls::Destinations(int shard, const Layout& layout,
                            const std::vector<float*>& tensors,
                            RequestHeader* h) {
  const uint64_t first = uint64_t{kSlotsPerShard} * shard;
  bool found = false;
  for (uint64_t i = first;
       i < first + kSlotsPerShard && i < segment_->num_slots() && !found; ++i) {
    if (segment_->IsFree(static_cast<uint32_t>(i))) {
      h->pull_shm_slot = static_cast<uint32_t>(i);
      found = true;
    }
  }
  if (!found) return false;
  const auto& ids = layout.shard_chunks(shard);
  h->pull_chunks.assign(ids.begin(), ids.end());
  h->pull_shm_offsets.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const ChunkSpec& spec = layout.chunks()[ids[i]];
    if (!segment_->Contains(tensors[spec.tensor] + spec.offset,
                            spec.num_elems * sizeof(float),
                            &h->pull_shm_offsets[i])) {
      h->pull_chunks.clear();
      h->pull_shm_offsets.clear();
      return false;
    }
  }
  return !ids.empty();
}

void ShmPulls::Disarm(uint32_t slot, uint64_t id) {
  if (!segment_->Disarm(slot, id, milliseconds(5000))) {
    LOG(WARNING) << "a shard claimed shared-memory pull " << id
                 << " and did not finish writing it within 5 s";
  }
}

void ShmPulls::FillAttach(RequestHeader* h) const {
  h->shm_pid = segment_->pid();
  h->shm_fd = segment_->fd();
  h->shm_size = segment_->size();
  h->shm_token = segment_->token();
}

Status ShmPulls::CheckReply(const Layout& layout,
                            const std::vector<uint32_t>& ids,
                            const ReplyHeader& reply, TicketResult* result) {
  if (reply.chunks.size() != ids.size() || !reply.rows.empty()) {
    return Status::Corruption(
        "shared-memory pull reply has " + std::to_string(reply.chunks.size()) +
        " chunks, expected " + std::to_string(ids.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const ChunkRef& c = reply.chunks[i];
    const uint64_t n = layout.chunks()[ids[i]].num_elems;
    if (c.chunk != ids[i] || c.frame != 0 || c.codec != 0 || c.num_elems != n ||
        c.byte_size != n * sizeof(float)) {
      return Status::Corruption(
          "shared-memory pull reply has an inconsistent chunk ref for "
          "chunk " +
          std::to_string(c.chunk));
    }
    result->bytes_received += c.byte_size;
  }
  return Status::OK();
}

}  // namespace asyncps::worker::client
