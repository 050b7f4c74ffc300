// Uploads (worker/client/uploads.h): kAssign requests and the readers of
// their replies.
#include "worker/client/uploads.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "worker/client/core.h"

namespace asyncps::worker::client {

using std::chrono::milliseconds;

namespace {

// A shard's optimizer state (ReadOptimizerState): every chunk ref checked
// against the layout before anything is written into *out.
class StateReader : public ReplyReader {
 public:
  StateReader(const ClientCore* core, OptimizerState* out)
      : core_(core), out_(out) {}

  Status Read(const Reply& r, TicketResult*) override {
    const Layout& layout = core_->layout();
    const ReplyHeader& reply = *r.header;
    const Message& msg = *r.msg;
    const auto& owned = layout.shard_chunks(r.shard);
    if (reply.chunks.size() != owned.size()) {
      return Status::Corruption(
          "optimizer state of " + std::to_string(reply.chunks.size()) +
          " chunks, expected " + std::to_string(owned.size()));
    }
    int k = out_->per_weight;
    for (size_t i = 0; i < owned.size(); ++i) {
      const ChunkRef& c = reply.chunks[i];
      const uint64_t n = layout.chunks()[owned[i]].num_elems;
      if (c.chunk != owned[i] || c.frame < 1 || c.frame >= msg.frames.size() ||
          n == 0 || c.num_elems % n != 0 || c.num_elems / n > 64 ||
          (k >= 0 && c.num_elems / n != static_cast<uint64_t>(k)) ||
          c.byte_size != c.num_elems * sizeof(float) ||
          c.byte_size != msg.frames[c.frame].size) {
        return Status::Corruption("bad optimizer state ref for chunk " +
                                  std::to_string(c.chunk));
      }
      k = static_cast<int>(c.num_elems / n);
    }
    if (k < 0) return Status::OK();  // a shard without chunks
    OptimizerState& st = *out_;
    if (st.per_weight < 0) {
      st.per_weight = k;
      st.slots.assign(k, {});
      for (auto& slot : st.slots) {
        for (const TensorSpec& t : layout.tensors())
          slot.emplace_back(t.num_elements(), 0.0f);
      }
    }
    for (const ChunkRef& c : reply.chunks) {
      const ChunkSpec& spec = layout.chunks()[c.chunk];
      const uint8_t* src = msg.frames[c.frame].data;
      for (int j = 0; j < k; ++j) {
        std::memcpy(st.slots[j][spec.tensor].data() + spec.offset,
                    src + j * spec.num_elems * sizeof(float),
                    spec.num_elems * sizeof(float));
      }
      st.steps = std::max(st.steps, c.version);
      st.chunk_steps.resize(layout.chunks().size(), 0);
      st.chunk_steps[c.chunk] = c.version;
    }
    return Status::OK();
  }

 private:
  const ClientCore* core_;
  OptimizerState* out_;
};

// Row records (ReadRowRecords): the reply's one rows ref checked against
// the request before anything is written: record j to out + at[j] * bytes.
class RecordsReader : public ReplyReader {
 public:
  RecordsReader(uint32_t table, const size_t* at, size_t n, size_t bytes,
                uint8_t* out)
      : table_(table), at_(at), n_(n), bytes_(bytes), out_(out) {}

  Status Read(const Reply& reply, TicketResult*) override {
    const ReplyHeader& h = *reply.header;
    const Message& msg = *reply.msg;
    const RowsRef* r = h.rows.size() == 1 ? &h.rows[0] : nullptr;
    if (r == nullptr || !h.chunks.empty() || r->table != table_ ||
        r->num_keys != n_ || r->codec != 0 || r->rows_frame < 1 ||
        r->rows_frame >= msg.frames.size() ||
        msg.frames[r->rows_frame].size != n_ * bytes_) {
      return Status::Corruption("bad reply to a read of row records");
    }
    const uint8_t* src = msg.frames[r->rows_frame].data;
    for (size_t j = 0; j < n_; ++j)
      std::memcpy(out_ + at_[j] * bytes_, src + j * bytes_, bytes_);
    return Status::OK();
  }

