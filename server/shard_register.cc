// Shard: registration of the model layout and allocation of this shard's
// chunks. Dispatch is in shard.cc, pulls in shard_pull.cc.
#include <glog/logging.h>

#include <algorithm>

#include "server/internal/shard_types.h"
#include "server/shard.h"

namespace asyncps::server {

Status Shard::HandleRegister(const RequestHeader& req, ReplyHeader* reply) {
  if (req.layout.num_shards != options_.num_shards) {
    return Reject(
        RejectReason::kRegistrationMismatch,
        Status::InvalidArgument("registration is for " +
                                std::to_string(req.layout.num_shards) +
                                " shards, this server is one of " +
                                std::to_string(options_.num_shards)));
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
    reply->created = false;
    return Status::OK();
  }
  StatusOr<Layout> layout = Layout::Create(req.tensors, req.layout);
  if (!layout.ok()) return Reject(RejectReason::kOther, layout.status());
  layout_ = std::move(layout).value();
  Status st = AllocateChunks();
  if (st.ok() && store_ != nullptr) st = Checkpoint();
  if (!st.ok()) {
    layout_.reset();
    chunks_.clear();
    local_index_.clear();
    return Reject(RejectReason::kStore, st.WithContext("registration"));
  }
  LOG(INFO) << "registered " << layout_->tensors().size() << " tensors, "
            << layout_->chunks().size() << " chunks; this shard holds "
            << chunks_.size() << " chunks, "
            << layout_->ShardBytes()[options_.shard_id] << " bytes";
  reply->created = true;
  return Status::OK();
}

Status Shard::AllocateChunks() {
  const Layout& l = *layout_;
  const size_t spe = optimizer_->state_per_elem();
  const auto& mine = l.shard_chunks(options_.shard_id);
  chunks_.clear();
  chunks_.reserve(mine.size());
  local_index_.assign(l.chunks().size(), -1);
  for (uint32_t id : mine) {
    const ChunkSpec& spec = l.chunks()[id];
    auto c = std::make_unique<Chunk>();
    c->id = id;
    c->n = spec.num_elems;
    c->w.resize(c->n);
    InitializeTensorRange(l.tensors()[spec.tensor], spec.offset, spec.num_elems,
                          c->w.data());
    c->state.assign(c->n * spe, 0.0f);
    if (options_.consistency == Consistency::kBsp) c->acc.assign(c->n, 0.0f);
    local_index_[id] = static_cast<int32_t>(chunks_.size());
    chunks_.push_back(std::move(c));
  }
  pending_.reserve(chunks_.size());
  touched_.reserve(chunks_.size());
  return Status::OK();
}

}  // namespace asyncps::server
