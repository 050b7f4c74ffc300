# asyncps wire protocol, version 1.
#
# Every ZeroMQ message is one header frame holding a Request or a Reply
# (Cap'n Proto, unpacked, single segment preferred), followed by zero or more
# data frames. Tensor bytes never sit inside the header: a ChunkRef names the
# data frame (1-based: frame 0 is the header) that carries them, the codec
# that encoded them, the chunk's element count and the frame's exact size.
# The receiver validates every ChunkRef (frame index in range, size equal to
# the frame, chunk owned by the receiving shard, element count equal to the
# layout's) before touching memory. Every request gets exactly one reply,
# with the request's id; a failed request gets a reply whose status is not
# OK and whose body is `none`.
@0xc4a0f3b1d2e5a697;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("asyncps::capnpwire");

const protocolVersion :UInt16 = 1;

struct TensorSpec {
  name @0 :Text;
  shape @1 :List(Int64);
  init @2 :UInt8;        # asyncps::InitKind
  initParam @3 :Float32;
  seed @4 :UInt64;
}

struct ChunkRef {
  chunk @0 :UInt32;      # global chunk id from the layout
  frame @1 :UInt32;      # data frame index, >= 1
  codec @2 :UInt8;       # asyncps::compression::CodecId (0 = raw fp32)
  numElems @3 :UInt64;   # elements in the chunk
  byteSize @4 :UInt64;   # exact size of the data frame in bytes
  version @5 :UInt64;    # pull replies: updates applied to this chunk
}

# A sparse table (common/sparse_table.h): rows of `dim` floats by uint64 key.
struct TableSpec {
  name @0 :Text;
  dim @1 :UInt32;
  init @2 :UInt8;              # asyncps::InitKind (zeros, constant, uniform,
  initParam @3 :Float32;       # normal)
  seed @4 :UInt64;
  optimizer @5 :UInt8;         # asyncps::RowOptimizerKind
  lr @6 :Float32;
  beta1 @7 :Float32;
  beta2 @8 :Float32;
  eps @9 :Float32;
  initialAccumulator @10 :Float32;
  admitAfterPushes @11 :UInt32;
  expireAfterClocks @12 :Int64;
}

# Rows of one table in a push, a pull or a pull reply. Keys travel in data
# frame keysFrame as numKeys little-endian UInt64 (each at most once per
# request, each owned by the receiving shard); rows in data frame rowsFrame
# as numKeys x dim values encoded with `codec` (compression::CodecId of a
# dense codec: 0 = raw fp32, 1 = fp16, 2 = bf16; a codec payload carries its
# own header). A pull names keysFrame and the codec wanted for the reply
# (rowsFrame 0); its reply names rowsFrame, in the order of the pull's keys
# (keysFrame 0).
struct RowsRef {
  table @0 :UInt32;            # index in the registered table list
  keysFrame @1 :UInt32;
  rowsFrame @2 :UInt32;
  numKeys @3 :UInt64;
  codec @4 :UInt8;
}

struct Register {
  tensors @0 :List(TensorSpec);
  chunkElems @1 :UInt64;
  minChunkElems @2 :UInt64;
  numShards @3 :UInt32;
  tables @4 :List(TableSpec);  # sparse tables of the model (may be empty)
  placement @5 :UInt8;         # which shard holds each chunk (common/layout.h
                               # Placement): 0 = balanced (LPT), 1 = in order
}

struct Push {
  clock @0 :Int64;           # the pushing worker's clock (iterations done)
  chunks @1 :List(ChunkRef);
  rows @2 :List(RowsRef);    # row gradients, at most one entry per table
  lr @3 :Float32;            # > 0: the learning rate the worker sets (e.g. a
                             # torch.optim.lr_scheduler's), used by this and
                             # later updates in place of the server's --lr and
                             # schedule; at most the server's --max_lr, else
                             # refused. 0 = not set (the server's schedule).
}

