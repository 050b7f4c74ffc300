// Encoding of RequestHeader / ReplyHeader to and from Cap'n Proto.
// This file is the one place that catches Cap'n Proto (kj) exceptions.
#include "common/wire.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <cstring>

#include "common/protocol.capnp.h"

namespace asyncps {

namespace cw = capnpwire;

const char* RequestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kRegister:
      return "register";
    case RequestKind::kPush:
      return "push";
    case RequestKind::kPull:
      return "pull";
    case RequestKind::kClock:
      return "clock";
    case RequestKind::kHeartbeat:
      return "heartbeat";
    case RequestKind::kStats:
      return "stats";
    case RequestKind::kCheckpoint:
      return "checkpoint";
    case RequestKind::kShutdown:
      return "shutdown";
    case RequestKind::kAttachShm:
      return "attach_shm";
    case RequestKind::kReplicate:
      return "replicate";
    case RequestKind::kSnapshot:
      return "snapshot";
    case RequestKind::kMigrate:
      return "migrate";
    case RequestKind::kAssign:
      return "assign";
  }
  return "unknown";
}

namespace {

std::vector<uint8_t> Serialize(capnp::MessageBuilder& builder) {
  size_t words = capnp::computeSerializedSizeInWords(builder);
  std::vector<uint8_t> out(words * sizeof(capnp::word));
  kj::ArrayOutputStream stream(kj::arrayPtr(out.data(), out.size()));
  capnp::writeMessage(stream, builder);
  return out;
}

void FillChunkRefs(capnp::List<cw::ChunkRef>::Builder list,
                   const std::vector<ChunkRef>& refs) {
  for (size_t i = 0; i < refs.size(); ++i) {
    auto c = list[i];
    c.setChunk(refs[i].chunk);
    c.setFrame(refs[i].frame);
    c.setCodec(refs[i].codec);
    c.setNumElems(refs[i].num_elems);
    c.setByteSize(refs[i].byte_size);
    c.setVersion(refs[i].version);
  }
}

Status ReadChunkRefs(capnp::List<cw::ChunkRef>::Reader list,
                     const DecodeLimits& limits, std::vector<ChunkRef>* out) {
  if (list.size() > limits.max_list_entries) {
    return Status::ResourceExhausted("too many chunk refs: " +
                                     std::to_string(list.size()));
  }
  out->resize(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    auto c = list[i];
    ChunkRef& r = (*out)[i];
    r.chunk = c.getChunk();
    r.frame = c.getFrame();
    r.codec = c.getCodec();
    r.num_elems = c.getNumElems();
    r.byte_size = c.getByteSize();
    r.version = c.getVersion();
  }
  return Status::OK();
}

void FillRowsRefs(capnp::List<cw::RowsRef>::Builder list,
                  const std::vector<RowsRef>& refs) {
  for (size_t i = 0; i < refs.size(); ++i) {
    auto r = list[i];
    r.setTable(refs[i].table);
    r.setKeysFrame(refs[i].keys_frame);
    r.setRowsFrame(refs[i].rows_frame);
    r.setNumKeys(refs[i].num_keys);
    r.setCodec(refs[i].codec);
  }
}

Status ReadRowsRefs(capnp::List<cw::RowsRef>::Reader list,
                    const DecodeLimits& limits, std::vector<RowsRef>* out) {
  if (list.size() > limits.max_list_entries) {
    return Status::ResourceExhausted("too many rows refs: " +
                                     std::to_string(list.size()));
  }
  out->resize(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    auto r = list[i];
    RowsRef& o = (*out)[i];
    o.table = r.getTable();
    o.keys_frame = r.getKeysFrame();
    o.rows_frame = r.getRowsFrame();
    o.num_keys = r.getNumKeys();
    o.codec = r.getCodec();
  }
  return Status::OK();
}

void FillTableSpecs(capnp::List<cw::TableSpec>::Builder list,
                    const std::vector<TableSpec>& tables) {
  for (size_t i = 0; i < tables.size(); ++i) {
    const TableSpec& t = tables[i];
    auto o = list[i];
    o.setName(t.name);
    o.setDim(t.dim);
    o.setInit(static_cast<uint8_t>(t.init));
    o.setInitParam(t.init_param);
    o.setSeed(t.seed);
    o.setOptimizer(static_cast<uint8_t>(t.optimizer.kind));
    o.setLr(t.optimizer.lr);
    o.setBeta1(t.optimizer.beta1);
    o.setBeta2(t.optimizer.beta2);
    o.setEps(t.optimizer.eps);
    o.setInitialAccumulator(t.optimizer.initial_accumulator);
    o.setAdmitAfterPushes(t.admit_after_pushes);
    o.setExpireAfterClocks(t.expire_after_clocks);
  }
}

// Reads table specs; their values are checked by the shard (ValidateTables),
// only the enums' ranges here.
Status ReadTableSpecs(capnp::List<cw::TableSpec>::Reader list,
                      const DecodeLimits& limits, std::vector<TableSpec>* out) {
  if (list.size() > std::min<size_t>(limits.max_list_entries, kMaxTables)) {
    return Status::ResourceExhausted("too many tables: " +
                                     std::to_string(list.size()));
  }
  out->resize(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    auto t = list[i];
    TableSpec& s = (*out)[i];
    s.name = t.getName().cStr();
    s.dim = t.getDim();
    if (t.getInit() > static_cast<uint8_t>(InitKind::kXavierUniform))
      return Status::InvalidArgument("table '" + s.name +
                                     "': unknown initialiser");
    s.init = static_cast<InitKind>(t.getInit());
    s.init_param = t.getInitParam();
    s.seed = t.getSeed();
    if (t.getOptimizer() > static_cast<uint8_t>(RowOptimizerKind::kAdam))
      return Status::InvalidArgument("table '" + s.name +
                                     "': unknown row optimizer");
    s.optimizer.kind = static_cast<RowOptimizerKind>(t.getOptimizer());
    s.optimizer.lr = t.getLr();
    s.optimizer.beta1 = t.getBeta1();
    s.optimizer.beta2 = t.getBeta2();
    s.optimizer.eps = t.getEps();
    s.optimizer.initial_accumulator = t.getInitialAccumulator();
    s.admit_after_pushes = t.getAdmitAfterPushes();
    s.expire_after_clocks = t.getExpireAfterClocks();
  }
  return Status::OK();
}

// Runs `fn` on a reader over [data, size), turning every kj exception into
// InvalidArgument. Copies into aligned memory when `data` is not word-aligned.
template <typename Root, typename Fn>
Status WithReader(const uint8_t* data, size_t size, const DecodeLimits& limits,
                  Fn&& fn) {
  if (size == 0) return Status::InvalidArgument("empty header frame");
  if (size > limits.max_header_bytes) {
    return Status::ResourceExhausted("header of " + std::to_string(size) +
                                     " bytes exceeds limit");
  }
  if (size % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("header size " + std::to_string(size) +
                                   " is not a multiple of 8");
  }
  kj::Array<capnp::word> copy;
  const capnp::word* words = reinterpret_cast<const capnp::word*>(data);
  if (reinterpret_cast<uintptr_t>(data) % alignof(capnp::word) != 0) {
    copy = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
    std::memcpy(copy.begin(), data, size);
    words = copy.begin();
  }
  Status result;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 capnp::ReaderOptions options;
                 options.traversalLimitInWords =
                     size / sizeof(capnp::word) * 4 + 1024;
                 options.nestingLimit = 16;
                 capnp::FlatArrayMessageReader reader(
                     kj::arrayPtr(words, size / sizeof(capnp::word)), options);
                 result = fn(reader.getRoot<Root>());
               })) {
    return Status::InvalidArgument(std::string("malformed header: ") +
                                   e->getDescription().cStr());
  }
  return result;
}

