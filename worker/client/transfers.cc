// ClientCore's pushes, pulls and clocks (worker/client/core.h): each
// split by shard into one request per shard under one ticket; a pull's
// replies are written by its PullReader (worker/client/pull_reader.h).
#include <algorithm>
#include <memory>
#include <string>

#include "compression/codec.h"
#include "worker/client/core.h"
#include "worker/client/pull_reader.h"
#include "worker/internal/rows_plan.h"

namespace asyncps::worker::client {

namespace {

internal::RowsInput Input(const RowsPush& r) {
  return {r.table, r.keys, r.n, r.grads, nullptr};
}
internal::RowsInput Input(const RowsPull& r) {
  return {r.table, r.keys, r.n, nullptr, r.out};
}
template <typename Rows>
std::vector<internal::RowsInput> Inputs(const std::vector<Rows>& rows) {
  std::vector<internal::RowsInput> in;
  in.reserve(rows.size());
  for (const Rows& r : rows) in.push_back(Input(r));
  return in;
}

}  // namespace

StatusOr<Ticket> ClientCore::StartPushRows(int64_t clock,
                                           std::vector<ChunkPayload> chunks,
                                           const std::vector<RowsPush>& rows) {
  if (!layout_) return Status::FailedPrecondition("push before Register()");
  internal::RowsPlan plan;
  if (!rows.empty()) {
    RETURN_IF_ERROR(plan.Build(tables_, num_shards(), Inputs(rows),
                               /*push=*/true, router_.key_ranges()));
  }
  std::vector<std::vector<size_t>> by_shard(num_shards());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].chunk >= layout_->chunks().size()) {
      return Status::InvalidArgument("push of unknown chunk " +
                                     std::to_string(chunks[i].chunk));
    }
    by_shard[layout_->chunks()[chunks[i].chunk].shard].push_back(i);
  }
  // A push a shard can never accept is refused here, not sent and resent.
  for (int s = 0; s < num_shards(); ++s) {
    uint64_t total = 256 + 64 * by_shard[s].size(), largest = 0;
    for (size_t i : by_shard[s]) {
      total += chunks[i].data.size;
      largest = std::max<uint64_t>(largest, chunks[i].data.size);
    }
    if (!plan.empty()) {
      for (const internal::RowsPlan::Part& part : plan.parts(s)) {
        const uint64_t rows =
            part.n * tables_[part.table].dim * sizeof(float);  // fp32: most
        total += 64 + part.n * sizeof(uint64_t) + rows;
        largest = std::max<uint64_t>(largest, rows);
      }
    }
    if (total > static_cast<uint64_t>(shards_[s].limit_bytes) ||
        largest > static_cast<uint64_t>(shards_[s].limit_frame)) {
      return Status::InvalidArgument(
          "push of " + std::to_string(total) + " bytes (largest frame " +
          std::to_string(largest) + ") to shard " + std::to_string(s) +
          " exceeds its limits of " + std::to_string(shards_[s].limit_bytes) +
          " bytes per request and " + std::to_string(shards_[s].limit_frame) +
          " per frame (ps_server --max_message_bytes, --max_frame_bytes)");
    }
  }
  Ticket t = NewTicket();
  for (int s = 0; s < num_shards(); ++s) {
    if (by_shard[s].empty() && (plan.empty() || plan.parts(s).empty()))
      continue;
    RequestHeader h = NewHeader(RequestKind::kPush);
    h.clock = clock;
    std::vector<Frame> frames(1);
    for (size_t i : by_shard[s]) {
      ChunkPayload& p = chunks[i];
      ChunkRef ref;
      ref.chunk = p.chunk;
      ref.frame = static_cast<uint32_t>(frames.size());
      ref.codec = p.codec;
      ref.num_elems = layout_->chunks()[p.chunk].num_elems;
      ref.byte_size = p.data.size;
      h.chunks.push_back(ref);
      frames.push_back(std::move(p.data));
    }
    std::vector<RowsSent> sent;
    if (!plan.empty()) {
      for (size_t i = 0; i < plan.parts(s).size(); ++i) {
        const internal::RowsPlan::Part& part = plan.parts(s)[i];
        sent.push_back(
            RowsSent{part.table, part.n, part.keys, part.grads, s, i, {}});
      }
      RETURN_IF_ERROR(AddRows(sent, /*push=*/true, &h, &frames));
    }
    RETURN_IF_ERROR(Enqueue(t, s, h, std::move(frames), std::move(sent)));
  }
  return t;
}

