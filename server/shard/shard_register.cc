// Shard: registration of the model layout and allocation of this shard's
// chunks. Dispatch is in shard.cc, pulls in shard_pull.cc.
#include <glog/logging.h>

#include <algorithm>

#include "server/shard/shard.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {

Status Shard::HandleRegister(const RequestHeader& req, ReplyHeader* reply) {
  // After shards joined or left (elastic), a worker that starts again
  // registers with the shard count that cut the chunks, and is told the
  // layout it must route by.
  const bool elastic = elastic_->epoch > 0 && layout_;
  const int expect =
      elastic ? layout_->options().num_shards : options_.num_shards;
  if (elastic) reply->layout_doc = elastic_->doc;
  if (req.layout.num_shards != expect) {
    return Reject(
        RejectReason::kRegistrationMismatch,
        Status::InvalidArgument(
            "registration is for " + std::to_string(req.layout.num_shards) +
            " shards, this server is one of " + std::to_string(expect)));
  }
  if (layout_) {
    const auto& have = layout_->tensors();
    for (size_t i = 0; i < std::max(have.size(), req.tensors.size()); ++i) {
      if (i >= have.size() || i >= req.tensors.size() ||
          have[i] != req.tensors[i]) {
        const std::string& name =
            i < req.tensors.size() ? req.tensors[i].name : have[i].name;
        return Reject(RejectReason::kRegistrationMismatch,
                      Status::AlreadyExists(
                          "tensor '" + name + "' (index " + std::to_string(i) +
                          ") does not match the registered layout"));
      }
    }
    if (req.layout.chunk_elems != layout_->options().chunk_elems ||
        req.layout.min_chunk_elems != layout_->options().min_chunk_elems) {
      return Reject(
          RejectReason::kRegistrationMismatch,
          Status::AlreadyExists("chunk_elems/min_chunk_elems differ from the "
                                "registered layout"));
    }
    if (req.layout.placement != layout_->options().placement) {
      return Reject(
          RejectReason::kRegistrationMismatch,
          Status::AlreadyExists(std::string("placement ") +
                                PlacementName(req.layout.placement) +
                                " differs from the registered layout's, " +
                                PlacementName(layout_->options().placement)));
    }
    RETURN_IF_ERROR(
        sparse_requests_->RegisterTables(req.tables, /*created=*/false));
    reply->created = false;
    return Status::OK();
  }
  RETURN_IF_ERROR(ChargeLayoutTables(req.tensors, req.layout));
  StatusOr<Layout> layout = Layout::Create(req.tensors, req.layout);
  if (!layout.ok()) {
    layout_charge_.Reset();
    return Reject(RejectReason::kOther, layout.status());
  }
  layout_ = std::move(layout).value();
  Status st = AllocateChunks();
  if (st.ok())
    st = sparse_requests_->RegisterTables(req.tables, /*created=*/true);
  if (st.ok() && store_ != nullptr) {
    st = Checkpoint();
    if (!st.ok()) {
      reject_reason_ = RejectReason::kStore;
      st = st.WithContext("registration");
    }
  }
  if (!st.ok()) {
    layout_.reset();
    chunks_.clear();
    local_index_.clear();
    chunks_charge_.Reset();
    layout_charge_.Reset();
    sparse_requests_->DropTables();
    return st;  // reject_reason_ set by whoever failed
  }
  LOG(INFO) << "registered " << layout_->tensors().size() << " tensors, "
            << layout_->chunks().size() << " chunks; this shard holds "
            << chunks_.size() << " chunks, " << shard_bytes_
            << " bytes; memory budget " << budget_->used() << " of "
            << budget_->capacity() << " bytes in use";
  reply->created = true;
  return Status::OK();
}

Status Shard::ChargeLayoutTables(const std::vector<TensorSpec>& tensors,
                                 const LayoutOptions& options) {
  StatusOr<LayoutSize> size = Layout::Measure(tensors, options);
  if (!size.ok()) return Reject(RejectReason::kOther, size.status());
  if (size->num_chunks > UINT32_MAX) {
    return Reject(RejectReason::kOther,
                  Status::InvalidArgument(
                      "registration of " + std::to_string(size->num_chunks) +
                      " chunks: at most 2^32 (raise chunk_elems)"));
  }
  // The layout's tables plus this shard's index over every chunk id.
  const uint64_t bytes = size->table_bytes + size->num_chunks * sizeof(int32_t);
  StatusOr<MemoryBudget::Charge> c = budget_->Reserve(
      bytes, "the layout tables of " + std::to_string(size->num_tensors) +
                 " tensors, " + std::to_string(size->total_elems) +
                 " elements in " + std::to_string(size->num_chunks) +
                 " chunks");
  if (!c.ok()) return Reject(RejectReason::kMemoryBudget, c.status());
  layout_charge_ = std::move(c).value();
  return Status::OK();
}