// The sender of a kReplicate or kSnapshot (protocol.capnp ReplicaSender).
void SetSender(const RequestHeader& h, cw::ReplicaSender::Builder b) {
  b.setName(h.replica_sender);
  b.setIncarnation(h.replica_incarnation);
  b.setSession(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(h.replica_session.data()),
                   h.replica_session.size()));
  b.setTagAll(h.replica_tag_all);
}

Status GetSender(cw::ReplicaSender::Reader r, RequestHeader* out) {
  constexpr size_t kMaxName = 64, kMaxSession = 64;
  if (r.getName().size() > kMaxName || r.getSession().size() > kMaxSession)
    return Status::InvalidArgument("replica sender too long");
  out->replica_sender = r.getName().cStr();
  out->replica_incarnation = r.getIncarnation();
  auto session = r.getSession();
  out->replica_session.assign(reinterpret_cast<const char*>(session.begin()),
                              session.size());
  out->replica_tag_all = r.getTagAll();
  return Status::OK();
}

// Request.body.register from `h`.
void EncodeRegister(const RequestHeader& h, cw::Register::Builder reg) {
  auto ts = reg.initTensors(h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorSpec& t = h.tensors[i];
    auto o = ts[i];
    o.setName(t.name);
    auto shape = o.initShape(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) shape.set(d, t.shape[d]);
    o.setInit(static_cast<uint8_t>(t.init));
    o.setInitParam(t.init_param);
    o.setSeed(t.seed);
  }
  reg.setChunkElems(h.layout.chunk_elems);
  reg.setMinChunkElems(h.layout.min_chunk_elems);
  reg.setNumShards(static_cast<uint32_t>(h.layout.num_shards));
  reg.setPlacement(static_cast<uint8_t>(h.layout.placement));
  if (!h.tables.empty())
    FillTableSpecs(reg.initTables(h.tables.size()), h.tables);
}

