// Shard: pulls into the shared memory of colocated clients
// (common/shm_segment.h). The client attaches a sealed memfd once; a pull
// that names a byte offset per chunk is answered by writing the weights
// there, straight from the live chunk (the shard's thread is the only
// writer of the weights, so no snapshot is needed), and a reply whose chunk
// refs have frame 0. Dispatch is in shard.cc, the rest of the pull path in
// shard_pull.cc.
//
// What a client can make the shard do is bounded: at most
// max_shm_segments mappings (the oldest is dropped), each at most
// max_shm_bytes and checked as shm_segment.h says; writes only inside the
// segment's data area, only for a pull whose slot the client armed, at most
// once per request.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "server/shard/shard.h"
#include "server/shard/shard_types.h"

namespace asyncps::server {

Status Shard::HandleAttachShm(const RequestHeader& req) {
  if (options_.max_shm_segments == 0) {
    return Reject(RejectReason::kSharedMemory,
                  Status::Unimplemented(
                      "shared memory is off on this shard (--max_shm_segments "
                      "0)"));
  }
  std::string why;
  StatusOr<std::unique_ptr<ShmSegment>> seg =
      ShmSegment::Attach(req.shm_pid, req.shm_fd, req.shm_size, req.shm_token,
                         options_.max_shm_bytes, &why);
  if (!seg.ok()) {
    // The cause stays in this log: the reply says the same for every
    // refusal (shm_segment.h).
    VLOG(1) << "attach_shm of rank " << req.rank << " (pid " << req.shm_pid
            << ", fd " << req.shm_fd << ") refused: " << why;
    return Reject(RejectReason::kSharedMemory,
                  seg.status().WithContext("shared memory not attached"));
  }
  // One segment per client process, and per worker rank: a new attach
  // replaces the old one (a restarted worker's old segment is unmapped, so
  // its memory is freed once its process is gone).
  if (req.rank >= 0) {
    DropShm(req.rank);
  } else {
    shm_.erase(std::remove_if(shm_.begin(), shm_.end(),
                              [&](const std::unique_ptr<ShmAttachment>& a) {
                                return a->rank == req.rank &&
                                       a->incarnation == req.incarnation;
                              }),
               shm_.end());
  }
  if (shm_.size() >= options_.max_shm_segments) shm_.erase(shm_.begin());
  auto a = std::make_unique<ShmAttachment>();
  a->rank = req.rank;
  a->incarnation = req.incarnation;
  a->segment = std::move(seg).value();
  VLOG(1) << "shared memory of rank " << req.rank
          << " attached: " << a->segment->size() << " bytes";
  shm_.push_back(std::move(a));
  return Status::OK();
}

void Shard::DropShm(int rank) {
  shm_.erase(std::remove_if(shm_.begin(), shm_.end(),
                            [&](const std::unique_ptr<ShmAttachment>& a) {
                              return a->rank == rank;
                            }),
             shm_.end());
}

Shard::ShmAttachment* Shard::FindShm(const RequestHeader& req) {
  for (auto& a : shm_) {
    if (a->rank == req.rank && a->incarnation == req.incarnation)
      return a.get();
  }
  return nullptr;
}

Status Shard::ValidateShmPull(const RequestHeader& req) {
  const ShmAttachment* a = FindShm(req);
  if (a == nullptr) {
    return Reject(RejectReason::kSharedMemory,
                  Status::FailedPrecondition(
                      "pull into shared memory, but none is attached for this "
                      "client (attach first)"));
  }
  if (req.id == 0 || req.id > ShmSegment::kMaxId) {
    return Reject(RejectReason::kSharedMemory,
                  Status::InvalidArgument("pull into shared memory needs an "
                                          "id in [1, 2^61)"));
  }
  if (req.pull_chunks.empty() ||
      req.pull_shm_offsets.size() != req.pull_chunks.size()) {
    return Reject(
        RejectReason::kSharedMemory,
        Status::InvalidArgument(
            "pull into shared memory needs one offset per chunk id "
            "(" +
            std::to_string(req.pull_shm_offsets.size()) + " offsets, " +
            std::to_string(req.pull_chunks.size()) + " chunks)"));
  }
  if (req.pull_shm_slot >= a->segment->num_slots()) {
    return Reject(
        RejectReason::kSharedMemory,
        Status::InvalidArgument("shared-memory slot " +
                                std::to_string(req.pull_shm_slot) +
                                " out of range: the segment has " +
                                std::to_string(a->segment->num_slots())));
  }
  if ((!req.pull_codec.empty() && req.pull_codec != "none") ||
      !req.rows.empty() || !req.pull_dense) {
    return Reject(RejectReason::kSharedMemory,
                  Status::InvalidArgument(
                      "pulls into shared memory carry raw fp32 chunks only "
                      "(no pull codec, no rows)"));
  }
  for (size_t i = 0; i < req.pull_chunks.size(); ++i) {
    // ValidatePullRequest checked the ids.
    const uint64_t bytes =
        chunks_[local_index_[req.pull_chunks[i]]]->n * sizeof(float);
    if (!a->segment->ValidRange(req.pull_shm_offsets[i], bytes,
                                alignof(float))) {
      return Reject(RejectReason::kSharedMemory,
                    Status::InvalidArgument(
                        "shared-memory offset " +
                        std::to_string(req.pull_shm_offsets[i]) +
                        " for chunk " + std::to_string(req.pull_chunks[i]) +
                        " (" + std::to_string(bytes) +
                        " bytes) is outside the segment's data area or "
                        "unaligned"));
    }
  }
  return Status::OK();
}

Status Shard::AnswerShmPull(const RequestHeader& req,
                            const std::vector<uint32_t>& ids,
                            OutgoingReply* reply) {
  // AnswerPull ran ValidatePullRequest (and so ValidateShmPull) just now:
  // the segment is attached and every range lies in it.
  ShmSegment& seg = *FindShm(req)->segment;
  if (!seg.Claim(req.pull_shm_slot, req.id)) {
    return Reject(RejectReason::kSharedMemory,
                  Status::Cancelled(
                      "pull " + std::to_string(req.id) +
                      " into shared memory is not awaited (answered already, "
                      "or abandoned): nothing written"));
  }
  reply->header.chunks.clear();
  reply->header.chunks.reserve(ids.size());
  reply->frames.clear();
  uint64_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Chunk& c = *chunks_[local_index_[ids[i]]];
    std::memcpy(seg.base() + req.pull_shm_offsets[i], c.w.data(),
                c.n * sizeof(float));
    ChunkRef ref;
    ref.chunk = c.id;
    ref.frame = 0;  // in shared memory
    ref.num_elems = c.n;
    ref.version = c.version;
    ref.byte_size = c.n * sizeof(float);
    bytes += ref.byte_size;
    reply->header.chunks.push_back(ref);
  }
  seg.Finish(req.pull_shm_slot, req.id);
  ++counters_.pulls;
  counters_.shm_bytes_out += bytes;
  return Status::OK();
}

}  // namespace asyncps::server
