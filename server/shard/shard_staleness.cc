// Shard: delay compensation of stale gradients (DC-ASGD, Zheng et al. 2017;
// the rule itself is in server/optimizer/staleness_rules.h).
//
// Each pull answered for a worker (rank >= 0) records, per chunk it named,
// the chunk's pull snapshot as what that worker read at the pull's clock;
// the snapshot is the ref-counted buffer every reply of that chunk version
// shares, so recording it copies nothing (the next version gets a new
// buffer while a read still holds the old one). A push at clock c is then
// corrected against the snapshots of that worker's pull at clock c. Each
// worker keeps its reads of kDcReadSlots distinct clocks (so a prefetched
// pull for c+1 does not drop the read of c before c's push arrives); an
// evicted worker's reads are freed.
#include <glog/logging.h>

#include <algorithm>

#include "server/shard/shard.h"
#include "server/shard/shard_types.h"

namespace asyncps::server {

Status Shard::RecordDcRead(const RequestHeader& req,
                           const std::vector<uint32_t>& ids) {
  DcReads& reads = dc_reads_[req.rank];
  DcReads::Slot* slot = nullptr;
  for (DcReads::Slot& s : reads.slots) {
    if (s.clock == req.clock && s.incarnation == req.incarnation) slot = &s;
  }
  if (slot == nullptr) {
    // Replace the oldest read (or an empty slot, clock -1).
    slot =
        &*std::min_element(reads.slots.begin(), reads.slots.end(),
                           [](const DcReads::Slot& a, const DcReads::Slot& b) {
                             return a.clock < b.clock;
                           });
    for (auto& c : slot->chunks) c.reset();
    slot->clock = req.clock;
    slot->incarnation = req.incarnation;
  }
  for (uint32_t id : ids) {
    const int32_t local = local_index_[id];
    Chunk& c = *chunks_[local];
    RETURN_IF_ERROR(EnsureSnapshot(c, nullptr));
    slot->chunks[local] = c.snapshot;
  }
  return Status::OK();
}

void Shard::FreeDcReads(int rank) {
  if (dc_reads_.empty()) return;
  for (DcReads::Slot& s : dc_reads_[rank].slots) {
    for (auto& c : s.chunks) c.reset();
    s.clock = -1;
  }
}

void Shard::CompensatePending(const RequestHeader& req) {
  const DelayCompensationOptions& dc = options_.delay_compensation;
  const DcReads::Slot* slot = nullptr;
  for (const DcReads::Slot& s : dc_reads_[req.rank].slots) {
    if (s.clock == req.clock && s.incarnation == req.incarnation) slot = &s;
  }
  const size_t spe_opt = optimizer_->state_per_elem();
  bool all = true;
  for (PendingGrad& p : pending_) {
    Chunk& c = *p.chunk;
    // ValidatePush densified every payload (sparse ones too) when
    // compensation is on.
    CHECK(p.dense != nullptr);
    float* ms = dc.adaptive() ? c.state.data() + c.n * spe_opt : nullptr;
    const std::shared_ptr<ChargedBuffer>* read =
        slot != nullptr ? &slot->chunks[local_index_[c.id]] : nullptr;
    if (read == nullptr || !*read) {
      UpdateMeanSquare(dc, p.dense, ms, c.n);
      all = false;
      continue;
    }
    if (c.scratch.size() != c.n) c.scratch.resize(c.n);
    CompensateDelay(dc, p.dense, c.w.data(),
                    reinterpret_cast<const float*>((*read)->buffer->data()), ms,
                    c.n, c.scratch.data());
    p.dense = c.scratch.data();
  }
  if (all) {
    ++counters_.dc_compensated;
  } else {
    ++counters_.dc_uncompensated;
    LOG_EVERY_N(INFO, 100) << "delay compensation: no read of rank " << req.rank
                           << " at clock " << req.clock
                           << ": applied (part of) its push uncorrected";
  }
}

}  // namespace asyncps::server