// Request.body.push from `h`.
void EncodePush(const RequestHeader& h, cw::Push::Builder p) {
  p.setClock(h.clock);
  p.setLr(h.lr);
  FillChunkRefs(p.initChunks(h.chunks.size()), h.chunks);
  if (!h.rows.empty()) FillRowsRefs(p.initRows(h.rows.size()), h.rows);
}

// Request.body.pull from `h`.
void EncodePull(const RequestHeader& h, cw::Pull::Builder p) {
  p.setClock(h.clock);
  auto ids = p.initChunks(h.pull_chunks.size());
  for (size_t i = 0; i < h.pull_chunks.size(); ++i)
    ids.set(i, h.pull_chunks[i]);
  p.setCodec(h.pull_codec);
  p.setBaseSeq(h.pull_base_seq);
  if (!h.rows.empty()) FillRowsRefs(p.initRows(h.rows.size()), h.rows);
  p.setDense(h.pull_dense);
  if (!h.pull_shm_offsets.empty()) {
    auto offs = p.initShmOffsets(h.pull_shm_offsets.size());
    for (size_t i = 0; i < h.pull_shm_offsets.size(); ++i)
      offs.set(i, h.pull_shm_offsets[i]);
    p.setShmSlot(h.pull_shm_slot);
  }
}

// Request.body.attachShm from `h`.
void EncodeAttachShm(const RequestHeader& h, cw::AttachShm::Builder a) {
  a.setPid(h.shm_pid);
  a.setFd(h.shm_fd);
  a.setSize(h.shm_size);
  a.setToken(h.shm_token);
}

// Request.body.clock from `h`.
void EncodeClock(const RequestHeader& h, cw::Clock::Builder c) {
  c.setClock(h.clock);
  c.setLr(h.lr);
}

// Request.body.assign from `h`.
void EncodeAssign(const RequestHeader& h, cw::Assign::Builder a) {
  a.setUpload(h.assign_upload);
  a.setPhase(static_cast<uint8_t>(h.assign_phase));
  FillChunkRefs(a.initChunks(h.chunks.size()), h.chunks);
  a.setOverwrite(h.assign_overwrite);
  if (!h.assign_optimizer.empty()) a.setOptimizer(h.assign_optimizer);
  a.setCursor(h.assign_cursor);
  a.setScanRows(h.assign_scan_rows);
  a.setSnapshot(h.assign_snapshot);
  a.setOpenSnapshot(h.assign_open_snapshot);
  if (!h.rows.empty()) FillRowsRefs(a.initRows(h.rows.size()), h.rows);
}

// Request.body.replicate from `h`.
void EncodeReplicate(const RequestHeader& h, cw::Replicate::Builder r) {
  r.setEpoch(h.replicate_epoch);
  r.setGroup(h.replicate_group);
  r.setAggregate(h.replicate_aggregate);
  r.setRequests(h.replicate_requests);
  r.setRound(h.replicate_round);
  SetSender(h, r.initSender());
  if (!h.replicate_workers.empty()) {
    auto ws = r.initWorkers(static_cast<unsigned>(h.replicate_workers.size()));
    for (size_t i = 0; i < h.replicate_workers.size(); ++i) {
      ws[i].setRank(h.replicate_workers[i].rank);
      ws[i].setLive(h.replicate_workers[i].live);
      ws[i].setClock(h.replicate_workers[i].clock);
    }
  }
}

