#include "tests/fuzz/hostile_requests.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "compression/codec.h"

namespace asyncps::fuzz {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

}  // namespace

HostileGenerator::HostileGenerator(const Layout& layout,
                                   std::vector<TensorSpec> tensors, int shard,
                                   int num_workers, bool admin, uint64_t seed,
                                   std::vector<TableSpec> tables)
    : layout_(layout),
      tensors_(std::move(tensors)),
      mine_(layout.shard_chunks(shard)),
      tables_(std::move(tables)),
      shard_(shard),
      num_shards_(layout.options().num_shards),
      num_workers_(num_workers),
      admin_(admin),
      rng_(seed) {
  for (int i = 0; i < 3; ++i) incarnations_.push_back(rng_() | 1);
}

int64_t HostileGenerator::Uniform(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
}

int64_t HostileGenerator::Clock() {
  switch (Uniform(0, 9)) {
    case 0:
      return kI64Min;
    case 1:
      return kI64Max;
    case 2:
      return int64_t{1} << 62;
    case 3:
      return -Uniform(1, 1000);
    case 4:
      return static_cast<int64_t>(rng_());
    case 5:
      return Uniform(1000000, int64_t{1} << 40);
    default:
      return Uniform(0, 2000);  // near a real worker's clocks
  }
}

int32_t HostileGenerator::Rank() {
  switch (Uniform(0, 9)) {
    case 0:
      return -1;
    case 1:
      return num_workers_;
    case 2:
      return std::numeric_limits<int32_t>::min();
    case 3:
      return std::numeric_limits<int32_t>::max();
    case 4:
      return static_cast<int32_t>(rng_());
    default:
      return static_cast<int32_t>(Uniform(0, num_workers_ - 1));
  }
}

uint64_t HostileGenerator::Id() {
  switch (Uniform(0, 9)) {
    case 0:
      return 0;
    case 1:
      return std::numeric_limits<uint64_t>::max();
    case 2:
      return next_id_ > 5 ? next_id_ - Uniform(1, 5) : 1;  // a repeat
    case 3:
      return rng_();
    default:
      return next_id_++;
  }
}

uint64_t HostileGenerator::Count() {
  switch (Uniform(0, 7)) {
    case 0:
      return 0;
    case 1:
      return std::numeric_limits<uint64_t>::max();
    case 2:
      return uint64_t{1} << Uniform(31, 63);
    case 3:
      return rng_();
    default:
      return static_cast<uint64_t>(Uniform(1, 5000));
  }
}

uint32_t HostileGenerator::ChunkId() {
  switch (Uniform(0, 5)) {
    case 0:
      return static_cast<uint32_t>(rng_());
    case 1:
      return std::numeric_limits<uint32_t>::max();
    case 2:
      return static_cast<uint32_t>(
          Uniform(0, static_cast<int64_t>(layout_.chunks().size()) - 1));
    default:
      return mine_[Uniform(0, static_cast<int64_t>(mine_.size()) - 1)];
  }
}

std::string HostileGenerator::PullCodec() {
  static const char* kSpecs[] = {"",
                                 "none",
                                 "fp16",
                                 "bf16",
                                 "int8",
                                 "qsgd:levels=4",
                                 "topk:ratio=0.01",
                                 "topk:ratio=1",
                                 "randomk:ratio=0.5",
                                 "topk:ratio=0",
                                 "topk:ratio=1e-300",
                                 "qsgd:levels=100000",
                                 "int8:bucket=7",
                                 "bogus",
                                 "topk:ratio=0.01,ef=1,momentum=2",
                                 ":::,,,==="};
  if (OneIn(20)) return std::string(Uniform(0, 5000), 'x');
  return kSpecs[Uniform(0, sizeof(kSpecs) / sizeof(kSpecs[0]) - 1)];
}

std::vector<uint8_t> HostileGenerator::ZeroPayload(uint32_t id,
                                                   uint8_t* codec) {
  const uint64_t n = layout_.chunks()[id].num_elems;
  std::vector<float> zeros(n, 0.0f);
  std::vector<uint8_t> out;
  *codec = static_cast<uint8_t>(Uniform(0, compression::kNumCodecs - 1));
  if (*codec != 0) {
    const Status s =
        compression::CodecForId(static_cast<compression::CodecId>(*codec))
            .Encode(zeros.data(), n, rng_(), &out);
    if (s.ok()) return out;
    *codec = 0;
  }
  out.resize(n * sizeof(float));
  std::memcpy(out.data(), zeros.data(), out.size());
  return out;
}

