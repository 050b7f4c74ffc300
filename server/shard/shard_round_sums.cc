// Shard: replication after aggregation (BSP). A replicating primary hands
// its backups one record per round instead of every push
// (server/replication/replicator.h): the round's per-chunk sums, captured
// here before they are averaged, and the headers of the round's pushes and
// clocks, which a backup replays without data so that its de-duplication
// table, clocks and per-rank round bookkeeping follow the primary's. The
// backup then closes the round with the same code (ApplyBspRound) on the
// same sums and contributor counts: its weights and optimizer state are
// bitwise the primary's.
#include <glog/logging.h>

#include <cstring>

#include "server/shard/shard.h"
#include "server/shard/shard_types.h"

namespace asyncps::server {

bool Shard::AggregatesRounds() const {
  return options_.consistency == Consistency::kBsp &&
         !options_.transport_only && sparse_ == nullptr;
}

RoundSums Shard::CaptureSums() const {
  RoundSums sums;
  std::vector<uint32_t> ids;
  for (const auto& cp : chunks_) {
    const Chunk& c = *cp;
    if (c.contributors == 0 || c.acc.size() != c.n) continue;
    ids.push_back(c.id);
    BufferPtr b = Buffer::Allocate(c.n * sizeof(float));
    std::memcpy(b->data(), c.acc.data(), c.n * sizeof(float));
    sums.frames.push_back({b->data(), b->size(), b});
  }
  auto id_bytes = std::make_shared<std::vector<uint32_t>>(std::move(ids));
  sums.frames.insert(
      sums.frames.begin(),
      ByteView{reinterpret_cast<const uint8_t*>(id_bytes->data()),
               id_bytes->size() * sizeof(uint32_t), id_bytes});
  sums.round = bsp_round_;
  return sums;
}

bool Shard::TakeRoundSums(bool open, RoundSums* sums) {
  if (captured_) {
    *sums = std::move(*captured_);
    captured_.reset();
    return true;
  }
  if (!open || !layout_) return false;
  *sums = CaptureSums();
  return true;
}

Status Shard::InstallRoundSums(const std::vector<ByteView>& frames) {
  if (!layout_)
    return Status::FailedPrecondition("round sums before registration");
  if (frames.empty() || frames[0].size % sizeof(uint32_t) != 0 ||
      frames[0].size / sizeof(uint32_t) != frames.size() - 1) {
    return Status::InvalidArgument(
        "round sums: the chunk id frame names " +
        std::to_string(frames.empty() ? 0 : frames[0].size / 4) +
        " chunks for " +
        std::to_string(frames.empty() ? 0 : frames.size() - 1) + " frames");
  }
  std::vector<uint32_t> ids(frames.size() - 1);
  if (!ids.empty()) std::memcpy(ids.data(), frames[0].data, frames[0].size);
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= local_index_.size() || local_index_[id] < 0) {
      return Status::InvalidArgument("round sums of chunk " +
                                     std::to_string(id) + ", not this shard's");
    }
    const Chunk& c = *chunks_[local_index_[id]];
    if (frames[i + 1].size != c.n * sizeof(float) || c.acc.size() != c.n) {
      return Status::InvalidArgument(
          "round sums of chunk " + std::to_string(id) + ": " +
          std::to_string(frames[i + 1].size) + " bytes for " +
          std::to_string(c.n) + " elements");
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Chunk& c = *chunks_[local_index_[ids[i]]];
    std::memcpy(c.acc.data(), frames[i + 1].data, frames[i + 1].size);
  }
  return Status::OK();
}

Status Shard::ReplayPushRefs(const RequestHeader& req) {
  pending_.clear();
  rows_->pending.clear();
  ++stamp_;
  if (!AggregatesRounds() || !req.rows.empty()) {
    return Status::InvalidArgument(
        "a push replayed from a round record needs BSP and no sparse rows");
  }
  for (const ChunkRef& ref : req.chunks) {
    if (ref.chunk >= local_index_.size() || local_index_[ref.chunk] < 0) {
      return Status::InvalidArgument("replayed push of chunk " +
                                     std::to_string(ref.chunk) +
                                     ", not this shard's");
    }
    Chunk& c = *chunks_[local_index_[ref.chunk]];
    if (c.stamp == stamp_ || ref.num_elems != c.n) {
      return Status::InvalidArgument("replayed push: chunk " +
                                     std::to_string(ref.chunk) +
                                     " twice or of another size");
    }
    c.stamp = stamp_;
    PendingGrad p;
    p.chunk = &c;
    p.bytes = ref.byte_size;
    pending_.push_back(p);  // no gradient: the sums came with the record
  }
  return Status::OK();
}

Status Shard::CatchUpRound(int64_t round) {
  if (!AggregatesRounds() || round <= bsp_round_) return Status::OK();
  LOG(INFO) << "BSP: the primary closed round " << bsp_round_
            << " without a clock of the record (an eviction): closing it here, "
               "moving to "
            << round;
  bool applied = false;
  Status s = ApplyBspRound(round, &applied);
  if (!applied) return s;
  OnClocksChanged(nullptr);
  return s;
}

}  // namespace asyncps::server
