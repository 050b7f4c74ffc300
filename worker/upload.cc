// UploadValues (worker/upload.h): the client side of kAssign.
#include "worker/upload.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "common/sparse_table.h"

namespace asyncps::worker {

namespace {

uint64_t RandomUploadId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

// Sends `payload(id)` (AssignOp::kValues or kState) for every chunk
// id of `shard` in requests of at most max_request_bytes.
Status SendShardChunks(Client* client, int shard, uint64_t upload,
                       AssignOp phase, const std::string& optimizer,
                       const std::function<ChunkPayload(uint32_t)>& payload,
                       const UploadOptions& o) {
  AssignRequest req;
  uint64_t bytes = 0;
  auto flush = [&]() -> Status {
    if (req.chunks.empty()) return Status::OK();
    req.upload = upload;
    req.phase = phase;
    req.optimizer = optimizer;
    Status s = client->Assign(shard, std::move(req), nullptr, o.timeout);
    req = AssignRequest{};
    bytes = 0;
    return s.WithContext(std::string(phase == AssignOp::kState
                                         ? "upload of optimizer state"
                                         : "upload") +
                         " to shard " + std::to_string(shard));
  };
  for (uint32_t id : client->layout().shard_chunks(shard)) {
    ChunkPayload p = payload(id);
    const uint64_t n = p.data.size;
    if (bytes > 0 && bytes + n > o.max_request_bytes) RETURN_IF_ERROR(flush());
    req.chunks.push_back(std::move(p));
    bytes += n;
  }
  return flush();
}

// Every chunk's values of `shard`.
Status SendShardValues(Client* client, int shard, uint64_t upload,
                       const std::vector<const float*>& tensors,
                       const UploadOptions& o) {
  const Layout& l = client->layout();
  return SendShardChunks(
      client, shard, upload, AssignOp::kValues, "",
      [&](uint32_t id) {
        const ChunkSpec& c = l.chunks()[id];
        ChunkPayload p;
        p.chunk = id;
        p.data = Frame::Copy(tensors[c.tensor] + c.offset,
                             c.num_elems * sizeof(float));
        return p;
      },
      o);
}

// Every chunk's optimizer state of `shard`: [slot 0 | slot 1 ...] and its
// steps.
Status SendShardState(Client* client, int shard, uint64_t upload,
                      const StateValues& state, const UploadOptions& o) {
  const Layout& l = client->layout();
  return SendShardChunks(
      client, shard, upload, AssignOp::kState, state.optimizer,
      [&](uint32_t id) {
        const ChunkSpec& c = l.chunks()[id];
        const size_t bytes = c.num_elems * sizeof(float);
        std::vector<uint8_t> data(state.slots.size() * bytes);
        for (size_t j = 0; j < state.slots.size(); ++j) {
          std::memcpy(data.data() + j * bytes,
                      state.slots[j][c.tensor] + c.offset, bytes);
        }
        ChunkPayload p;
        p.chunk = id;
        p.data = Frame::Owned(std::move(data));
        p.version = state.chunk_steps[id];
        return p;
      },
      o);
}

// Appends row i of `r` to `out`: its values, or with state its row record
// (u64 steps, f32 values[dim], f32 state[dim x k]: common/protocol.capnp),
// or with kinds its saved record (common/sparse_table.h).
void AppendRow(const RowsValues& r, size_t i, size_t dim, size_t state_floats,
               std::vector<uint8_t>* out) {
  auto append = [out](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    out->insert(out->end(), b, b + bytes);
  };
  if (r.kinds != nullptr) {
    const uint32_t head[2] = {r.kinds[i], 0};
    append(head, sizeof(head));
  }
  if (r.state != nullptr) append(&r.steps[i], sizeof(uint64_t));
  if (r.kinds != nullptr) append(&r.clocks[i], sizeof(int64_t));
  append(r.values + i * dim, dim * sizeof(float));
  if (r.state != nullptr)
    append(r.state + i * state_floats, state_floats * sizeof(float));
}

// Sends the rows `shard` owns, at most kUploadMaxKeys keys and about
// max_request_bytes of values (and state) per request: phase 1, or phase 5
// with their optimizer state.
Status SendShardRows(Client* client, int shard, uint64_t upload,
                     const std::vector<RowsValues>& rows,
                     const UploadOptions& o) {
  for (const RowsValues& r : rows) {
    const TableSpec& spec = client->tables()[r.table];
    const size_t dim = spec.dim;
    const size_t state_floats =
        r.state != nullptr ? dim * spec.optimizer.state_per_elem() : 0;
    const size_t row_bytes = r.kinds != nullptr   ? SavedRecordBytes(spec)
                             : r.state != nullptr ? RowRecordBytes(spec)
                                                  : dim * sizeof(float);
    const size_t per_request = std::max<size_t>(
        1, std::min<uint64_t>(kUploadMaxKeys, o.max_request_bytes / row_bytes));
    std::vector<uint64_t> keys;
    std::vector<uint8_t> bytes;
    auto flush = [&]() -> Status {
      if (keys.empty()) return Status::OK();
      AssignRequest req;
      req.upload = upload;
      req.phase = r.kinds != nullptr   ? AssignOp::kSaved
                  : r.state != nullptr ? AssignOp::kRows
                                       : AssignOp::kValues;
      req.optimizer = r.optimizer;
      if (r.state != nullptr) {
        req.rows.push_back(
            RowsPush{r.table, keys.data(), keys.size(), nullptr});
        req.row_records.push_back(Frame::Owned(std::move(bytes)));
      } else {
        req.rows.push_back(
            RowsPush{r.table, keys.data(), keys.size(),
                     reinterpret_cast<const float*>(bytes.data())});
      }
      Status s = client->Assign(shard, std::move(req), nullptr, o.timeout);
      keys.clear();
      bytes.clear();
      return s.WithContext("upload of rows of '" + spec.name + "' to shard " +
                           std::to_string(shard));
    };
    for (size_t i = 0; i < r.n; ++i) {
      if (client->ShardOfRow(r.table, r.keys[i]) != shard) continue;
      keys.push_back(r.keys[i]);
      AppendRow(r, i, dim, state_floats, &bytes);
      if (keys.size() == per_request) RETURN_IF_ERROR(flush());
    }
    RETURN_IF_ERROR(flush());
  }
  return Status::OK();
}

// Drops every entry of the tables of `rows` marked `clear` on `shard`
// (AssignOp::kClear, one request).
Status ClearShardTables(Client* client, int shard, uint64_t upload,
                        const std::vector<RowsValues>& rows,
                        const UploadOptions& o) {
  AssignRequest req;
  req.upload = upload;
  req.phase = AssignOp::kClear;
  for (const RowsValues& r : rows) {
    if (r.clear) req.rows.push_back(RowsPush{r.table, nullptr, 0, nullptr});
  }
  if (req.rows.empty()) return Status::OK();
  return client->Assign(shard, std::move(req), nullptr, o.timeout)
      .WithContext("clearing sparse tables on shard " + std::to_string(shard));
}

Status Phase(Client* client, int shard, uint64_t upload, AssignOp phase,
             bool overwrite, const UploadOptions& o, bool* claimed) {
  AssignRequest req;
  req.upload = upload;
  req.phase = phase;
  req.overwrite = overwrite;
  return client->Assign(shard, std::move(req), claimed, o.timeout)
      .WithContext(std::string(phase == AssignOp::kBegin ? "upload begin"
                                                         : "upload commit") +
                   " on shard " + std::to_string(shard));
}

}  // namespace

Status UploadValues(Client* client, const std::vector<const float*>& tensors,
                    const UploadOptions& o, bool* uploaded,
                    const std::vector<RowsValues>& rows,
                    const StateValues* state) {
  *uploaded = false;
  const Layout& l = client->layout();
  if (tensors.size() != l.tensors().size()) {
    return Status::InvalidArgument(
        "upload needs " + std::to_string(l.tensors().size()) +
        " buffers, got " + std::to_string(tensors.size()));
  }
  if (state != nullptr) {
    for (const auto& slot : state->slots) {
      if (slot.size() != l.tensors().size()) {
        return Status::InvalidArgument("upload of optimizer state needs " +
                                       std::to_string(l.tensors().size()) +
                                       " buffers per slot, got " +
                                       std::to_string(slot.size()));
      }
    }
    if (state->chunk_steps.size() != l.chunks().size()) {
      return Status::InvalidArgument(
          "upload of optimizer state needs the steps of " +
          std::to_string(l.chunks().size()) + " chunks, got " +
          std::to_string(state->chunk_steps.size()));
    }
  }
  if (o.max_request_bytes < 1) {
    return Status::InvalidArgument("max_request_bytes must be >= 1");
  }
  std::vector<bool> table_seen(client->tables().size(), false);
  for (const RowsValues& r : rows) {
    if (r.table >= client->tables().size() || table_seen[r.table]) {
      return Status::InvalidArgument(
          "upload of rows: table " + std::to_string(r.table) +
          " unknown or named twice (" +
          std::to_string(client->tables().size()) + " registered)");
    }
    table_seen[r.table] = true;
    if ((r.state == nullptr) != (r.steps == nullptr) ||
        (r.kinds == nullptr) != (r.clocks == nullptr) ||
        (r.kinds != nullptr && r.state == nullptr)) {
      return Status::InvalidArgument(
          "upload of rows of '" + client->tables()[r.table].name +
          "': optimizer state and steps go together, kinds and clocks with "
          "them");
    }
    // Checked here before anything is sent (the shards check each request
    // again): a refusal half way would leave the upload half written.
    if (r.state != nullptr) {
      RETURN_IF_ERROR(CheckRowState(client->tables()[r.table], r.optimizer,
                                    r.keys, r.state, r.steps, r.n)
                          .WithContext("upload of rows"));
    }
    if (r.kinds != nullptr) {
      RETURN_IF_ERROR(CheckSavedMeta(client->tables()[r.table], r.keys, r.kinds,
                                     r.steps, r.clocks, r.n)
                          .WithContext("upload of rows"));
    }
  }
  const uint64_t upload = RandomUploadId();
  bool claimed = false;
  // Shard 0 is the lock: a caller that does not get it waits in this call
  // until the winner has committed every shard.
  RETURN_IF_ERROR(
      Phase(client, 0, upload, AssignOp::kBegin, o.overwrite, o, &claimed));
  if (!claimed) return Status::OK();
  std::vector<int> mine;
  for (int s = 1; s < client->num_shards(); ++s) {
    bool got = false;
    RETURN_IF_ERROR(
        Phase(client, s, upload, AssignOp::kBegin, o.overwrite, o, &got));
    if (got) mine.push_back(s);  // else final there: kept
  }
  // State first: a shard that refuses it (another optimizer) does so
  // before any shard's values are written.
  if (state != nullptr) {
    for (int s : mine)
      RETURN_IF_ERROR(SendShardState(client, s, upload, *state, o));
    RETURN_IF_ERROR(SendShardState(client, 0, upload, *state, o));
  }
  for (int s : mine) {
    RETURN_IF_ERROR(SendShardValues(client, s, upload, tensors, o));
    RETURN_IF_ERROR(ClearShardTables(client, s, upload, rows, o));
    RETURN_IF_ERROR(SendShardRows(client, s, upload, rows, o));
  }
  RETURN_IF_ERROR(SendShardValues(client, 0, upload, tensors, o));
  RETURN_IF_ERROR(ClearShardTables(client, 0, upload, rows, o));
  RETURN_IF_ERROR(SendShardRows(client, 0, upload, rows, o));
  for (int s : mine) {
    RETURN_IF_ERROR(
        Phase(client, s, upload, AssignOp::kCommit, false, o, nullptr));
  }
  RETURN_IF_ERROR(
      Phase(client, 0, upload, AssignOp::kCommit, false, o, nullptr));
  *uploaded = true;
  return Status::OK();
}

namespace {

// ScanTable's one pass over every shard (pages routed by the client's
// layout epoch as it stands), each a point-in-time scan. The shards get a
// page each in turn: the first pages open every shard's scan (their
// snapshots are taken one page apart), and no open scan idles while
// another shard's pages are read. *gone: a shard no longer held the scan
// a page named (FailedPrecondition; start again).
Status ScanTableOnce(Client* client, uint32_t table, size_t page_rows,
                     SavedRows* out, std::chrono::milliseconds timeout,
                     bool* gone) {
  *gone = false;
  const size_t bytes = SavedRecordBytes(client->tables()[table]);
  const int num_shards = client->num_shards();
  std::vector<SavedRows> shards(num_shards);
  std::vector<uint64_t> snapshot(num_shards, 0), from(num_shards, 0);
  std::vector<uint8_t> done(num_shards, 0);
  for (int left = num_shards; left > 0;) {
    for (int s = 0; s < num_shards; ++s) {
      if (done[s]) continue;
      SavedRows& got = shards[s];
      const size_t before = got.keys.size();
      Status st = client->ScanRows(s, table, from[s], page_rows, &got.keys,
                                   &got.records, timeout, &snapshot[s]);
      if (!st.ok()) {
        *gone =
            snapshot[s] != 0 && st.code() == StatusCode::kFailedPrecondition;
        return st;
      }
      const size_t n = got.keys.size() - before;
      if (n < page_rows || got.keys.back() == UINT64_MAX) {
        done[s] = 1;
        --left;
      } else {
        from[s] = got.keys.back() + 1;
      }
    }
  }
  // Every key is held by one shard: merge the shards' ordered lists.
  std::vector<std::pair<uint64_t, std::pair<int, size_t>>> order;
  for (int s = 0; s < num_shards; ++s) {
    for (size_t i = 0; i < shards[s].keys.size(); ++i)
      order.push_back({shards[s].keys[i], {s, i}});
  }
  std::sort(order.begin(), order.end());
  out->keys.clear();
  out->records.clear();
  out->keys.reserve(order.size());
  out->records.reserve(order.size() * bytes);
  for (size_t j = 0; j < order.size(); ++j) {
    if (j > 0 && order[j].first == order[j - 1].first) {
      return Status::Corruption("scan of rows: key " +
                                std::to_string(order[j].first) +
                                " held by two shards");
    }
    const auto [s, i] = order[j].second;
    out->keys.push_back(order[j].first);
    const uint8_t* rec = shards[s].records.data() + i * bytes;
    out->records.insert(out->records.end(), rec, rec + bytes);
  }
  return Status::OK();
}

}  // namespace

Status ScanTable(Client* client, uint32_t table, size_t page_rows,
                 SavedRows* out, std::chrono::milliseconds timeout) {
  if (table >= client->tables().size())
    return Status::NotFound("scan of unknown table " + std::to_string(table));
  // Every page of one pass carries one layout epoch (the shards refuse
  // another), so a pass sees each key once. A pass that met a newer epoch
  // (key ranges moved: the shard refused, the client adopted its layout),
  // or a shard that dropped its point-in-time scan (it restarted, failed
  // over, or the scan idled), starts over.
  Status s;
  for (int pass = 0; pass < kScanPasses; ++pass) {
    const uint64_t epoch = client->layout_epoch();
    bool gone = false;
    s = ScanTableOnce(client, table, page_rows, out, timeout, &gone);
    if (client->layout_epoch() == epoch && !gone) return s;
  }
  return Status::Unavailable(
      "scan of the rows of '" + client->tables()[table].name + "': the " +
      "layout changed, or a shard dropped the scan, during each of " +
      std::to_string(kScanPasses) + " passes; retry. Last: " + s.ToString());
}

}  // namespace asyncps::worker