void HostileGenerator::Push(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kPush;
  h.clock = Clock();
  if (OneIn(4)) h.done_below = Count();
  // A legal shape first (1-3 distinct chunks of this shard, zero payloads).
  const int n = static_cast<int>(Uniform(1, std::min<size_t>(3, mine_.size())));
  std::vector<uint32_t> ids = mine_;
  std::shuffle(ids.begin(), ids.end(), rng_);
  for (int i = 0; i < n; ++i) {
    ChunkRef r;
    r.chunk = ids[i];
    r.frame = static_cast<uint32_t>(i + 1);
    r.num_elems = layout_.chunks()[ids[i]].num_elems;
    m->frames.push_back(ZeroPayload(ids[i], &r.codec));
    r.byte_size = m->frames.back().size();
    h.chunks.push_back(r);
  }
  ChunkRef& r = h.chunks[Uniform(0, n - 1)];
  switch (Uniform(0, 13)) {
    case 0:
      m->shape = "push/zero_gradient";
      return;
    case 1:
      m->shape = "push/empty";
      h.chunks.clear();
      m->frames.clear();
      return;
    case 2:
      m->shape = "push/chunk_id";
      r.chunk = ChunkId();
      return;
    case 3:
      m->shape = "push/repeated_chunk";
      h.chunks.push_back(h.chunks[0]);
      h.chunks.back().frame = static_cast<uint32_t>(m->frames.size() + 1);
      m->frames.push_back(m->frames[0]);
      return;
    case 4:
      m->shape = "push/frame_index";
      r.frame = static_cast<uint32_t>(Uniform(0, 1) ? 0 : rng_());
      return;
    case 5:
      m->shape = "push/num_elems";
      r.num_elems = Count();
      return;
    case 6:
      m->shape = "push/byte_size";
      r.byte_size = Count();
      return;
    case 7:
      // Another codec's id (never raw fp32: a zero payload read as floats
      // could be a legal update with garbage values).
      m->shape = "push/codec_id";
      r.codec = static_cast<uint8_t>(Uniform(1, 255));
      return;
    case 8: {
      m->shape = "push/non_finite";
      std::vector<uint8_t>& f = m->frames[&r - h.chunks.data()];
      f.assign(r.num_elems * sizeof(float), 0);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(f.data() + sizeof(float) * Uniform(0, r.num_elems - 1), &nan,
                  sizeof(float));
      r.codec = 0;
      r.byte_size = f.size();
      return;
    }
    case 9: {
      // Random bytes that can never be a legal update (a finite gradient of
      // garbage values would be one: no server can tell it from a real
      // one): raw fp32 of the wrong size, or a codec payload one or more
      // bytes too short or too long.
      m->shape = "push/payload_bytes";
      std::vector<uint8_t>& f = m->frames[&r - h.chunks.data()];
      const size_t exact = f.size();
      if (r.codec == 0) {
        size_t n = static_cast<size_t>(Uniform(0, 2 * exact + 16));
        if (n == exact) ++n;
        f.resize(n);
        for (auto& b : f) b = static_cast<uint8_t>(rng_());
      } else {
        f.resize(OneIn(2) ? exact + static_cast<size_t>(Uniform(1, 64))
                          : static_cast<size_t>(Uniform(0, exact - 1)));
        for (size_t i = exact; i < f.size(); ++i)
          f[i] = static_cast<uint8_t>(rng_());
      }
      r.byte_size = f.size();
      return;
    }
    case 10:
      m->shape = "push/extra_frames";
      for (int64_t i = Uniform(1, 64); i > 0; --i)
        m->frames.emplace_back(Uniform(0, 64), 0);
      return;
    case 11:
      m->shape = "push/missing_frames";
      m->frames.pop_back();
      return;
    case 12:
      if (OneIn(50)) {
        // More frames than a message may have (ps_server: 65536).
        m->shape = "push/frame_count";
        m->frames.assign(70000, std::vector<uint8_t>(1, 0));
      } else {
        m->shape = "push/many_refs";
        const int64_t refs = Uniform(1000, 20000);
        for (int64_t i = 0; i < refs; ++i) {
          ChunkRef x = h.chunks[0];
          x.chunk = ChunkId();
          x.frame = static_cast<uint32_t>(Uniform(0, 4));
          h.chunks.push_back(x);
        }
      }
      return;
    default:
      m->shape = "push/clock_rank";
      h.clock = Clock();
      h.rank = Rank();
      return;
  }
}