 private:
  uint32_t table_;
  const size_t* at_;
  size_t n_;
  size_t bytes_;
  uint8_t* out_;
};

// A page of a scan (ScanRows): the reply's one rows ref checked (sizes,
// keys increasing from the cursor) before anything is appended.
class ScanReader : public ReplyReader {
 public:
  // point_in_time: the id asked for in *snapshot (0: open one); the id the
  // reply named is written there.
  ScanReader(uint32_t table, uint64_t from, size_t max, size_t bytes,
             std::vector<uint64_t>* keys, std::vector<uint8_t>* records,
             bool point_in_time, uint64_t* snapshot)
      : table_(table),
        from_(from),
        max_(max),
        bytes_(bytes),
        keys_(keys),
        records_(records),
        point_in_time_(point_in_time),
        snapshot_(snapshot) {}

  Status Read(const Reply& reply, TicketResult*) override {
    const ReplyHeader& h = *reply.header;
    const Message& msg = *reply.msg;
    const RowsRef* r = h.rows.size() == 1 ? &h.rows[0] : nullptr;
    const size_t frames = msg.frames.size();
    if (r == nullptr || !h.chunks.empty() || r->table != table_ ||
        r->num_keys > max_ || r->codec != 0 || r->keys_frame < 1 ||
        r->keys_frame >= frames || r->rows_frame < 1 ||
        r->rows_frame >= frames || r->keys_frame == r->rows_frame ||
        msg.frames[r->keys_frame].size != r->num_keys * sizeof(uint64_t) ||
        msg.frames[r->rows_frame].size != r->num_keys * bytes_) {
      return Status::Corruption("bad reply to a scan of rows");
    }
    // A page of a point-in-time scan names it: the one asked for, or a
    // new one when this page opened it.
    const uint64_t asked = *snapshot_;
    if (point_in_time_
            ? h.scan_snapshot == 0 || (asked != 0 && h.scan_snapshot != asked)
            : h.scan_snapshot != 0) {
      return Status::Corruption(
          "a page of point-in-time scan " + std::to_string(asked) +
          " (0: to open) named scan " + std::to_string(h.scan_snapshot));
    }
    const uint8_t* src = msg.frames[r->keys_frame].data;
    const size_t at = keys_->size();
    keys_->resize(at + r->num_keys);
    std::memcpy(keys_->data() + at, src, r->num_keys * sizeof(uint64_t));
    for (size_t j = at; j < keys_->size(); ++j) {
      if ((*keys_)[j] < (j == at ? from_ : (*keys_)[j - 1] + 1)) {
        keys_->resize(at);
        return Status::Corruption("a scan of rows answered keys out of order");
      }
    }
    const uint8_t* rec = msg.frames[r->rows_frame].data;
    records_->insert(records_->end(), rec, rec + r->num_keys * bytes_);
    *snapshot_ = h.scan_snapshot;
    return Status::OK();
  }