struct Pull {
  clock @0 :Int64;           # the pulling worker's clock
  chunks @1 :List(UInt32);   # empty: every chunk of the shard
  codec @2 :Text;            # pull compression spec, "" = raw fp32
  baseSeq @3 :UInt64;        # sparse (delta) codecs: the pullSeq of the last
                             # reply this client applied; 0 = none
  rows @4 :List(RowsRef);    # rows wanted, at most one entry per table
  dense @5 :Bool = true;     # false: no dense chunks (a rows-only pull)
  shmOffsets @6 :List(UInt64);  # one per chunk id (chunks then may not be
                             # empty): the shard writes each chunk's fp32
                             # weights into the client's attached shared
                             # memory at that byte offset (common/shm_segment.h)
                             # and answers with chunk refs of frame 0; raw
                             # pulls only (codec "", no rows)
  shmSlot @7 :UInt32;        # the segment's slot this pull armed
}

# A client's shared-memory segment (common/shm_segment.h), for pulls from a
# shard on its host. One per (rank, incarnation); a new one replaces it.
struct AttachShm {
  pid @0 :UInt32;            # the creating process
  fd @1 :Int32;              # its memfd, opened as /proc/<pid>/fd/<fd>
  size @2 :UInt64;           # exact size of the file
  token @3 :UInt64;          # the random token in the segment's header
}

struct Clock {
  clock @0 :Int64;           # the worker's new clock
  lr @1 :Float32;            # as Push.lr (BSP: the lr of the round applied
                             # when this clock completes it)
}