void HostileGenerator::Pull(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kPull;
  h.clock = Clock();
  h.pull_codec = PullCodec();
  h.pull_base_seq = OneIn(2) ? 0 : Count();
  switch (Uniform(0, 6)) {
    case 0:
      m->shape = "pull/all";
      return;
    case 6:
      // Into shared memory this client never attached, or with offsets,
      // counts and slots of any size (common/shm_segment.h).
      m->shape = "pull/shm";
      for (uint32_t id : mine_) {
        if (OneIn(2)) h.pull_chunks.push_back(id);
      }
      if (OneIn(4)) h.pull_chunks.push_back(ChunkId());
      for (size_t i = 0, n = h.pull_chunks.size() + (OneIn(4) ? 1 : 0); i < n;
           ++i) {
        h.pull_shm_offsets.push_back(OneIn(2) ? Count() : rng_());
      }
      if (h.pull_shm_offsets.empty()) h.pull_shm_offsets.push_back(Count());
      h.pull_shm_slot =
          static_cast<uint32_t>(OneIn(2) ? Uniform(0, 8) : rng_());
      return;
    case 1:
      m->shape = "pull/subset";
      for (uint32_t id : mine_) {
        if (OneIn(2)) h.pull_chunks.push_back(id);
      }
      return;
    case 2: {
      m->shape = "pull/repeated";
      h.pull_chunks.assign(Uniform(2, OneIn(10) ? 200000 : 100), ChunkId());
      return;
    }
    case 3:
      m->shape = "pull/chunk_ids";
      for (int64_t i = Uniform(1, 50); i > 0; --i)
        h.pull_chunks.push_back(ChunkId());
      return;
    case 4:
      m->shape = "pull/data_frames";
      m->frames.emplace_back(Uniform(0, 100), 1);
      return;
    default:
      m->shape = "pull/clock_rank";
      h.rank = Rank();
      return;
  }
}

void HostileGenerator::Register(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.kind = RequestKind::kRegister;
  h.tensors = tensors_;
  h.layout = layout_.options();
  h.tables = tables_;
  if (!tables_.empty() && OneIn(4)) return HostileTables(m);
  switch (Uniform(0, 8)) {
    case 0:
      m->shape = "register/same";  // idempotent
      return;
    case 1:
      m->shape = "register/huge_tensor";
      h.tensors = {TensorSpec{
          "huge", {int64_t{1} << Uniform(30, 40)}, InitKind::kZeros, 0, 1}};
      h.layout.chunk_elems = OneIn(2) ? 1 : Count() | 1;
      h.layout.min_chunk_elems = 1;
      return;
    case 2: {
      m->shape = "register/many_tensors";
      h.tensors.clear();
      const int64_t n = Uniform(1000, 20000);
      for (int64_t i = 0; i < n; ++i) {
        h.tensors.push_back(TensorSpec{"t" + std::to_string(i),
                                       {Uniform(1, int64_t{1} << 20)},
                                       InitKind::kZeros,
                                       0,
                                       1});
      }
      return;
    }
    case 3: {
      m->shape = "register/dims";
      TensorSpec& t = h.tensors[Uniform(0, h.tensors.size() - 1)];
      t.shape.assign(Uniform(0, 8), 0);
      for (int64_t& d : t.shape) {
        d = OneIn(3) ? static_cast<int64_t>(rng_())
                     : (OneIn(2) ? kI64Max : Uniform(-2, 1 << 20));
      }
      return;
    }
    case 4:
      m->shape = "register/chunk_elems";
      h.layout.chunk_elems = Count();
      h.layout.min_chunk_elems = Count();
      return;
    case 5:
      m->shape = "register/num_shards";
      h.layout.num_shards = static_cast<int>(Uniform(0, 1 << 20));
      return;
    case 6:
      m->shape = "register/names";
      h.tensors[0].name = OneIn(2) ? "" : std::string(Uniform(256, 4000), 'n');
      if (h.tensors.size() > 1 && OneIn(2))
        h.tensors[1].name = h.tensors[0].name;
      return;
    case 7:
      m->shape = "register/mismatch";
      h.tensors[Uniform(0, h.tensors.size() - 1)].seed ^= 1;
      return;
    default:
      m->shape = "register/init";
      h.tensors[0].init = static_cast<InitKind>(Uniform(0, 5));
      h.tensors[0].init_param = OneIn(2)
                                    ? std::numeric_limits<float>::infinity()
                                    : static_cast<float>(Uniform(-1000, 1000));
      return;
  }
}