 private:
  uint32_t table_;
  uint64_t from_;
  size_t max_;
  size_t bytes_;
  std::vector<uint64_t>* keys_;
  std::vector<uint8_t>* records_;
  bool point_in_time_;
  uint64_t* snapshot_;
};

Status NoTable(uint32_t table, size_t registered) {
  return Status::NotFound("no sparse table " + std::to_string(table) + " (" +
                          std::to_string(registered) + " registered)");
}

}  // namespace

Status Uploads::Assign(int shard, AssignRequest a, bool* claimed,
                       milliseconds timeout) {
  if (!core_->has_layout())
    return Status::FailedPrecondition("assign before Register()");
  if (shard < 0 || shard >= core_->num_shards())
    return Status::InvalidArgument("assign to unknown shard " +
                                   std::to_string(shard));
  const Layout& layout = core_->layout();
  const std::vector<TableSpec>& tables = core_->tables();
  RequestHeader h = core_->NewHeader(RequestKind::kAssign);
  h.assign_upload = a.upload;
  h.assign_phase = a.phase;
  h.assign_overwrite = a.overwrite;
  h.assign_optimizer = a.optimizer;
  std::vector<Frame> frames(1);
  for (ChunkPayload& p : a.chunks) {
    if (p.chunk >= layout.chunks().size() ||
        layout.chunks()[p.chunk].shard != shard) {
      return Status::InvalidArgument(
          "assign of chunk " + std::to_string(p.chunk) +
          ", not held by shard " + std::to_string(shard));
    }
    ChunkRef ref;
    ref.chunk = p.chunk;
    ref.frame = static_cast<uint32_t>(frames.size());
    ref.num_elems = a.phase == AssignOp::kState
                        ? p.data.size / sizeof(float)  // state
                        : layout.chunks()[p.chunk].num_elems;
    ref.byte_size = p.data.size;
    ref.version = p.version;
    h.chunks.push_back(ref);
    frames.push_back(std::move(p.data));
  }
  if (a.phase == AssignOp::kClear) {
    // Clear tables: refs naming them, no keys or frames.
    for (const RowsPush& rows : a.rows) {
      if (rows.table >= tables.size() || rows.n != 0) {
        return Status::InvalidArgument("clear of table " +
                                       std::to_string(rows.table) +
                                       ": unknown, or with keys");
      }
      RowsRef ref;
      ref.table = rows.table;
      h.rows.push_back(ref);
    }
    a.rows.clear();
  }
  const bool records = a.phase == AssignOp::kRows ||
                       a.phase == AssignOp::kSaved;  // rows with state
  if (records && a.row_records.size() != a.rows.size()) {
    return Status::InvalidArgument(
        "assign of rows with state: " + std::to_string(a.rows.size()) +
        " tables, " + std::to_string(a.row_records.size()) +
        " frames of records");
  }
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const RowsPush& rows = a.rows[i];
    if (rows.table >= tables.size()) {
      return Status::InvalidArgument("assign of rows of unknown table " +
                                     std::to_string(rows.table));
    }
    RowsRef ref;
    ref.table = rows.table;
    ref.num_keys = rows.n;
    ref.keys_frame = static_cast<uint32_t>(frames.size());
    frames.push_back(Frame::Copy(rows.keys, rows.n * sizeof(uint64_t)));
    ref.rows_frame = static_cast<uint32_t>(frames.size());
    frames.push_back(
        records ? std::move(a.row_records[i])
                : Frame::Copy(rows.grads,
                              rows.n * tables[rows.table].dim * sizeof(float)));
    h.rows.push_back(ref);
  }
  Ticket t = core_->NewTicket();
  RETURN_IF_ERROR(core_->Enqueue(t, shard, h, std::move(frames)));
  TicketResult r;
  RETURN_IF_ERROR(core_->Wait(t, timeout, &r));
  if (claimed != nullptr) *claimed = r.created;
  return Status::OK();
}

Status Uploads::ReadOptimizerState(OptimizerState* out, milliseconds timeout) {
  if (!core_->has_layout())
    return Status::FailedPrecondition("read before Register()");
  *out = OptimizerState{};
  out->per_weight = -1;  // set by the first reply
  RequestHeader h = core_->NewHeader(RequestKind::kAssign);
  h.assign_upload = 1;
  h.assign_phase = AssignOp::kRead;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(Ticket t, core_->StartOnShards(
                                   h, core_->AllShards(),
                                   std::make_unique<StateReader>(core_, out)));
    return core_->Wait(t, timeout, nullptr);
  }();
  if (out->per_weight < 0) out->per_weight = 0;
  return s;
}