# Upload of values (server/shard/shard_assign.cc): fine-tuning from a
# worker's weights, ps.load_state_dict(). Per shard: a `begin` claims the
# shard's upload for (rank, incarnation, upload); the reply's `created` is
# true when the sender holds the claim (it sends its values), false when the
# shard's values are final (an upload was committed, or updates applied:
# the sender pulls them); Unavailable while another live claimant uploads
# (the client retries: it waits). `values` requests of the claimant carry
# raw fp32 weights of whole chunks owned by the shard (codec 0); `commit`
# makes them final (optimizer state of every chunk reset, except the
# chunks whose state this upload set: `state` requests of the claimant carry
# the optimizer state of whole chunks, in the layout of phase 3's reply, and
# a commit is refused unless every chunk of the shard or none got it). A
# claim whose worker stops talking (worker timeout) or restarts may be taken
# over.
struct Assign {
  upload @0 :UInt64;         # random, != 0: one per upload
  phase @1 :UInt8;           # 0 begin, 1 values, 2 commit, 3 read the
                             # optimizer state: the reply's chunks, one per
                             # chunk of the shard (numElems = k x the chunk's
                             # elements for k floats of state per weight,
                             # stored [slot 0 | slot 1 ...]; version = the
                             # chunk's optimizer steps); no claim needed.
                             # 4 state (the claimant, before its commit):
                             # chunks as in phase 3's reply (raw fp32, codec
                             # 0, whole chunks owned by the shard, each once;
                             # k = the shard optimizer's floats per weight;
                             # finite; Adam's and AdaGrad's sums >= 0;
                             # version = the chunk's optimizer steps, at most
                             # 2^53), all checked before any is written.
                             # 3 with rows (keys frames only, no chunks):
                             # the reply's rows, one per table asked, each
                             # a rowsFrame of numKeys row records: u64
                             # optimizer steps, f32 weights[dim], f32
                             # state[dim x k] (k: the table's row optimizer's
                             # floats per weight: sgd 0, adagrad 1 (sum),
                             # adam 2 ([m | v]); a key without a row: its
                             # initial value and state, 0 steps).
                             # 5 rows with state (the claimant): rows whose
                             # rowsFrame holds those records (codec 0), set
                             # as phase 1's rows but with the records' state
                             # and steps; `optimizer` names the tables' row
                             # optimizer it was saved from; all checked
                             # (phase 1's checks, finite state, sums of
                             # squares >= 0, steps <= 2^53) before any row
                             # is written.
                             # 6 scan the rows of a table (no claim needed;
                             # one rows ref naming the table, no frames):
                             # the reply's one rows ref has keysFrame: the
                             # keys of the first min(scanRows, left) entries
                             # (rows and admission counters, not expired,
                             # owned by the shard) whose key is >= cursor, in
                             # increasing key order, and rowsFrame: their
                             # saved records (common/sparse_table.h
                             # SavedRecordBytes: u32 kind 1 row / 2 counter,
                             # u32 0, u64 steps or pushes counted, i64 clock
                             # of the last push, f32 weights[dim], f32
                             # state[dim x k]; a counter's floats 0). Fewer
                             # than scanRows: the scan is complete; else the
                             # next page starts at the last key + 1.
                             # scanRows in [1, --max_sparse_keys] and the
                             # reply within --max_sparse_reply_bytes, else
                             # InvalidArgument. Routed by layoutEpoch as a
                             # pull (elastic shards: an older epoch is
                             # refused with the shard's document, a newer
                             # one is Unavailable, retry): a scan whose
                             # pages carry one epoch sees every key once.
                             # Scratch and reply charged to the memory
                             # budget (ResourceExhausted: smaller pages).
                             # 7 saved rows (the claimant): as 5, with
                             # phase 6's records (kinds, counters, clocks
                             # restored; all checked before any is written)
                             # 8 clear tables (the claimant): rows refs
                             # naming tables (each once, no keys, frames 0;
                             # no data frames): every entry of them on the
                             # shard, cached or stored, is dropped (one
                             # store write); a restore of saved entries
                             # sends it first. Unavailable (retry) while a
                             # key-range move stages rows of one of them.
  chunks @2 :List(ChunkRef); # values, state: one per data frame
  overwrite @3 :Bool;        # begin: claim even final values (a restore)
  rows @4 :List(RowsRef);    # values: rows of sparse tables set to the
                             # given values (raw fp32, codec 0; keys owned
                             # by the shard, each once), optimizer state 0
  optimizer @5 :Text;        # state: the optimizer it was saved from
                             # (ps_server --optimizer: "sgd", "momentum",
                             # "adam", "adagrad"); refused unless the shard's;
                             # rows with state: the row optimizer ("sgd",
                             # "adagrad", "adam"), refused unless the table's
  cursor @6 :UInt64;         # scan: the first key of the page
  scanRows @7 :UInt32;       # scan: most entries in the reply
  snapshot @8 :UInt64;       # scan: the point-in-time scan this page is of
                             # (as the reply to its first page named it);
                             # 0 = none
  openSnapshot @9 :Bool;     # scan (snapshot 0): start a point-in-time scan
                             # of the table: the shard writes a checkpoint
                             # (every dirty row goes to its store), takes a
                             # snapshot of its store (without a store: a copy
                             # of the table's entries, charged to the memory
                             # budget) at its expiry clock, and answers this
                             # page and every later one naming the reply's
                             # scanSnapshot from it, whatever is pushed
                             # meanwhile. The shard drops it after its last
                             # page (fewer than scanRows), after
                             # --scan_snapshot_idle_s without a page, when its
                             # layout epoch changes or it restarts; a page naming
                             # one it dropped (or another table's) is
                             # FailedPrecondition: start the scan again. At
                             # most 4 open at once, one opened per 50 ms
                             # (Unavailable: retry).
}