Status Shard::AllocateChunks() {
  const Layout& l = *layout_;
  const size_t spe = state_per_elem_;
  const auto& mine = l.shard_chunks(options_.shard_id);
  // What this shard's part costs, before any of it is allocated: weights,
  // optimizer state, BSP sums, the decode scratch, and room for one pull
  // snapshot per chunk (reserved per snapshot when a pull needs it).
  uint64_t elems = 0, largest = 0;
  for (uint32_t id : mine) {
    elems += l.chunks()[id].num_elems;
    largest = std::max<uint64_t>(largest, l.chunks()[id].num_elems);
  }
  if (largest * sizeof(float) > options_.max_frame_bytes) {
    return Reject(RejectReason::kOther,
                  Status::InvalidArgument(
                      "a chunk of " + std::to_string(largest) +
                      " floats does not fit one message frame of at most " +
                      std::to_string(options_.max_frame_bytes) +
                      " bytes (lower chunk_elems or raise max_frame_bytes)"));
  }
  const uint64_t per_elem =
      sizeof(float) *
      (2 + spe + (options_.consistency == Consistency::kBsp ? 1 : 0));
  // Delay compensation keeps what every worker read: the tables of
  // snapshot references are reserved here, and the snapshots themselves
  // (about one copy of this shard's weights per worker) must fit too.
  const bool dc = options_.delay_compensation.enabled();
  const uint64_t dc_tables = dc ? static_cast<uint64_t>(options_.num_workers) *
                                      kDcReadSlots * mine.size() *
                                      sizeof(std::shared_ptr<ChargedBuffer>)
                                : 0;
  const uint64_t dc_reads =
      dc ? static_cast<uint64_t>(options_.num_workers) * elems * sizeof(float)
         : 0;
  const uint64_t rounds =  // BSP: the round each rank last pushed, per chunk
      options_.consistency == Consistency::kBsp
          ? mine.size() * static_cast<uint64_t>(options_.num_workers) *
                sizeof(int64_t)
          : 0;
  const uint64_t bytes =
      elems * per_elem + mine.size() * sizeof(Chunk) + dc_tables + rounds;
  const std::string what =
      "this shard's part of the model (" + std::to_string(mine.size()) +
      " chunks, " + std::to_string(elems) +
      " elements: weights, optimizer "
      "state" +
      (options_.consistency == Consistency::kBsp ? ", BSP sums" : "") +
      ", decode scratch" + (dc ? ", delay-compensation tables" : "") + ")";
  if (!budget_->Fits(bytes + elems * sizeof(float) + dc_reads)) {
    StatusOr<MemoryBudget::Charge> refused = budget_->Reserve(
        bytes + elems * sizeof(float) + dc_reads,
        what.substr(0, what.size() - 1) + ", pull snapshots" +
            (dc ? ", one read snapshot per worker for delay compensation"
                : "") +
            ")");
    return Reject(RejectReason::kMemoryBudget, refused.status());
  }
  StatusOr<MemoryBudget::Charge> charge = budget_->Reserve(bytes, what);
  if (!charge.ok()) return Reject(RejectReason::kMemoryBudget, charge.status());
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<int32_t> local_index;
  try {
    chunks.reserve(mine.size());
    local_index.assign(l.chunks().size(), -1);
    for (uint32_t id : mine) {
      const ChunkSpec& spec = l.chunks()[id];
      auto c = std::make_unique<Chunk>();
      c->id = id;
      c->n = spec.num_elems;
      c->w.resize(c->n);
      InitializeTensorRange(l.tensors()[spec.tensor], spec.offset,
                            spec.num_elems, c->w.data());
      c->state.assign(c->n * spe, 0.0f);
      if (options_.consistency == Consistency::kBsp) {
        c->acc.assign(c->n, 0.0f);
        c->pushed_round.assign(options_.num_workers, -1);
      }
      local_index[id] = static_cast<int32_t>(chunks.size());
      chunks.push_back(std::move(c));
    }
    pending_.reserve(chunks.size());
    touched_.reserve(chunks.size());
    pull_stamp_.assign(chunks.size(), 0);
    for (DcReads& r : dc_reads_) {
      for (DcReads::Slot& slot : r.slots) {
        slot = DcReads::Slot{};
        slot.chunks.resize(chunks.size());
      }
    }
  } catch (const std::bad_alloc&) {
    return Reject(RejectReason::kMemoryBudget,
                  Status::ResourceExhausted(
                      "out of memory allocating " + what +
                      " although the memory budget allowed it: lower "
                      "--memory_budget_mb"));
  }
  chunks_ = std::move(chunks);
  local_index_ = std::move(local_index);
  chunks_charge_ = std::move(charge).value();
  shard_bytes_ = elems * sizeof(float);
  return Status::OK();
}

}  // namespace asyncps::server