std::vector<uint8_t> HostileGenerator::Bytes(size_t max) {
  std::vector<uint8_t> b(
      static_cast<size_t>(Uniform(0, static_cast<int64_t>(max))));
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng_());
  return b;
}

void HostileGenerator::ReplicaTraffic(HostileMessage* m) {
  RequestHeader& h = m->header;
  h.rank = OneIn(2) ? -1 : Rank();
  h.replicate_epoch = OneIn(2) ? Uniform(0, 4) : rng_();
  h.replicate_group = static_cast<int32_t>(OneIn(4) ? rng_() : 0);
  if (!replica_names_.empty() && !OneIn(4)) {
    h.replica_sender = replica_names_[Uniform(0, replica_names_.size() - 1)];
  } else {
    const std::vector<uint8_t> b = Bytes(80);
    h.replica_sender.assign(b.begin(), b.end());
  }
  h.replica_incarnation = OneIn(4) ? 0 : rng_();
  {
    const std::vector<uint8_t> b = Bytes(OneIn(2) ? 16 : 40);
    h.replica_session.assign(b.begin(), b.end());
    if (OneIn(2)) h.replica_session.resize(16, '\0');
  }
  const int64_t pick = Uniform(0, 99);
  if (pick < 20) {
    h.kind = RequestKind::kSnapshot;
    static const char* kNames[] = {
        "../../etc/passwd", "CURRENT", "",     ".",
        "MANIFEST-000001",  "a/b",     "LOCK", "OPTIONS-5"};
    h.snapshot_file = kNames[Uniform(0, 7)];
    h.snapshot_offset = OneIn(2) ? Count() : rng_();
    h.snapshot_file_size = OneIn(2) ? Count() : rng_();
    h.snapshot_total_bytes = OneIn(2) ? Count() : rng_();
    h.snapshot_last = OneIn(2);
    m->frames.push_back(Bytes(4096));
    m->shape = "replica/snapshot";
  } else {
    h.kind = RequestKind::kReplicate;
    if (pick < 30) {
      m->shape = "replica/ping";
    } else if (pick < 45) {
      const int64_t n = OneIn(8) ? Uniform(0, 2000) : Uniform(1, 4);
      for (int64_t i = 0; i < n; ++i) {
        h.replicate_workers.push_back(WorkerLiveness{
            OneIn(2) ? Rank() : static_cast<int32_t>(Uniform(0, 3)), OneIn(2),
            OneIn(2) ? Clock() : 777777});
      }
      m->shape = "replica/liveness";
    } else if (pick < 60) {
      h.replicate_aggregate = true;
      h.replicate_requests =
          static_cast<uint32_t>(OneIn(2) ? Uniform(0, 8) : rng_());
      h.replicate_round = OneIn(2) ? Clock() : static_cast<int64_t>(rng_());
      const int64_t frames = Uniform(0, 6);
      for (int64_t f = 0; f < frames; ++f) m->frames.push_back(Bytes(256));
      m->shape = "replica/round_record";
    } else {
      // A request wrapped in the replicate, as a primary hands one on.
      RequestHeader inner;
      inner.id = Id();
      inner.rank = 0;
      inner.incarnation = incarnations_[0];
      std::vector<std::vector<uint8_t>> data;
      switch (Uniform(0, 8)) {
        case 0: {  // a forged update: never applied
          inner.kind = RequestKind::kPush;
          inner.clock = OneIn(2) ? 0 : Clock();
          if (!mine_.empty()) {
            const uint32_t id = mine_[Uniform(0, mine_.size() - 1)];
            const uint64_t n = layout_.chunks()[id].num_elems;
            ChunkRef c;
            c.chunk = id;
            c.frame = 1;
            c.num_elems = n;
            c.byte_size = n * sizeof(float);
            inner.chunks.push_back(c);
            std::vector<float> g(n, 1000.0f);
            data.emplace_back(reinterpret_cast<const uint8_t*>(g.data()),
                              reinterpret_cast<const uint8_t*>(g.data() + n));
          }
          m->shape = "replica/wrapped_push";
          break;
        }
        case 1:
          inner.kind = RequestKind::kClock;
          inner.clock = Clock();
          m->shape = "replica/wrapped_clock";
          break;
        case 2:
        case 3:
          inner.kind = RequestKind::kMigrate;
          inner.rank = -1;
          inner.migrate_op = static_cast<MigrateOp>(Uniform(0, 5));
          inner.migrate_epoch = OneIn(2) ? Uniform(0, 9) : rng_();
          inner.migrate_at_clock = OneIn(2) ? -1 : Clock();
          inner.migrate_deadline_ms = static_cast<uint32_t>(rng_());
          if (OneIn(2))
            inner.migrate_doc = "{\"epoch\":99,\"servers\":[],\"owners\":[]}";
          m->shape = "replica/wrapped_migrate";
          break;
        case 4:
          inner.kind =
              OneIn(2) ? RequestKind::kReplicate : RequestKind::kSnapshot;
          inner.replicate_epoch = rng_();
          m->shape = "replica/wrapped_replica";
          break;
        case 5:
          inner.kind = RequestKind::kRegister;
          inner.tensors = tensors_;
          inner.layout.num_shards = num_shards_;
          m->shape = "replica/wrapped_register";
          break;
        case 6:
          inner.kind = RequestKind::kAssign;
          inner.assign_phase = static_cast<AssignOp>(Uniform(0, 12));
          inner.assign_upload = rng_();
          m->shape = "replica/wrapped_assign";
          break;
        default:
          m->shape = "replica/wrapped_garbage";
          break;
      }
      if (m->shape == "replica/wrapped_garbage") {
        m->frames.push_back(Bytes(512));
      } else {
        m->frames.push_back(EncodeRequest(inner));
      }
      for (auto& d : data) m->frames.push_back(std::move(d));
    }
  }
  // The tag frame (no CURVE): random bytes of its size, or of another, or
  // none.
  const int64_t tag = Uniform(0, 3);
  if (tag < 2) {
    std::vector<uint8_t> t(16);
    for (uint8_t& x : t) x = static_cast<uint8_t>(rng_());
    m->frames.push_back(std::move(t));
  } else if (tag == 2) {
    m->frames.push_back(Bytes(64));
  }
}