Status Uploads::ReadRowRecords(uint32_t table, const uint64_t* keys, size_t n,
                               uint8_t* out, milliseconds timeout) {
  if (!core_->has_layout())
    return Status::FailedPrecondition("read before Register()");
  const std::vector<TableSpec>& tables = core_->tables();
  if (table >= tables.size()) return NoTable(table, tables.size());
  const TableSpec& spec = tables[table];
  const size_t bytes = RowRecordBytes(spec);
  const size_t per_request = std::max<size_t>(
      1, std::min(Client::kMaxReadKeys, (size_t{64} << 20) / bytes));
  const int num_shards = core_->num_shards();
  std::vector<std::vector<size_t>> at(num_shards);
  for (size_t i = 0; i < n; ++i)
    at[core_->ShardOfRow(table, keys[i])].push_back(i);
  std::vector<uint64_t> asked;
  for (int shard = 0; shard < num_shards; ++shard) {
    for (size_t off = 0; off < at[shard].size(); off += per_request) {
      const size_t m = std::min(per_request, at[shard].size() - off);
      asked.resize(m);
      for (size_t j = 0; j < m; ++j) asked[j] = keys[at[shard][off + j]];
      RequestHeader h = core_->NewHeader(RequestKind::kAssign);
      h.assign_upload = 1;
      h.assign_phase = AssignOp::kRead;
      RowsRef ref;
      ref.table = table;
      ref.keys_frame = 1;
      ref.num_keys = m;
      h.rows.push_back(ref);
      std::vector<Frame> frames(1);
      frames.push_back(Frame::Copy(asked.data(), m * sizeof(uint64_t)));
      Status s = [&]() -> Status {
        Ticket t = core_->NewTicket(std::make_unique<RecordsReader>(
            table, at[shard].data() + off, m, bytes, out));
        RETURN_IF_ERROR(core_->Enqueue(t, shard, h, std::move(frames)));
        return core_->Wait(t, timeout, nullptr);
      }();
      RETURN_IF_ERROR(s.WithContext("reading rows of '" + spec.name +
                                    "' from shard " + std::to_string(shard)));
    }
  }
  return Status::OK();
}

Status Uploads::ScanRows(int shard, uint32_t table, uint64_t from,
                         size_t max_rows, std::vector<uint64_t>* keys,
                         std::vector<uint8_t>* records, milliseconds timeout,
                         uint64_t* snapshot) {
  if (!core_->has_layout())
    return Status::FailedPrecondition("scan before Register()");
  const std::vector<TableSpec>& tables = core_->tables();
  if (table >= tables.size()) return NoTable(table, tables.size());
  if (shard < 0 || shard >= core_->num_shards() || max_rows == 0 ||
      max_rows > UINT32_MAX) {
    return Status::InvalidArgument("scan of shard " + std::to_string(shard) +
                                   " in pages of " + std::to_string(max_rows) +
                                   " rows");
  }
  RequestHeader h = core_->NewHeader(RequestKind::kAssign);
  h.assign_upload = 1;
  h.assign_phase = AssignOp::kScan;
  h.assign_cursor = from;
  h.assign_scan_rows = static_cast<uint32_t>(max_rows);
  if (snapshot != nullptr) {
    h.assign_snapshot = *snapshot;
    h.assign_open_snapshot = *snapshot == 0;
  }
  RowsRef ref;
  ref.table = table;
  h.rows.push_back(ref);
  // The id the reply named, written to *snapshot only on success.
  uint64_t named = snapshot != nullptr ? *snapshot : 0;
  Status s = [&]() -> Status {
    Ticket t = core_->NewTicket(std::make_unique<ScanReader>(
        table, from, max_rows, SavedRecordBytes(tables[table]), keys, records,
        snapshot != nullptr, &named));
    RETURN_IF_ERROR(core_->Enqueue(t, shard, h, std::vector<Frame>(1)));
    return core_->Wait(t, timeout, nullptr);
  }();
  if (s.ok() && snapshot != nullptr) *snapshot = named;
  return s.WithContext("scan of the rows of '" + tables[table].name +
                       "' on shard " + std::to_string(shard));
}

}  // namespace asyncps::worker::client