# Replication (server/replication/): a primary hands a request it applied to
# each backup of its replica group. Data frame 1 is the applied request's
# header, frames 2.. its data frames; the backup applies it the same way and
# answers with this request's id. A backup takes these only from the primary
# of the layout it holds: a lower epoch is refused (a deposed primary cannot
# get an update acknowledged).
#
# A round record (BSP with replication after aggregation, aggregate set):
# frames 1..requests are the headers of the pushes and clocks the primary
# applied since its last record, in order, without their data; frame
# requests+1 the ids of the chunks whose round sums follow (u32 each, native
# order), frames requests+2.. those sums (f32, one chunk per frame). The
# backup sets each listed chunk's round sum, replays the headers (pushes:
# de-duplication, clocks and round bookkeeping, no data) and closes its
# round up to `round` if the primary's closed without a replayed clock.
#
# A liveness record (workers set, no data frame): the primary evicted
# silent workers, or took back an evicted one on a request it does not hand
# on (a heartbeat, a pull). Each entry is the worker's state on the primary
# after the change; the backup sets it exactly, at this point of the
# primary's order, with the same consequences (rounds closed, sparse rows
# expired, per-worker reads freed). A backup never evicts on its own timer.
#
# Who sent it (`sender`): a replica request is applied only when it comes
# from the process the receiver's layout names as its group's primary
# (server/replication/replica_auth.h). With CurveZMQ the receiver compares
# the sender's handshake key with the key in that process's etcd member
# record; without, the message carries one more frame after its data: a
# 16-byte tag (ChaCha20-Poly1305 over the frames before it: the header's
# bytes and every frame's length, and with `tagAll` every frame's bytes;
# under a key derived from the group's secret and `session`, with the
# request id as nonce), and ids of one session only grow.
struct Replicate {
  epoch @0 :UInt64;          # the layout epoch the primary serves under
  group @1 :Int32;           # the replica group (shard index)
  aggregate @2 :Bool;        # a round record (see above)
  requests @3 :UInt32;       # round record: headers it carries
  round @4 :Int64;           # round record: the primary's BSP round after it
  workers @5 :List(WorkerState);  # liveness record (see above)
  sender @6 :ReplicaSender;
}

struct ReplicaSender {
  name @0 :Text;             # replica name, "g<group>r<replica>"
  incarnation @1 :UInt64;    # of its process (its etcd member record)
  session @2 :Data;          # 16 random bytes per sending process: which
                             # key the tag is under (no CURVE)
  tagAll @3 :Bool;           # the tag covers every byte of every frame;
                             # false: this header's bytes and every later
                             # frame's length (ps_server --replica_tag)
}

struct WorkerState {
  rank @0 :Int32;
  live @1 :Bool;             # counted in the clock minimum
  clock @2 :Int64;
}

# Re-replication: a primary copies its store, a consistent checkpoint, to a
# spare of its group, one piece of one file per request (data frame 1), in
# order; the spare installs it as its own store after the piece marked last,
# and from then on takes the primary's kReplicate requests. Each piece is
# answered with this request's id.
struct Snapshot {
  epoch @0 :UInt64;
  group @1 :Int32;
  file @2 :Text;             # a plain file name of the checkpoint
  offset @3 :UInt64;         # of this piece in the file
  fileSize @4 :UInt64;       # the whole file
  totalBytes @5 :UInt64;     # all files of the snapshot
  last @6 :Bool;             # the snapshot's last piece
  sender @7 :ReplicaSender;  # as in Replicate: only the primary may send one
}