// Request.body.snapshot from `h`.
void EncodeSnapshot(const RequestHeader& h, cw::Snapshot::Builder r) {
  r.setEpoch(h.replicate_epoch);
  r.setGroup(h.replicate_group);
  r.setFile(h.snapshot_file);
  r.setOffset(h.snapshot_offset);
  r.setFileSize(h.snapshot_file_size);
  r.setTotalBytes(h.snapshot_total_bytes);
  r.setLast(h.snapshot_last);
  SetSender(h, r.initSender());
}

// Request.body.migrate from `h`.
void EncodeMigrate(const RequestHeader& h, cw::Migrate::Builder m) {
  m.setOp(static_cast<uint8_t>(h.migrate_op));
  m.setEpoch(h.migrate_epoch);
  m.setAtClock(h.migrate_at_clock);
  m.setDeadlineMs(h.migrate_deadline_ms);
  auto ids = m.initChunks(h.migrate_chunks.size());
  for (size_t i = 0; i < h.migrate_chunks.size(); ++i)
    ids.set(i, h.migrate_chunks[i]);
  if (!h.migrate_doc.empty()) m.setDoc(h.migrate_doc);
  auto buckets = m.initBuckets(h.migrate_buckets.size());
  for (size_t i = 0; i < h.migrate_buckets.size(); ++i)
    buckets.set(i, h.migrate_buckets[i]);
  m.setNumBuckets(h.migrate_num_buckets);
}

// Every field a request body sets, back to its default (a decoded header
// holds only what its own body carries).
void ResetRequestBody(RequestHeader* out) {
  out->chunks.clear();
  out->pull_chunks.clear();
  out->tensors.clear();
  out->pull_codec.clear();
  out->pull_base_seq = 0;
  out->clock = 0;
  out->lr = 0.0f;
  out->assign_upload = 0;
  out->assign_phase = AssignOp::kBegin;
  out->assign_overwrite = false;
  out->assign_optimizer.clear();
  out->assign_cursor = 0;
  out->assign_scan_rows = 0;
  out->assign_snapshot = 0;
  out->assign_open_snapshot = false;
  out->tables.clear();
  out->rows.clear();
  out->pull_dense = true;
  out->pull_shm_offsets.clear();
  out->shm_pid = 0;
  out->shm_fd = -1;
  out->shm_size = 0;
  out->shm_token = 0;
  out->pull_shm_slot = 0;
  out->replicate_workers.clear();
  out->replica_sender.clear();
  out->replica_incarnation = 0;
  out->replica_session.clear();
  out->replica_tag_all = false;
}