StatusOr<Ticket> ClientCore::StartPullRows(int64_t clock,
                                           const std::vector<float*>& tensors,
                                           const std::vector<RowsPull>& rows,
                                           const std::string& codec) {
  if (!layout_) return Status::FailedPrecondition("pull before Register()");
  std::shared_ptr<internal::RowsPlan> plan;
  if (!rows.empty()) {
    plan = std::make_shared<internal::RowsPlan>();
    RETURN_IF_ERROR(plan->Build(tables_, num_shards(), Inputs(rows),
                                /*push=*/false, router_.key_ranges()));
  }
  const bool dense = !tensors.empty() || rows.empty();
  if (dense && tensors.size() != layout_->tensors().size()) {
    return Status::InvalidArgument(
        "pull needs " + std::to_string(layout_->tensors().size()) +
        " buffers, got " + std::to_string(tensors.size()));
  }
  RequestHeader h = NewHeader(RequestKind::kPull);
  h.clock = clock;
  h.pull_codec = codec;
  // Sparse pull codecs answer with the change since the reply numbered
  // pull_base_seq, to be added to `tensors` (which must hold that pull's
  // result); each shard keeps its own numbering.
  h.pull_dense = dense;
  Ticket t = NewTicket(std::make_unique<PullReader>(this, tensors, plan));
  const bool raw = codec.empty() || codec == "none";
  for (int s = 0; s < num_shards(); ++s) {
    const bool has_rows = plan && !plan->parts(s).empty();
    if (!dense && !has_rows) continue;
    // A shard that owns no chunk (it left an elastic fleet) is not asked.
    if (!has_rows && layout_->shard_chunks(s).empty()) continue;
    h.pull_base_seq = shards_[s].pull_seq;
    h.rows.clear();
    h.pull_chunks.clear();
    h.pull_shm_offsets.clear();
    if (dense && raw && !has_rows && shm_ && shards_[s].shm_ok &&
        shm_->Destinations(s, *layout_, tensors, &h)) {
      RETURN_IF_ERROR(Enqueue(t, s, h, std::vector<Frame>(1)));
      continue;
    }
    std::vector<Frame> frames(1);
    std::vector<RowsSent> sent;
    if (has_rows) {
      for (size_t i = 0; i < plan->parts(s).size(); ++i) {
        const internal::RowsPlan::Part& part = plan->parts(s)[i];
        sent.push_back(
            RowsSent{part.table, part.n, part.keys, nullptr, s, i, {}});
      }
      RETURN_IF_ERROR(AddRows(sent, /*push=*/false, &h, &frames));
    }
    RETURN_IF_ERROR(Enqueue(t, s, h, std::move(frames), std::move(sent)));
  }
  return t;
}

