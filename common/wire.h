// Plain C++ views of the wire protocol (common/protocol.capnp), and their
// encoding to and from header frames.
//
// Only this module sees Cap'n Proto types: the server and the client work
// with RequestHeader / ReplyHeader. Decoding never throws; a malformed,
// truncated or oversized header, or a wrong protocol version, is a non-OK
// Status and leaves nothing half-built that the caller could use.
//
// Decode functions fill a caller-owned object so the hot path can reuse its
// vectors (no allocation per message once capacities have grown).
//
// Thread safety: all functions are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/assign_op.h"
#include "common/layout.h"
#include "common/sparse_table.h"
#include "common/status.h"

namespace asyncps {

inline constexpr uint16_t kProtocolVersion = 1;

// Request kinds. Travel on the wire: never renumber.
enum class RequestKind : uint8_t {
  kRegister = 0,
  kPush = 1,
  kPull = 2,
  kClock = 3,
  kHeartbeat = 4,
  kStats = 5,
  kCheckpoint = 6,
  kShutdown = 7,
  kAttachShm = 8,
  kReplicate = 9,
  kSnapshot = 10,
  kMigrate = 11,
  kAssign = 12,
};

// kMigrate operations (server/elastic/). Travels on the wire: never renumber.
enum class MigrateOp : uint8_t {
  kDescribe = 0,
  kFreeze = 1,
  kExport = 2,
  kImport = 3,
  kAdopt = 4,
  kAbort = 5,
};

const char* RequestKindName(RequestKind kind);

// A tensor chunk carried in data frame `frame` (>= 1) of the same message.
struct ChunkRef {
  uint32_t chunk = 0;
  uint32_t frame = 0;
  uint8_t codec = 0;  // compression::CodecId; 0 = raw fp32
  uint64_t num_elems = 0;
  uint64_t byte_size = 0;
  uint64_t version = 0;  // pull replies only
};

// Rows of one sparse table carried in data frames (see protocol.capnp).
struct RowsRef {
  uint32_t table = 0;
  uint32_t keys_frame = 0;  // requests: frame of numKeys uint64 keys
  uint32_t rows_frame = 0;  // pushes and pull replies: frame of the rows
  uint64_t num_keys = 0;
  uint8_t codec = 0;  // compression::CodecId of a dense codec; 0 = fp32
};

// A worker's liveness and clock on a primary (kReplicate liveness record).
struct WorkerLiveness {
  int32_t rank = 0;
  bool live = true;
  int64_t clock = 0;
  bool operator==(const WorkerLiveness& o) const {
    return rank == o.rank && live == o.live && clock == o.clock;
  }
};

struct RequestHeader {
  uint16_t version = kProtocolVersion;
  uint64_t id = 0;
  int32_t rank = -1;
  uint64_t incarnation = 0;
  RequestKind kind = RequestKind::kHeartbeat;