void HostileGenerator::Next(HostileMessage* m) {
  m->header = RequestHeader();
  m->frames.clear();
  RequestHeader& h = m->header;
  h.id = Id();
  h.rank =
      OneIn(4) ? Rank() : static_cast<int32_t>(Uniform(0, num_workers_ - 1));
  h.incarnation =
      OneIn(8) ? rng_() : incarnations_[Uniform(0, incarnations_.size() - 1)];
  if (replica_percent_ > 0 && Uniform(0, 99) < replica_percent_) {
    return ReplicaTraffic(m);
  }
  const int64_t pick = Uniform(0, 99);
  const bool rows = !tables_.empty() && OneIn(2);
  if (pick < 35) {
    rows ? PushRows(m) : Push(m);
  } else if (pick < 60) {
    rows ? PullRows(m) : Pull(m);
  } else if (pick < 75) {
    h.kind = RequestKind::kClock;
    h.clock = Clock();
    m->shape = "clock";
  } else if (pick < 85) {
    Register(m);
  } else if (pick < 88 && rows) {
    ScanRows(m);
  } else if (pick < 88) {
    h.kind = RequestKind::kHeartbeat;
    m->shape = "heartbeat";
  } else if (pick < 90 && OneIn(4)) {
    // Replication requests to a server that is no replica (or from no
    // primary of its): a replicate wrapping anything, a snapshot piece
    // naming any file at any offset; every one refused, nothing written.
    if (OneIn(2)) {
      h.kind = RequestKind::kReplicate;
      m->shape = "replicate";
    } else {
      h.kind = RequestKind::kSnapshot;
      static const char* kNames[] = {"../../etc/passwd", "CURRENT", "", ".",
                                     "MANIFEST-000001",  "a/b"};
      h.snapshot_file = kNames[Uniform(0, 5)];
      h.snapshot_offset = OneIn(2) ? Count() : rng_();
      h.snapshot_file_size = OneIn(2) ? Count() : rng_();
      h.snapshot_total_bytes = OneIn(2) ? Count() : rng_();
      h.snapshot_last = OneIn(2);
      m->shape = "snapshot";
    }
    h.replicate_epoch = OneIn(2) ? Uniform(0, 4) : rng_();
    h.replicate_group =
        static_cast<int32_t>(OneIn(2) ? Uniform(-1, 2) : rng_());
    const int64_t frames = Uniform(0, 3);
    for (int64_t f = 0; f < frames; ++f) {
      m->frames.push_back(std::vector<uint8_t>(
          static_cast<size_t>(Uniform(0, 64)), static_cast<uint8_t>(rng_())));
    }
  } else if (pick < 90) {
    // Someone else's memory, files that are not sealed memfds, sizes and
    // descriptors of any value: every attach must be refused.
    h.kind = RequestKind::kAttachShm;
    h.shm_pid = static_cast<uint32_t>(OneIn(2) ? Uniform(0, 4) : rng_());
    h.shm_fd = static_cast<int32_t>(OneIn(2) ? Uniform(-2, 64) : rng_());
    h.shm_size = OneIn(2) ? Count() : rng_();
    h.shm_token = rng_();
    m->shape = "attach_shm";
  } else if (pick < 93) {
    h.kind = RequestKind::kStats;
    m->shape = "stats";
  } else if (pick < 97 && admin_) {
    h.kind = OneIn(2) ? RequestKind::kCheckpoint : RequestKind::kShutdown;
    m->shape = h.kind == RequestKind::kCheckpoint ? "checkpoint" : "shutdown";
  } else {
    h.kind = RequestKind::kHeartbeat;
    h.version = static_cast<uint16_t>(Uniform(2, 65535));
    m->shape = "version";
  }
}