StatusOr<Ticket> ClientCore::StartPullChunks(
    int64_t clock, const std::vector<uint32_t>& chunks,
    const std::vector<float*>& tensors) {
  if (!layout_) return Status::FailedPrecondition("pull before Register()");
  if (tensors.size() != layout_->tensors().size()) {
    return Status::InvalidArgument(
        "pull needs " + std::to_string(layout_->tensors().size()) +
        " buffers, got " + std::to_string(tensors.size()));
  }
  std::vector<std::vector<uint32_t>> by_shard(num_shards());
  std::vector<bool> seen(layout_->chunks().size());
  for (uint32_t id : chunks) {
    if (id >= seen.size() || seen[id]) {
      return Status::InvalidArgument(
          "pull of chunk " + std::to_string(id) +
          (id >= seen.size() ? ", not in the layout" : ", listed twice"));
    }
    seen[id] = true;
    by_shard[layout_->chunks()[id].shard].push_back(id);
  }
  RequestHeader h = NewHeader(RequestKind::kPull);
  h.clock = clock;
  h.pull_dense = true;
  Ticket t = NewTicket(std::make_unique<PullReader>(this, tensors, nullptr));
  for (int s = 0; s < num_shards(); ++s) {
    if (by_shard[s].empty()) continue;
    h.pull_base_seq = shards_[s].pull_seq;
    h.pull_chunks = by_shard[s];
    RETURN_IF_ERROR(Enqueue(t, s, h, std::vector<Frame>(1)));
  }
  return t;
}

// InvalidArgument unless every shard is in [0, num_shards()) and listed
// once; `what` names the request.
Status ClientCore::CheckShardList(const char* what,
                                  const std::vector<int>& shards) {
  std::vector<bool> seen(num_shards());
  for (int s : shards) {
    if (s < 0 || s >= num_shards() || seen[s]) {
      return Status::InvalidArgument(
          std::string(what) + " to shard " + std::to_string(s) +
          (s < 0 || s >= num_shards()
               ? ", not in [0, " + std::to_string(num_shards()) + ")"
               : ", listed twice"));
    }
    seen[s] = true;
  }
  return Status::OK();
}

StatusOr<Ticket> ClientCore::StartHeartbeatShards(
    const std::vector<int>& shards) {
  RETURN_IF_ERROR(CheckShardList("heartbeat", shards));
  return StartOnShards(NewHeader(RequestKind::kHeartbeat), shards);
}

StatusOr<Ticket> ClientCore::StartClockShards(int64_t clock,
                                              const std::vector<int>& shards) {
  RETURN_IF_ERROR(CheckShardList("clock", shards));
  RequestHeader h = NewHeader(RequestKind::kClock);
  h.clock = clock;
  ASSIGN_OR_RETURN(Ticket t, StartOnShards(h, shards));
  for (int s : shards)
    shards_[s].announced_clock = std::max(shards_[s].announced_clock, clock);
  return t;
}

// A push part's gradients as sent: fp32, or encoded with rows_codec.
StatusOr<BufferPtr> ClientCore::EncodeRows(uint32_t table,
                                           const BufferPtr& grads, size_t n) {
  if (options_.rows_codec == 0) return grads;
  compression::CodecSpec spec;
  spec.id = static_cast<compression::CodecId>(options_.rows_codec);
  ASSIGN_OR_RETURN(std::unique_ptr<compression::Codec> codec,
                   compression::CreateCodec(spec));
  std::vector<uint8_t> payload;
  RETURN_IF_ERROR(
      codec->Encode(grads->floats(), n * tables_[table].dim, 0, &payload));
  return Buffer::FromVector(std::move(payload));
}

// Rows refs (and their frames) of a push or pull, in the order of `sent`.
Status ClientCore::AddRows(const std::vector<RowsSent>& sent, bool push,
                           RequestHeader* h, std::vector<Frame>* frames) {
  for (const RowsSent& rs : sent) {
    RowsRef ref;
    ref.table = rs.table;
    ref.num_keys = rs.n;
    ref.codec = options_.rows_codec;
    ref.keys_frame = static_cast<uint32_t>(frames->size());
    frames->push_back(Frame::Ref(rs.keys));
    if (push) {
      ref.rows_frame = static_cast<uint32_t>(frames->size());
      ASSIGN_OR_RETURN(BufferPtr grads, EncodeRows(rs.table, rs.grads, rs.n));
      frames->push_back(Frame::Ref(grads));
    }
    h->rows.push_back(ref);
  }
  return Status::OK();
}

}  // namespace asyncps::worker::client