  // kRegister
  std::vector<TensorSpec> tensors;
  LayoutOptions layout;
  std::vector<TableSpec> tables;
  // kPush, kPull, kClock
  int64_t clock = 0;
  // kPush, kClock: the learning rate set by the worker (> 0), 0 = not set.
  float lr = 0.0f;
  // kAssign (common/protocol.capnp): upload id, operation (AssignOp),
  // begin's overwrite;
  // values carry their chunks in `chunks` and rows of sparse tables in
  // `rows`; state its chunks in `chunks` and the optimizer it was saved
  // from in `assign_optimizer`.
  uint64_t assign_upload = 0;
  AssignOp assign_phase = AssignOp::kBegin;
  bool assign_overwrite = false;
  std::string assign_optimizer;
  // Phase 6 (scan of a table's rows): the first key and most entries.
  uint64_t assign_cursor = 0;
  uint32_t assign_scan_rows = 0;
  // Phase 6, point-in-time: the scan to page (0 none) or, with
  // assign_open_snapshot, open one (protocol.capnp Assign.openSnapshot).
  uint64_t assign_snapshot = 0;
  bool assign_open_snapshot = false;
  // kPush: one per data frame.
  std::vector<ChunkRef> chunks;
  // kPull: chunk ids wanted (empty = all of the shard's), pull codec spec.
  std::vector<uint32_t> pull_chunks;
  std::string pull_codec;
  // kPull with a sparse codec: sequence number of the last delta reply the
  // client applied (0 = none, send whole weights).
  uint64_t pull_base_seq = 0;
  // kPush, kPull: rows of sparse tables, at most one entry per table.
  std::vector<RowsRef> rows;
  // kPull: false = no dense chunks (rows only).
  bool pull_dense = true;
  // kPull into shared memory: one byte offset per pull_chunks entry (empty =
  // reply with data frames).
  std::vector<uint64_t> pull_shm_offsets;
  uint32_t pull_shm_slot = 0;  // the slot of the segment this pull armed
  // kAttachShm: the client's segment (common/shm_segment.h).
  uint32_t shm_pid = 0;
  int32_t shm_fd = -1;
  uint64_t shm_size = 0;
  uint64_t shm_token = 0;
  // kPush: every push of this client to this shard with a lower id has been
  // answered or abandoned and will not be resent (0 = unknown).
  uint64_t done_below = 0;
  // kReplicate: the primary's layout epoch and replica group; data frame 1
  // is the replicated request's header, frames 2.. its data.
  uint64_t replicate_epoch = 0;
  int32_t replicate_group = 0;
  // kReplicate round record (replication after aggregation, see
  // protocol.capnp): its header count and the primary's BSP round after it.
  bool replicate_aggregate = false;
  uint32_t replicate_requests = 0;
  int64_t replicate_round = 0;
  // kReplicate liveness record (no data frame): workers' states to set.
  std::vector<WorkerLiveness> replicate_workers;
  // kSnapshot (epoch and group above): one piece of a store checkpoint.
  std::string snapshot_file;
  uint64_t snapshot_offset = 0;
  uint64_t snapshot_file_size = 0;
  uint64_t snapshot_total_bytes = 0;
  bool snapshot_last = false;
  // kReplicate, kSnapshot: the sending replica (protocol.capnp
  // ReplicaSender): its name, incarnation and MAC session (16 bytes).
  std::string replica_sender;
  uint64_t replica_incarnation = 0;
  std::string replica_session;
  bool replica_tag_all = false;  // the tag covers the data frames' bytes
  // kPush, kPull: the elastic layout epoch the client routed by (0 = static).
  uint64_t layout_epoch = 0;
  // kMigrate (server/elastic/): see common/protocol.capnp.
  MigrateOp migrate_op = MigrateOp::kDescribe;
  uint64_t migrate_epoch = 0;
  int64_t migrate_at_clock = 0;
  uint32_t migrate_deadline_ms = 0;
  std::vector<uint32_t> migrate_chunks;
  std::string migrate_doc;
  // kExport, kImport of sparse rows: the buckets whose rows move, of a cut
  // of the key hash space into migrate_num_buckets (common/sparse_table.h).
  std::vector<uint32_t> migrate_buckets;
  uint32_t migrate_num_buckets = 0;
};

struct ReplyHeader {
  uint16_t version = kProtocolVersion;
  uint64_t id = 0;
  Status status;
  RequestKind kind = RequestKind::kHeartbeat;
  uint64_t shard_version = 0;
  int64_t min_clock = 0;
  int64_t staleness = -1;
  bool created = false;
  std::vector<ChunkRef> chunks;    // kPull replies
  std::string text;                // kStats replies (JSON)
  uint64_t pull_seq = 0;           // kPull replies with a sparse codec
  std::vector<RowsRef> rows;       // kPull replies: rows of the pull's tables
  uint64_t max_request_bytes = 0;  // the server's limits (0 = not said)
  uint64_t max_frame_bytes = 0;
  // Not the primary of its replica group: the primary's endpoint ("" =
  // unknown). The layout epoch this server serves under (0 = static).
  std::string redirect;
  uint64_t epoch = 0;
  // Refused for a stale elastic layout epoch: the shard's layout document.
  std::string layout_doc;
  // Unavailable: ask again after this many ms (0: the client's backoff).
  uint32_t retry_ms = 0;
  // A page of a point-in-time scan: its id (0: none).
  uint64_t scan_snapshot = 0;
};

// Limits applied while decoding a header.
struct DecodeLimits {
  // Largest header accepted, in bytes. Default: 16 MiB.
  size_t max_header_bytes = size_t{16} << 20;
  // Most list entries (chunk refs, tensors, chunk ids). Default: 1 Mi.
  size_t max_list_entries = size_t{1} << 20;
};

// Serialises a header into a fresh byte vector.
std::vector<uint8_t> EncodeRequest(const RequestHeader& h);
std::vector<uint8_t> EncodeReply(const ReplyHeader& h);

// Parses a header frame. Never throws; never reads outside [data, data+size).
// Returns InvalidArgument for malformed input and FailedPrecondition for a
// protocol version other than kProtocolVersion (with the id still filled in
// `out` where it could be read, so an error reply can echo it).
Status DecodeRequest(const uint8_t* data, size_t size,
                     const DecodeLimits& limits, RequestHeader* out);
Status DecodeReply(const uint8_t* data, size_t size, const DecodeLimits& limits,
                   ReplyHeader* out);

}  // namespace asyncps