# Elastic shards (server/elastic/): ps_ctl moves chunks between shards while
# training runs: copy, then flip ownership by epoch, with etcd the record of
# the flip. Tools only (rank -1, from loopback or the admin address). Ops
# (asyncps::MigrateOp):
#   describe: text = the shard's elastic state as JSON (epoch, owners, chunk
#             sizes, clocks, frozen, drained).
#   freeze:   toward layout `epoch`: pushes of clock >= atClock and clocks
#             > atClock are refused (retry shortly) until adopt or abort, or
#             until deadlineMs passes (then etcd decides); atClock -1 refuses
#             every push and clock. FailedPrecondition when a worker is
#             already past atClock.
#   export:   frozen and drained only: frame 1 the layout record, frame 2
#             the shard state record, frames 3.. the records of `chunks`.
#   import:   the same frames: stages the chunks (registers the layout on an
#             empty shard) for layout `epoch`.
#   adopt:    `doc` (epoch, servers, owners) becomes the layout: staged
#             chunks are installed, others dropped, pushes flow again.
#   abort:    staged chunks dropped, pushes flow again under the old layout.
struct Migrate {
  op @0 :UInt8;              # asyncps::MigrateOp
  epoch @1 :UInt64;          # the layout epoch proposed
  atClock @2 :Int64;         # freeze
  deadlineMs @3 :UInt32;     # freeze
  chunks @4 :List(UInt32);   # export, import: chunk ids
  doc @5 :Text;              # adopt: the elastic layout document (JSON)
  buckets @6 :List(UInt32);  # export, import of sparse rows: the buckets
                             # (of numBuckets) whose rows move; frames:
                             # the tables record, a head (expiry clock, table
                             # count), then one frame of row records per table
  numBuckets @7 :UInt32;     # export, import: the cut of the key hash space
}

struct Request {
  version @0 :UInt16;
  id @1 :UInt64;             # unique per (rank, incarnation); replies echo it
  rank @2 :Int32;            # worker rank, or -1 for tools (ps_ctl)
  incarnation @3 :UInt64;    # random per client process: dedups resent pushes
  body :union {
    register @4 :Register;
    push @5 :Push;
    pull @6 :Pull;
    clock @7 :Clock;
    heartbeat @8 :Void;
    stats @9 :Void;
    checkpoint @10 :Void;
    shutdown @11 :Void;
    attachShm @13 :AttachShm;
    replicate @14 :Replicate;
    snapshot @15 :Snapshot;
    assign @17 :Assign;
    migrate @16 :Migrate;
  }
  doneBelow @12 :UInt64;     # pushes: every earlier push (lower id) of this
                             # client to this shard has been answered or given
                             # up and will not be sent again; 0 = unknown.
                             # Lets the shard apply each push exactly once.
  layoutEpoch @18 :UInt64;   # push, pull: the elastic layout epoch the
                             # client routed it by (0 = static)
}

struct Reply {
  version @0 :UInt16;
  id @1 :UInt64;
  code @2 :UInt8;            # asyncps::StatusCode, 0 = OK
  message @3 :Text;          # error text when code != 0
  kind @4 :UInt8;            # asyncps::RequestKind this answers
  shardVersion @5 :UInt64;   # updates applied by the shard so far
  minClock @6 :Int64;        # min clock of live workers
  staleness @7 :Int64;       # push: staleness recorded for it (-1 n/a)
  created @8 :Bool;          # register: true when this call created the tensors
  chunks @9 :List(ChunkRef); # pull: one per data frame
  text @10 :Text;            # stats: JSON
  pullSeq @11 :UInt64;       # pull with a sparse codec: this reply's number.
                             # Its chunks carry the change since reply
                             # baseSeq (codec top-k / random-k, to be added
                             # to the client's copy) or, when the shard could
                             # not match baseSeq, whole weights (codec 0).
  maxRequestBytes @12 :UInt64;  # the largest request this server accepts
  maxFrameBytes @13 :UInt64;    # and its largest frame (0 = not said); a
                                # client refuses bigger requests itself
  rows @14 :List(RowsRef);   # pull: one per RowsRef of the request
  redirect @15 :Text;        # refused because this server is not its replica
                             # group's primary: the primary's endpoint as this
                             # server knows it ("" = unknown)
  epoch @16 :UInt64;         # the layout epoch this server serves under
                             # (0 = a static fleet)
  layoutDoc @17 :Text;       # refused because the request's layoutEpoch is
                             # not this shard's: its layout document (JSON:
                             # epoch, servers, owners), to route by and resend
  retryMs @18 :UInt32;       # Unavailable: ask again after this many ms
                             # (0: the client's own backoff)
  scanSnapshot @19 :UInt64;  # a page of a point-in-time scan: its id
}