std::string DriverReport::ToJson() const {
  nlohmann::ordered_json j;
  j["sent"] = sent;
  j["answered"] = answered;
  j["unanswered"] = unanswered;
  j["unexpected_replies"] = unexpected;
  j["max_latency_ms"] = max_latency_ms;
  j["reply_codes"] = codes;
  j["shapes"] = shapes;
  return j.dump();
}

StatusOr<std::unique_ptr<HostileDriver>> HostileDriver::Create(
    const DriverOptions& options) {
  std::unique_ptr<HostileDriver> d(new HostileDriver(options));
  ASSIGN_OR_RETURN(d->socket_,
                   ClientSocket::Connect(options.endpoint, options.transport));
  return d;
}

Status HostileDriver::Drain(milliseconds wait) {
  Message msg;
  ReplyHeader reply;
  while (true) {
    ASSIGN_OR_RETURN(bool got, socket_->Receive(&msg, wait));
    if (!got) break;
    wait = milliseconds(0);
    if (msg.frames.empty() ||
        !DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(),
                     &reply)
             .ok()) {
      ++report_.unexpected;
      continue;
    }
    auto it = in_flight_.find(reply.id);
    if (it == in_flight_.end()) {
      ++report_.unexpected;
      continue;
    }
    const double ms = std::chrono::duration<double, std::milli>(
                          SteadyClock::now() - it->second)
                          .count();
    report_.max_latency_ms = std::max(report_.max_latency_ms, ms);
    in_flight_.erase(it);
    ++report_.answered;
    ++report_.codes[StatusCodeName(reply.status.code())];
  }
  const auto now = SteadyClock::now();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (now - it->second > options_.deadline) {
      ++report_.unanswered;
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
  return Status::OK();
}

Status HostileDriver::Run(HostileGenerator& gen, int64_t messages,
                          const std::function<bool()>& keep_going) {
  HostileMessage m;
  std::vector<Frame> frames;
  for (int64_t i = 0; i < messages; ++i) {
    if (i % 1000 == 0 && keep_going && !keep_going()) break;
    while (static_cast<int>(in_flight_.size()) >= options_.window) {
      RETURN_IF_ERROR(Drain(milliseconds(50)));
    }
    gen.Next(&m);
    frames.clear();
    frames.push_back(Frame::Owned(EncodeRequest(m.header)));
    for (auto& f : m.frames) frames.push_back(Frame::Owned(std::move(f)));
    RETURN_IF_ERROR(socket_->Send(frames));
    in_flight_.emplace(m.header.id, SteadyClock::now());
    ++report_.sent;
    ++report_.shapes[m.shape];
    RETURN_IF_ERROR(Drain(milliseconds(0)));
  }
  const auto end = SteadyClock::now() + options_.deadline;
  while (!in_flight_.empty() && SteadyClock::now() < end) {
    RETURN_IF_ERROR(Drain(milliseconds(50)));
  }
  report_.unanswered += static_cast<int64_t>(in_flight_.size());
  in_flight_.clear();
  return Status::OK();
}

}  // namespace asyncps::fuzz