// Request.body.register into `out`.
Status DecodeRegister(cw::Register::Reader reg, const DecodeLimits& limits,
                      RequestHeader* out) {
  auto ts = reg.getTensors();
  if (ts.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many tensors");
  out->tensors.resize(ts.size());
  for (uint32_t i = 0; i < ts.size(); ++i) {
    auto t = ts[i];
    TensorSpec& s = out->tensors[i];
    s.name = t.getName().cStr();
    auto shape = t.getShape();
    if (shape.size() > 8)
      return Status::InvalidArgument("tensor with more than 8 dimensions");
    s.shape.resize(shape.size());
    for (uint32_t d = 0; d < shape.size(); ++d) s.shape[d] = shape[d];
    if (t.getInit() > static_cast<uint8_t>(InitKind::kXavierUniform)) {
      return Status::InvalidArgument("unknown initialiser " +
                                     std::to_string(t.getInit()));
    }
    s.init = static_cast<InitKind>(t.getInit());
    s.init_param = t.getInitParam();
    s.seed = t.getSeed();
  }
  out->layout.chunk_elems = reg.getChunkElems();
  out->layout.min_chunk_elems = reg.getMinChunkElems();
  out->layout.num_shards =
      static_cast<int>(std::min<uint32_t>(reg.getNumShards(), 1u << 20));
  if (reg.getPlacement() > kMaxPlacement) {
    return Status::InvalidArgument("unknown placement " +
                                   std::to_string(reg.getPlacement()));
  }
  out->layout.placement = static_cast<Placement>(reg.getPlacement());
  return ReadTableSpecs(reg.getTables(), limits, &out->tables);
}

// Request.body.push into `out`.
Status DecodePush(cw::Push::Reader p, const DecodeLimits& limits,
                  RequestHeader* out) {
  out->clock = p.getClock();
  out->lr = p.getLr();
  RETURN_IF_ERROR(ReadChunkRefs(p.getChunks(), limits, &out->chunks));
  return ReadRowsRefs(p.getRows(), limits, &out->rows);
}

// Request.body.pull into `out`.
Status DecodePull(cw::Pull::Reader p, const DecodeLimits& limits,
                  RequestHeader* out) {
  out->clock = p.getClock();
  auto ids = p.getChunks();
  if (ids.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many chunk ids");
  out->pull_chunks.resize(ids.size());
  for (uint32_t i = 0; i < ids.size(); ++i) out->pull_chunks[i] = ids[i];
  out->pull_codec = p.getCodec().cStr();
  out->pull_base_seq = p.getBaseSeq();
  out->pull_dense = p.getDense();
  auto offs = p.getShmOffsets();
  if (offs.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many shm offsets");
  out->pull_shm_offsets.resize(offs.size());
  for (uint32_t i = 0; i < offs.size(); ++i) out->pull_shm_offsets[i] = offs[i];
  out->pull_shm_slot = p.getShmSlot();
  return ReadRowsRefs(p.getRows(), limits, &out->rows);
}

// Request.body.assign into `out`.
Status DecodeAssign(cw::Assign::Reader a, const DecodeLimits& limits,
                    RequestHeader* out) {
  out->assign_upload = a.getUpload();
  out->assign_phase = static_cast<AssignOp>(a.getPhase());
  out->assign_overwrite = a.getOverwrite();
  out->assign_cursor = a.getCursor();
  out->assign_scan_rows = a.getScanRows();
  out->assign_snapshot = a.getSnapshot();
  out->assign_open_snapshot = a.getOpenSnapshot();
  if (a.hasOptimizer()) {
    auto name = a.getOptimizer();
    if (name.size() > 64) {
      return Status::InvalidArgument("assign names an optimizer of " +
                                     std::to_string(name.size()) +
                                     " bytes (at most 64)");
    }
    out->assign_optimizer.assign(name.cStr(), name.size());
  }
  RETURN_IF_ERROR(ReadChunkRefs(a.getChunks(), limits, &out->chunks));
  return ReadRowsRefs(a.getRows(), limits, &out->rows);
}

// Request.body.attachShm into `out`.
Status DecodeAttachShm(cw::AttachShm::Reader a, RequestHeader* out) {
  out->shm_pid = a.getPid();
  out->shm_fd = a.getFd();
  out->shm_size = a.getSize();
  out->shm_token = a.getToken();
  return Status::OK();
}

// Request.body.replicate into `out`.
Status DecodeReplicate(cw::Replicate::Reader r, const DecodeLimits& limits,
                       RequestHeader* out) {
  out->replicate_epoch = r.getEpoch();
  out->replicate_group = r.getGroup();
  out->replicate_aggregate = r.getAggregate();
  out->replicate_requests = r.getRequests();
  out->replicate_round = r.getRound();
  RETURN_IF_ERROR(GetSender(r.getSender(), out));
  auto ws = r.getWorkers();
  if (ws.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many worker states");
  out->replicate_workers.resize(ws.size());
  for (uint32_t i = 0; i < ws.size(); ++i) {
    out->replicate_workers[i].rank = ws[i].getRank();
    out->replicate_workers[i].live = ws[i].getLive();
    out->replicate_workers[i].clock = ws[i].getClock();
  }
  return Status::OK();
}

// Request.body.snapshot into `out`.
Status DecodeSnapshot(cw::Snapshot::Reader r, RequestHeader* out) {
  out->replicate_epoch = r.getEpoch();
  out->replicate_group = r.getGroup();
  out->snapshot_file = r.getFile().cStr();
  out->snapshot_offset = r.getOffset();
  out->snapshot_file_size = r.getFileSize();
  out->snapshot_total_bytes = r.getTotalBytes();
  out->snapshot_last = r.getLast();
  RETURN_IF_ERROR(GetSender(r.getSender(), out));
  return Status::OK();
}

// Request.body.migrate into `out`.
Status DecodeMigrate(cw::Migrate::Reader m, const DecodeLimits& limits,
                     RequestHeader* out) {
  if (m.getOp() > static_cast<uint8_t>(MigrateOp::kAbort)) {
    return Status::InvalidArgument("unknown migrate op " +
                                   std::to_string(m.getOp()));
  }
  out->migrate_op = static_cast<MigrateOp>(m.getOp());
  out->migrate_epoch = m.getEpoch();
  out->migrate_at_clock = m.getAtClock();
  out->migrate_deadline_ms = m.getDeadlineMs();
  auto ids = m.getChunks();
  if (ids.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many chunk ids");
  out->migrate_chunks.resize(ids.size());
  for (uint32_t i = 0; i < ids.size(); ++i) out->migrate_chunks[i] = ids[i];
  out->migrate_doc = m.getDoc().cStr();
  auto buckets = m.getBuckets();
  if (buckets.size() > limits.max_list_entries)
    return Status::ResourceExhausted("too many bucket ids");
  out->migrate_buckets.resize(buckets.size());
  for (uint32_t i = 0; i < buckets.size(); ++i)
    out->migrate_buckets[i] = buckets[i];
  out->migrate_num_buckets = m.getNumBuckets();
  return Status::OK();
}

}  // namespace

std::vector<uint8_t> EncodeRequest(const RequestHeader& h) {
  capnp::MallocMessageBuilder builder(256);
  auto r = builder.initRoot<cw::Request>();
  r.setVersion(h.version);
  r.setId(h.id);
  r.setRank(h.rank);
  r.setIncarnation(h.incarnation);
  r.setDoneBelow(h.done_below);
  r.setLayoutEpoch(h.layout_epoch);
  auto body = r.initBody();
  switch (h.kind) {
    case RequestKind::kRegister:
      EncodeRegister(h, body.initRegister());
      break;
    case RequestKind::kPush:
      EncodePush(h, body.initPush());
      break;
    case RequestKind::kPull:
      EncodePull(h, body.initPull());
      break;
    case RequestKind::kAttachShm:
      EncodeAttachShm(h, body.initAttachShm());
      break;
    case RequestKind::kClock:
      EncodeClock(h, body.initClock());
      break;
    case RequestKind::kAssign:
      EncodeAssign(h, body.initAssign());
      break;
    case RequestKind::kReplicate:
      EncodeReplicate(h, body.initReplicate());
      break;
    case RequestKind::kSnapshot:
      EncodeSnapshot(h, body.initSnapshot());
      break;
    case RequestKind::kMigrate:
      EncodeMigrate(h, body.initMigrate());
      break;
    case RequestKind::kHeartbeat:
      body.setHeartbeat();
      break;
    case RequestKind::kStats:
      body.setStats();
      break;
    case RequestKind::kCheckpoint:
      body.setCheckpoint();
      break;
    case RequestKind::kShutdown:
      body.setShutdown();
      break;
  }
  return Serialize(builder);
}

std::vector<uint8_t> EncodeReply(const ReplyHeader& h) {
  capnp::MallocMessageBuilder builder(128 + h.chunks.size() * 8);
  auto r = builder.initRoot<cw::Reply>();
  r.setVersion(h.version);
  r.setId(h.id);
  r.setCode(static_cast<uint8_t>(h.status.code()));
  if (!h.status.ok()) r.setMessage(h.status.message());
  r.setKind(static_cast<uint8_t>(h.kind));
  r.setShardVersion(h.shard_version);
  r.setMinClock(h.min_clock);
  r.setStaleness(h.staleness);
  r.setCreated(h.created);
  if (!h.chunks.empty()) FillChunkRefs(r.initChunks(h.chunks.size()), h.chunks);
  if (!h.text.empty()) r.setText(h.text);
  r.setPullSeq(h.pull_seq);
  if (!h.rows.empty()) FillRowsRefs(r.initRows(h.rows.size()), h.rows);
  r.setMaxRequestBytes(h.max_request_bytes);
  r.setMaxFrameBytes(h.max_frame_bytes);
  if (!h.redirect.empty()) r.setRedirect(h.redirect);
  r.setEpoch(h.epoch);
  if (!h.layout_doc.empty()) r.setLayoutDoc(h.layout_doc);
  r.setRetryMs(h.retry_ms);
  r.setScanSnapshot(h.scan_snapshot);
  return Serialize(builder);
}

Status DecodeRequest(const uint8_t* data, size_t size,
                     const DecodeLimits& limits, RequestHeader* out) {
  return WithReader<cw::Request>(
      data, size, limits, [&](cw::Request::Reader r) -> Status {
        out->id = r.getId();
        out->version = r.getVersion();
        out->rank = r.getRank();
        out->incarnation = r.getIncarnation();
        out->layout_epoch = r.getLayoutEpoch();
        if (out->version != kProtocolVersion) {
          return Status::FailedPrecondition(
              "protocol version " + std::to_string(out->version) +
              " not supported (this build speaks " +
              std::to_string(kProtocolVersion) + ")");
        }
        ResetRequestBody(out);
        out->done_below = r.getDoneBelow();
        auto body = r.getBody();
        switch (body.which()) {
          case cw::Request::Body::REGISTER:
            out->kind = RequestKind::kRegister;
            return DecodeRegister(body.getRegister(), limits, out);
          case cw::Request::Body::PUSH:
            out->kind = RequestKind::kPush;
            return DecodePush(body.getPush(), limits, out);
          case cw::Request::Body::PULL:
            out->kind = RequestKind::kPull;
            return DecodePull(body.getPull(), limits, out);
          case cw::Request::Body::CLOCK:
            out->kind = RequestKind::kClock;
            out->clock = body.getClock().getClock();
            out->lr = body.getClock().getLr();
            return Status::OK();
          case cw::Request::Body::ASSIGN:
            out->kind = RequestKind::kAssign;
            return DecodeAssign(body.getAssign(), limits, out);
          case cw::Request::Body::HEARTBEAT:
            out->kind = RequestKind::kHeartbeat;
            return Status::OK();
          case cw::Request::Body::STATS:
            out->kind = RequestKind::kStats;
            return Status::OK();
          case cw::Request::Body::CHECKPOINT:
            out->kind = RequestKind::kCheckpoint;
            return Status::OK();
          case cw::Request::Body::SHUTDOWN:
            out->kind = RequestKind::kShutdown;
            return Status::OK();
          case cw::Request::Body::ATTACH_SHM:
            out->kind = RequestKind::kAttachShm;
            return DecodeAttachShm(body.getAttachShm(), out);
          case cw::Request::Body::REPLICATE:
            out->kind = RequestKind::kReplicate;
            return DecodeReplicate(body.getReplicate(), limits, out);
          case cw::Request::Body::SNAPSHOT:
            out->kind = RequestKind::kSnapshot;
            return DecodeSnapshot(body.getSnapshot(), out);
          case cw::Request::Body::MIGRATE:
            out->kind = RequestKind::kMigrate;
            return DecodeMigrate(body.getMigrate(), limits, out);
        }
        return Status::InvalidArgument(
            "unknown request kind " +
            std::to_string(static_cast<int>(body.which())));
      });
}

Status DecodeReply(const uint8_t* data, size_t size, const DecodeLimits& limits,
                   ReplyHeader* out) {
  return WithReader<cw::Reply>(
      data, size, limits, [&](cw::Reply::Reader r) -> Status {
        out->id = r.getId();
        out->version = r.getVersion();
        if (out->version != kProtocolVersion) {
          return Status::FailedPrecondition("reply protocol version " +
                                            std::to_string(out->version) +
                                            " not supported");
        }
        uint8_t code = r.getCode();
        if (code > static_cast<uint8_t>(StatusCode::kPermissionDenied)) {
          return Status::InvalidArgument("unknown status code " +
                                         std::to_string(code));
        }
        out->status =
            Status(static_cast<StatusCode>(code), r.getMessage().cStr());
        if (r.getKind() > static_cast<uint8_t>(RequestKind::kAssign)) {
          return Status::InvalidArgument("unknown reply kind");
        }
        out->kind = static_cast<RequestKind>(r.getKind());
        out->shard_version = r.getShardVersion();
        out->min_clock = r.getMinClock();
        out->staleness = r.getStaleness();
        out->created = r.getCreated();
        out->text = r.getText().cStr();
        out->pull_seq = r.getPullSeq();
        out->max_request_bytes = r.getMaxRequestBytes();
        out->max_frame_bytes = r.getMaxFrameBytes();
        out->redirect = r.getRedirect().cStr();
        out->epoch = r.getEpoch();
        out->layout_doc = r.getLayoutDoc().cStr();
        out->retry_ms = r.getRetryMs();
        out->scan_snapshot = r.getScanSnapshot();
        RETURN_IF_ERROR(ReadChunkRefs(r.getChunks(), limits, &out->chunks));
        return ReadRowsRefs(r.getRows(), limits, &out->rows);
      });
}

}  // namespace asyncps
