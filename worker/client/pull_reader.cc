// PullReader (worker/client/pull_reader.h).
#include "worker/client/pull_reader.h"

#include <cstring>
#include <string>

#include "compression/codec.h"
#include "worker/client/core.h"

namespace asyncps::worker::client {

Status PullReader::Read(const Reply& reply, TicketResult* result) {
  const Pending& p = *reply.sent;
  const ReplyHeader& h = *reply.header;
  const Message& msg = *reply.msg;
  const Layout& layout = core_->layout();
  // Validate every chunk ref and rows ref before writing anything.
  RETURN_IF_ERROR(CheckRows(reply));
  static const std::vector<uint32_t> kNoChunks;
  // The chunks asked for when it was sent (the layout may have changed
  // since: elastic shards), each answered once.
  const auto& owned = dst_.empty() && rows_ ? kNoChunks : p.ids;
  if (h.chunks.size() != owned.size()) {
    return Status::Corruption(
        "pull reply has " + std::to_string(h.chunks.size()) +
        " chunks, expected " + std::to_string(owned.size()));
  }
  if (p.shm) return ShmPulls::CheckReply(layout, owned, h, result);
  RETURN_IF_ERROR(CheckChunks(reply, owned));
  for (const ChunkRef& c : h.chunks) {
    const ChunkSpec& spec = layout.chunks()[c.chunk];
    float* dst = dst_[spec.tensor] + spec.offset;
    const ByteView& f = msg.frames[c.frame];
    if (c.codec == 0) {
      std::memcpy(dst, f.data, f.size);
    } else {
      const compression::Codec& codec =
          compression::CodecForId(static_cast<compression::CodecId>(c.codec));
      // Sparse payloads are changes since the last pull: add them.
      RETURN_IF_ERROR(
          codec.IsSparse()
              ? codec.DecodeAdd(f.data, f.size, c.num_elems, 1.0f, dst)
              : codec.Decode(f.data, f.size, c.num_elems, dst));
    }
    result->bytes_received += f.size;
  }
  if (h.pull_seq != 0) reply.conn->pull_seq = h.pull_seq;
  return WriteRows(reply, result);
}

Status PullReader::CheckChunks(const Reply& reply,
                               const std::vector<uint32_t>& owned) {
  const ReplyHeader& h = *reply.header;
  const Message& msg = *reply.msg;
  const Layout& layout = core_->layout();
  ClientCore::PullScratch& k = core_->pull_scratch();
  k.chunk_mark.resize(layout.chunks().size(), 0);
  k.mark += 2;
  for (uint32_t id : owned) k.chunk_mark[id] = k.mark;
  for (const ChunkRef& c : h.chunks) {
    if (c.chunk >= layout.chunks().size() || k.chunk_mark[c.chunk] != k.mark ||
        c.num_elems != layout.chunks()[c.chunk].num_elems || c.frame == 0 ||
        c.frame >= msg.frames.size() ||
        c.byte_size != msg.frames[c.frame].size) {
      return Status::Corruption(
          "pull reply has an inconsistent chunk ref for chunk " +
          std::to_string(c.chunk));
    }
    k.chunk_mark[c.chunk] = k.mark + 1;  // a second ref to it fails above
    if (c.codec == 0 && c.byte_size != c.num_elems * sizeof(float)) {
      return Status::Corruption("raw chunk " + std::to_string(c.chunk) +
                                " has the wrong size");
    }
    if (c.codec != 0) {
      // Check every payload before writing anything: a half-applied
      // delta would leave this copy out of step with the shard's.
      if (c.codec >= compression::kNumCodecs) {
        return Status::Corruption("unknown pull codec " +
                                  std::to_string(c.codec));
      }
      const ByteView& f = msg.frames[c.frame];
      Status v =
          compression::CodecForId(static_cast<compression::CodecId>(c.codec))
              .Validate(f.data, f.size, c.num_elems);
      if (!v.ok()) return Status::Corruption(v.message());
    }
  }
  return Status::OK();
}

Status PullReader::WriteRows(const Reply& reply, TicketResult* result) {
  const ReplyHeader& h = *reply.header;
  const Message& msg = *reply.msg;
  const Pending& p = *reply.sent;
  std::vector<float>& scratch = core_->pull_scratch().rows;
  for (size_t i = 0; i < h.rows.size(); ++i) {
    const RowsRef& r = h.rows[i];
    const ByteView& f = msg.frames[r.rows_frame];
    if (r.codec == 0 &&
        reinterpret_cast<uintptr_t>(f.data) % alignof(float) == 0) {
      Scatter(p.rows[i], reinterpret_cast<const float*>(f.data));
    } else {
      // Unaligned fp32 (frames may sit anywhere in a message) or a codec.
      scratch.resize(r.num_keys * core_->tables()[r.table].dim);
      if (r.codec == 0) {
        std::memcpy(scratch.data(), f.data, f.size);
      } else {
        RETURN_IF_ERROR(
            compression::CodecForId(static_cast<compression::CodecId>(r.codec))
                .Decode(f.data, f.size, scratch.size(), scratch.data()));
      }
      Scatter(p.rows[i], scratch.data());
    }
    result->bytes_received += f.size;
  }
  return Status::OK();
}

void PullReader::Scatter(const RowsSent& rs, const float* rows) {
  if (rs.subset.empty()) {
    rows_->Scatter(rs.plan_shard, rs.plan_part, rows);
  } else {
    rows_->ScatterSubset(rs.plan_shard, rs.plan_part, rs.subset, rows);
  }
}

Status PullReader::CheckRows(const Reply& reply) const {
  const ReplyHeader& h = *reply.header;
  const Message& msg = *reply.msg;
  const Pending& p = *reply.sent;
  const size_t want = p.rows.size();
  if (h.rows.size() != want) {
    return Status::Corruption("pull reply has rows of " +
                              std::to_string(h.rows.size()) +
                              " tables, expected " + std::to_string(want));
  }
  for (size_t i = 0; i < want; ++i) {
    const RowsRef& r = h.rows[i];
    const RowsSent& part = p.rows[i];
    if (r.table != part.table || r.num_keys != part.n || r.rows_frame == 0 ||
        r.rows_frame >= msg.frames.size()) {
      return Status::Corruption("pull reply has an inconsistent rows ref");
    }
    const ByteView& f = msg.frames[r.rows_frame];
    const size_t values = part.n * core_->tables()[part.table].dim;
    if (r.codec == 0) {
      if (f.size != values * sizeof(float))
        return Status::Corruption("pulled rows have the wrong size");
    } else if (r.codec >= compression::kNumCodecs) {
      return Status::Corruption("unknown rows codec");
    } else {
      Status v =
          compression::CodecForId(static_cast<compression::CodecId>(r.codec))
              .Validate(f.data, f.size, values);
      if (!v.ok()) return Status::Corruption(v.message());
    }
  }
  return Status::OK();
}

}  // namespace asyncps::worker::client
