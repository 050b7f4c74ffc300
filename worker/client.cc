#include "worker/client.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "common/etcd_client.h"
#include "common/hash.h"
#include "common/shm_segment.h"
#include "common/wire.h"
#include "compression/codec.h"
#include "worker/internal/rows_plan.h"

namespace asyncps::worker {

namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

// Sends heartbeats to every shard from its own thread and sockets.
class Heartbeater {
 public:
  Heartbeater(const ClientOptions& o, uint64_t incarnation)
      : options_(o), incarnation_(incarnation) {}
  ~Heartbeater() { Stop(); }

  Status Start() {
    // Every replica of a group: a backup that takes over knows this worker
    // is alive.
    for (const auto& group : options_.servers) {
      for (const auto& e : ParseReplicaGroup(group)) {
        ASSIGN_OR_RETURN(auto s, ClientSocket::Connect(e, options_.transport));
        sockets_.push_back(std::move(s));
      }
    }
    thread_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  // A shard that joined the fleet (elastic layouts) gets heartbeats too,
  // every replica of it when it is a replica group.
  Status Add(const std::string& group) {
    for (const auto& e : ParseReplicaGroup(group)) {
      ASSIGN_OR_RETURN(auto s, ClientSocket::Connect(e, options_.transport));
      std::lock_guard<std::mutex> l(mu_);
      added_.push_back(std::move(s));
    }
    return Status::OK();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    uint64_t id = uint64_t{1} << 63;
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      for (auto& s : added_) sockets_.push_back(std::move(s));
      added_.clear();
      l.unlock();
      RequestHeader h;
      h.kind = RequestKind::kHeartbeat;
      h.rank = options_.rank;
      h.incarnation = incarnation_;
      h.id = id++;
      auto bytes = EncodeRequest(h);
      Message drain;
      for (auto& s : sockets_) {
        std::vector<Frame> f{Frame::Copy(bytes.data(), bytes.size())};
        (void)s->Send(f);  // best effort: a full queue means the shard is away
        (void)s->TakeConnects();  // not needed here: keep the queue empty
        while (true) {            // discard replies
          auto got = s->Receive(&drain, milliseconds(0));
          if (!got.ok() || !*got) break;
        }
      }
      l.lock();
      cv_.wait_for(l, options_.heartbeat_interval, [this] { return stop_; });
    }
  }

  ClientOptions options_;
  uint64_t incarnation_;
  std::vector<std::unique_ptr<ClientSocket>> sockets_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<ClientSocket>> added_;  // GUARDED_BY(mu_)
};

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

class ClientImpl : public Client {
 public:
  explicit ClientImpl(const ClientOptions& o)
      : Client(o),
        incarnation_(RandomIncarnation()),
        cut_shards_(static_cast<int>(o.servers.size())) {}

  ~ClientImpl() override {
    if (heartbeater_) heartbeater_->Stop();
  }

  Status Init() {
    if (options_.servers.empty())
      return Status::InvalidArgument(
          "client needs at least one server endpoint");
    if (!options_.etcd_endpoints.empty()) {
      if (options_.etcd_prefix.empty() || options_.etcd_prefix[0] != '/')
        return Status::InvalidArgument("etcd_prefix must start with /");
      EtcdOptions eo;
      eo.endpoints = options_.etcd_endpoints;
      eo.security = options_.etcd_security;
      RETURN_IF_ERROR(EtcdClient::Create(eo).status());  // checks the URLs
    }
    if (!options_.transport.context)
      options_.transport.context = Context::Create(1);
    for (const auto& group : options_.servers) {
      RETURN_IF_ERROR(AddShardState(group));
    }
    if (options_.shared_memory_bytes > 0) {
      ASSIGN_OR_RETURN(
          shm_, ShmSegment::Create(options_.shared_memory_bytes,
                                   static_cast<uint32_t>(std::min<uint64_t>(
                                       uint64_t{kShmSlotsPerShard} *
                                           static_cast<uint64_t>(num_shards()),
                                       ShmSegment::kMaxSlots))));
    }
    if (options_.heartbeat_interval.count() > 0) {
      heartbeater_ = std::make_unique<Heartbeater>(options_, incarnation_);
      RETURN_IF_ERROR(heartbeater_->Start());
    }
    return Status::OK();
  }

  Status Register(const std::vector<TensorSpec>& tensors,
                  LayoutOptions layout) override {
    return RegisterModel(tensors, layout, {});
  }

  Status RegisterModel(const std::vector<TensorSpec>& tensors,
                       LayoutOptions layout,
                       const std::vector<TableSpec>& tables) override {
    layout.num_shards = cut_shards_;
    ASSIGN_OR_RETURN(Layout l, Layout::Create(tensors, layout));
    RETURN_IF_ERROR(ValidateTables(tables));
    if (options_.rows_codec >= compression::kNumCodecs ||
        compression::CodecForId(
            static_cast<compression::CodecId>(options_.rows_codec))
            .IsSparse()) {
      return Status::InvalidArgument("rows_codec must be a dense codec");
    }
    // The shards that own chunks or key ranges now (etcd's layout, when
    // there is one).
    ASSIGN_OR_RETURN(std::vector<int> targets, ShardsFromEtcd());
    RequestHeader h = NewHeader(RequestKind::kRegister);
    h.tensors = tensors;
    h.layout = layout;
    h.tables = tables;
    ASSIGN_OR_RETURN(Ticket t, StartOnShards(h, targets));
    TicketResult r;
    RETURN_IF_ERROR(Wait(t, options_.deadline, &r));
    // Registered before and routing by an elastic layout already: the
    // shards found the same model, keep that routing.
    if (layout_epoch_ == 0) SetLayout(std::move(l));
    tables_ = tables;
    if (!register_doc_.empty()) {
      // Shards joined or left since the fleet started: route by their
      // layout from the start.
      RETURN_IF_ERROR(AdoptLayout(register_doc_));
    }
    AttachShared();
    return Status::OK();
  }

  Status UseLayout(const std::vector<TensorSpec>& tensors,
                   LayoutOptions layout) override {
    layout.num_shards = cut_shards_;
    ASSIGN_OR_RETURN(Layout l, Layout::Create(tensors, layout));
    RETURN_IF_ERROR(ShardsFromEtcd().status());
    if (layout_epoch_ == 0) SetLayout(std::move(l));  // as RegisterModel
    if (!register_doc_.empty()) RETURN_IF_ERROR(AdoptLayout(register_doc_));
    AttachShared();
    return Status::OK();
  }

  const Layout& layout() const override { return *layout_; }
  const std::vector<TableSpec>& tables() const override { return tables_; }

  StatusOr<Ticket> StartPush(int64_t clock,
                             std::vector<ChunkPayload> chunks) override {
    return StartPushRows(clock, std::move(chunks), {});
  }

  StatusOr<Ticket> StartPushRows(int64_t clock,
                                 std::vector<ChunkPayload> chunks,
                                 const std::vector<RowsPush>& rows) override {
    if (!layout_) return Status::FailedPrecondition("push before Register()");
    internal::RowsPlan plan;
    if (!rows.empty()) {
      RETURN_IF_ERROR(
          plan.Build(tables_, num_shards(), Inputs(rows), /*push=*/true,
                     key_ranges_.get()));
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
      if (total > static_cast<uint64_t>(limit_bytes_[s]) ||
          largest > static_cast<uint64_t>(limit_frame_[s])) {
        return Status::InvalidArgument(
            "push of " + std::to_string(total) + " bytes (largest frame " +
            std::to_string(largest) + ") to shard " + std::to_string(s) +
            " exceeds its limits of " + std::to_string(limit_bytes_[s]) +
            " bytes per request and " + std::to_string(limit_frame_[s]) +
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
          sent.push_back(RowsSent{part.table, part.n, part.keys, part.grads, s, i, {}});
        }
        RETURN_IF_ERROR(AddRows(sent, /*push=*/true, &h, &frames));
      }
      RETURN_IF_ERROR(Enqueue(t, s, h, std::move(frames), std::move(sent)));
    }
    return t;
  }

  StatusOr<Ticket> StartPull(int64_t clock, const std::vector<float*>& tensors,
                             const std::string& codec) override {
    return StartPullRows(clock, tensors, {}, codec);
  }

  StatusOr<Ticket> StartPullRows(int64_t clock,
                                 const std::vector<float*>& tensors,
                                 const std::vector<RowsPull>& rows,
                                 const std::string& codec) override {
    if (!layout_) return Status::FailedPrecondition("pull before Register()");
    std::shared_ptr<internal::RowsPlan> plan;
    if (!rows.empty()) {
      plan = std::make_shared<internal::RowsPlan>();
      RETURN_IF_ERROR(
          plan->Build(tables_, num_shards(), Inputs(rows), /*push=*/false,
                      key_ranges_.get()));
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
    Ticket t = NewTicket();
    tickets_[t].pull_dst = tensors;
    tickets_[t].rows = plan;
    const bool raw = codec.empty() || codec == "none";
    for (int s = 0; s < num_shards(); ++s) {
      const bool has_rows = plan && !plan->parts(s).empty();
      if (!dense && !has_rows) continue;
      // A shard that owns no chunk (it left an elastic fleet) is not asked.
      if (!has_rows && layout_->shard_chunks(s).empty()) continue;
      h.pull_base_seq = pull_seq_[s];
      h.rows.clear();
      h.pull_chunks.clear();
      h.pull_shm_offsets.clear();
      if (dense && raw && !has_rows && ShmDestinations(s, tensors, &h)) {
        RETURN_IF_ERROR(Enqueue(t, s, h, std::vector<Frame>(1)));
        continue;
      }
      std::vector<Frame> frames(1);
      std::vector<RowsSent> sent;
      if (has_rows) {
        for (size_t i = 0; i < plan->parts(s).size(); ++i) {
          const internal::RowsPlan::Part& part = plan->parts(s)[i];
          sent.push_back(RowsSent{part.table, part.n, part.keys, nullptr, s, i, {}});
        }
        RETURN_IF_ERROR(AddRows(sent, /*push=*/false, &h, &frames));
      }
      RETURN_IF_ERROR(Enqueue(t, s, h, std::move(frames), std::move(sent)));
    }
    return t;
  }

  StatusOr<Ticket> StartPullChunks(int64_t clock,
                                   const std::vector<uint32_t>& chunks,
                                   const std::vector<float*>& tensors) override {
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
    Ticket t = NewTicket();
    tickets_[t].pull_dst = tensors;
    tickets_[t].pull_subset = by_shard;
    for (int s = 0; s < num_shards(); ++s) {
      if (by_shard[s].empty()) continue;
      h.pull_base_seq = pull_seq_[s];
      h.pull_chunks = by_shard[s];
      RETURN_IF_ERROR(Enqueue(t, s, h, std::vector<Frame>(1)));
    }
    return t;
  }

  StatusOr<Ticket> StartClock(int64_t clock) override {
    return StartClockShards(clock, AllShards());
  }

  // InvalidArgument unless every shard is in [0, num_shards()) and listed
  // once; `what` names the request.
  Status CheckShardList(const char* what, const std::vector<int>& shards) {
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

  StatusOr<Ticket> StartHeartbeatShards(
      const std::vector<int>& shards) override {
    RETURN_IF_ERROR(CheckShardList("heartbeat", shards));
    return StartOnShards(NewHeader(RequestKind::kHeartbeat), shards);
  }

  StatusOr<Ticket> StartClockShards(int64_t clock,
                                    const std::vector<int>& shards) override {
    RETURN_IF_ERROR(CheckShardList("clock", shards));
    RequestHeader h = NewHeader(RequestKind::kClock);
    h.clock = clock;
    ASSIGN_OR_RETURN(Ticket t, StartOnShards(h, shards));
    for (int s : shards)
      announced_clock_[s] = std::max(announced_clock_[s], clock);
    return t;
  }

  Status Wait(Ticket ticket, milliseconds timeout,
              TicketResult* result) override {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end())
      return Status::NotFound("unknown ticket " + std::to_string(ticket));
    auto deadline = std::min(it->second.deadline, SteadyClock::now() + timeout);
    const bool interruptible =
        options_.interrupt && options_.interrupt_poll.count() > 0;
    auto next_check = SteadyClock::now() + options_.interrupt_poll;
    while (true) {
      it = tickets_.find(ticket);
      if (it->second.remaining == 0) {
        Status s = it->second.status;
        if (result) *result = it->second.result;
        tickets_.erase(it);
        return s;
      }
      auto now = SteadyClock::now();
      if (now >= deadline) {
        std::string shards;
        for (const auto& [id, p] : pending_) {
          if (p.ticket == ticket)
            shards += (shards.empty() ? "" : ",") + options_.servers[p.shard];
        }
        Abandon(ticket);
        return Status::TimedOut("no reply from " + shards +
                                " before the deadline");
      }
      if (interruptible && now >= next_check) {
        Status stop = options_.interrupt();
        if (!stop.ok()) {
          Abandon(ticket);
          return stop;
        }
        next_check = now + options_.interrupt_poll;
      }
      RETURN_IF_ERROR(Pump(
          interruptible ? std::min(deadline, next_check) : deadline, ticket));
    }
  }

  Status WaitAll(milliseconds timeout) override {
    Status first;
    while (!tickets_.empty()) {
      Status s = Wait(tickets_.begin()->first, timeout, nullptr);
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  Status Stats(std::vector<std::string>* replies,
               milliseconds timeout) override {
    std::vector<std::string> texts(num_shards());
    stats_sink_ = &texts;
    Status s = Simple(RequestKind::kStats, timeout);
    stats_sink_ = nullptr;
    *replies = std::move(texts);
    return s;
  }

  Status Checkpoint(milliseconds timeout) override {
    return Simple(RequestKind::kCheckpoint, timeout);
  }
  Status Shutdown(milliseconds timeout) override {
    return Simple(RequestKind::kShutdown, timeout);
  }
  Status Heartbeat(milliseconds timeout) override {
    return Simple(RequestKind::kHeartbeat, timeout);
  }
  float* AllocateShared(size_t num_floats) override {
    if (!shm_ || num_floats > SIZE_MAX / sizeof(float)) return nullptr;
    return static_cast<float*>(shm_->Allocate(num_floats * sizeof(float)));
  }
  int shared_memory_shards() const override {
    return static_cast<int>(std::count(shm_ok_.begin(), shm_ok_.end(), true));
  }
  Status Assign(int shard, AssignRequest a, bool* claimed,
                milliseconds timeout) override {
    if (!layout_) return Status::FailedPrecondition("assign before Register()");
    if (shard < 0 || shard >= num_shards())
      return Status::InvalidArgument("assign to unknown shard " +
                                     std::to_string(shard));
    RequestHeader h = NewHeader(RequestKind::kAssign);
    h.assign_upload = a.upload;
    h.assign_phase = a.phase;
    h.assign_overwrite = a.overwrite;
    h.assign_optimizer = a.optimizer;
    std::vector<Frame> frames(1);
    for (ChunkPayload& p : a.chunks) {
      if (p.chunk >= layout_->chunks().size() ||
          layout_->chunks()[p.chunk].shard != shard) {
        return Status::InvalidArgument("assign of chunk " +
                                       std::to_string(p.chunk) +
                                       ", not held by shard " +
                                       std::to_string(shard));
      }
      ChunkRef ref;
      ref.chunk = p.chunk;
      ref.frame = static_cast<uint32_t>(frames.size());
      ref.num_elems = a.phase == AssignOp::kState
                          ? p.data.size / sizeof(float)  // state
                          : layout_->chunks()[p.chunk].num_elems;
      ref.byte_size = p.data.size;
      ref.version = p.version;
      h.chunks.push_back(ref);
      frames.push_back(std::move(p.data));
    }
    if (a.phase == AssignOp::kClear) {
      // Clear tables: refs naming them, no keys or frames.
      for (const RowsPush& rows : a.rows) {
        if (rows.table >= tables_.size() || rows.n != 0) {
          return Status::InvalidArgument(
              "clear of table " + std::to_string(rows.table) +
              ": unknown, or with keys");
        }
        RowsRef ref;
        ref.table = rows.table;
        h.rows.push_back(ref);
      }
      a.rows.clear();
    }
    const bool records =  // rows with state
        a.phase == AssignOp::kRows || a.phase == AssignOp::kSaved;
    if (records && a.row_records.size() != a.rows.size()) {
      return Status::InvalidArgument(
          "assign of rows with state: " + std::to_string(a.rows.size()) +
          " tables, " + std::to_string(a.row_records.size()) +
          " frames of records");
    }
    for (size_t i = 0; i < a.rows.size(); ++i) {
      const RowsPush& rows = a.rows[i];
      if (rows.table >= tables_.size()) {
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
                  : Frame::Copy(rows.grads, rows.n * tables_[rows.table].dim *
                                                sizeof(float)));
      h.rows.push_back(ref);
    }
    Ticket t = NewTicket();
    RETURN_IF_ERROR(Enqueue(t, shard, h, std::move(frames)));
    TicketResult r;
    RETURN_IF_ERROR(Wait(t, timeout, &r));
    if (claimed != nullptr) *claimed = r.created;
    return Status::OK();
  }
  Status ReadOptimizerState(OptimizerState* out,
                            milliseconds timeout) override {
    if (!layout_) return Status::FailedPrecondition("read before Register()");
    *out = OptimizerState{};
    out->per_weight = -1;  // set by the first reply
    RequestHeader h = NewHeader(RequestKind::kAssign);
    h.assign_upload = 1;
    h.assign_phase = AssignOp::kRead;
    state_sink_ = out;
    Status s = [&]() -> Status {
      ASSIGN_OR_RETURN(Ticket t, StartOnShards(h, AllShards()));
      return Wait(t, timeout, nullptr);
    }();
    state_sink_ = nullptr;
    if (out->per_weight < 0) out->per_weight = 0;
    return s;
  }
  Status ReadRowRecords(uint32_t table, const uint64_t* keys, size_t n,
                        uint8_t* out, milliseconds timeout) override {
    if (!layout_) return Status::FailedPrecondition("read before Register()");
    if (table >= tables_.size()) {
      return Status::NotFound("no sparse table " + std::to_string(table) +
                              " (" + std::to_string(tables_.size()) +
                              " registered)");
    }
    const TableSpec& spec = tables_[table];
    const size_t bytes = RowRecordBytes(spec);
    const size_t per_request =
        std::max<size_t>(1, std::min(kMaxReadKeys, (size_t{64} << 20) / bytes));
    std::vector<std::vector<size_t>> at(num_shards());
    for (size_t i = 0; i < n; ++i) at[ShardOfRow(table, keys[i])].push_back(i);
    std::vector<uint64_t> asked;
    for (int shard = 0; shard < num_shards(); ++shard) {
      for (size_t off = 0; off < at[shard].size(); off += per_request) {
        const size_t m = std::min(per_request, at[shard].size() - off);
        asked.resize(m);
        for (size_t j = 0; j < m; ++j) asked[j] = keys[at[shard][off + j]];
        RequestHeader h = NewHeader(RequestKind::kAssign);
        h.assign_upload = 1;
        h.assign_phase = AssignOp::kRead;
        RowsRef ref;
        ref.table = table;
        ref.keys_frame = 1;
        ref.num_keys = m;
        h.rows.push_back(ref);
        std::vector<Frame> frames(1);
        frames.push_back(Frame::Copy(asked.data(), m * sizeof(uint64_t)));
        records_sink_ =
            RecordsSink{table, at[shard].data() + off, m, bytes, out};
        Status s = [&]() -> Status {
          Ticket t = NewTicket();
          RETURN_IF_ERROR(Enqueue(t, shard, h, std::move(frames)));
          return Wait(t, timeout, nullptr);
        }();
        records_sink_ = RecordsSink{};
        RETURN_IF_ERROR(s.WithContext("reading rows of '" + spec.name +
                                      "' from shard " + std::to_string(shard)));
      }
    }
    return Status::OK();
  }
  Status ScanRows(int shard, uint32_t table, uint64_t from, size_t max_rows,
                  std::vector<uint64_t>* keys, std::vector<uint8_t>* records,
                  milliseconds timeout, uint64_t* snapshot) override {
    if (!layout_) return Status::FailedPrecondition("scan before Register()");
    if (table >= tables_.size()) {
      return Status::NotFound("no sparse table " + std::to_string(table) +
                              " (" + std::to_string(tables_.size()) +
                              " registered)");
    }
    if (shard < 0 || shard >= num_shards() || max_rows == 0 ||
        max_rows > UINT32_MAX) {
      return Status::InvalidArgument("scan of shard " + std::to_string(shard) +
                                     " in pages of " +
                                     std::to_string(max_rows) + " rows");
    }
    RequestHeader h = NewHeader(RequestKind::kAssign);
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
    scan_sink_ = ScanSink{table, from, max_rows,
                          SavedRecordBytes(tables_[table]), keys, records,
                          snapshot != nullptr,
                          snapshot != nullptr ? *snapshot : 0};
    Status s = [&]() -> Status {
      Ticket t = NewTicket();
      RETURN_IF_ERROR(Enqueue(t, shard, h, std::vector<Frame>(1)));
      return Wait(t, timeout, nullptr);
    }();
    if (s.ok() && snapshot != nullptr) *snapshot = scan_sink_.snapshot;
    scan_sink_ = ScanSink{};
    return s.WithContext("scan of the rows of '" + tables_[table].name +
                         "' on shard " + std::to_string(shard));
  }
  uint64_t layout_epoch() const override { return layout_epoch_; }
  uint64_t resends() const override { return resends_; }
  uint64_t failovers() const override { return failovers_; }
  uint64_t incarnation() const override { return incarnation_; }

 private:
  // One rows ref of a push or pull as sent, kept for a re-route: the keys
  // (and a push's fp32 gradients), and where pulled rows go: entries
  // `subset` (empty: all) of part plan_part of shard plan_shard's parts in
  // the ticket's RowsPlan.
  struct RowsSent {
    uint32_t table = 0;
    size_t n = 0;
    BufferPtr keys;
    BufferPtr grads;
    int plan_shard = 0;
    size_t plan_part = 0;
    std::vector<uint32_t> subset;
  };
  // One request to one shard, kept until its reply for resending.
  struct Pending {
    Ticket ticket = 0;
    int shard = 0;
    RequestKind kind = RequestKind::kHeartbeat;
    std::vector<Frame> frames;
    SteadyClock::time_point next_send;
    milliseconds backoff{0};
    bool shm = false;      // a pull into shared memory, slot shm_slot armed
    uint32_t shm_slot = 0;
    int shm_reattach = 0;  // times the shard was sent the segment again
    bool answered = false;  // a refusal came back since it was last sent
    // What a stale-layout refusal needs to send it again (Reroute): a
    // push's chunk refs (into frames), a pull's chunk ids, clock, codec.
    std::vector<ChunkRef> refs;
    std::vector<uint32_t> ids;
    int64_t clock = 0;
    std::string codec;
    bool has_rows = false;
    std::vector<RowsSent> rows;  // the rows refs sent, in order
  };
  struct DeferredClock {
    Ticket ticket = 0;
    int64_t clock = 0;
  };
  struct TicketState {
    int remaining = 0;
    Status status;
    TicketResult result;
    SteadyClock::time_point deadline;
    std::vector<float*> pull_dst;
    std::shared_ptr<internal::RowsPlan> rows;  // pulls of sparse rows
    // StartPullChunks: the chunks asked of each shard (else empty: all).
    std::vector<std::vector<uint32_t>> pull_subset;
  };

  // A push part's gradients as sent: fp32, or encoded with rows_codec.
  StatusOr<BufferPtr> EncodeRows(uint32_t table, const BufferPtr& grads,
                                 size_t n) {
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
  Status AddRows(const std::vector<RowsSent>& sent, bool push, RequestHeader* h,
                 std::vector<Frame>* frames) {
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

  int ShardOfRow(uint32_t table, uint64_t key) const override {
    const uint64_t h = HashName(tables_[table].name);
    return key_ranges_ ? key_ranges_->Owner(h, key)
                       : ShardOfKeyHashed(h, key, num_shards());
  }

  // Splits rows refused by a shard by the layout adopted since: per new
  // owner, the keys (and fp32 gradients) of each part, with the indices
  // into the plan's part they stand for.
  std::map<int, std::vector<RowsSent>> SplitRows(const std::vector<RowsSent>& rows) {
    std::map<int, std::vector<RowsSent>> out;
    for (const RowsSent& rs : rows) {
      const size_t dim = tables_[rs.table].dim;
      const uint64_t* keys = reinterpret_cast<const uint64_t*>(rs.keys->data());
      std::map<int, std::vector<uint32_t>> picked;  // shard -> indices in rs
      for (size_t j = 0; j < rs.n; ++j)
        picked[ShardOfRow(rs.table, keys[j])].push_back(static_cast<uint32_t>(j));
      for (const auto& [shard, idx] : picked) {
        RowsSent part{rs.table, idx.size(), Buffer::Allocate(idx.size() * sizeof(uint64_t)),
                      nullptr, rs.plan_shard, rs.plan_part, {}};
        uint64_t* k = reinterpret_cast<uint64_t*>(part.keys->data());
        if (rs.grads) part.grads = Buffer::Allocate(idx.size() * dim * sizeof(float));
        for (size_t i = 0; i < idx.size(); ++i) {
          k[i] = keys[idx[i]];
          if (rs.grads)
            std::memcpy(part.grads->floats() + i * dim, rs.grads->floats() + idx[i] * dim,
                        dim * sizeof(float));
          part.subset.push_back(rs.subset.empty() ? idx[i] : rs.subset[idx[i]]);
        }
        out[shard].push_back(std::move(part));
      }
    }
    return out;
  }

  RequestHeader NewHeader(RequestKind kind) {
    RequestHeader h;
    h.kind = kind;
    h.rank = options_.rank;
    h.incarnation = incarnation_;
    if (kind == RequestKind::kPush || kind == RequestKind::kClock) h.lr = lr_;
    h.layout_epoch = layout_epoch_;
    return h;
  }

  std::vector<int> AllShards() const {
    if (layout_epoch_ > 0) return active_;  // shards that left get nothing
    std::vector<int> v(num_shards());
    for (int i = 0; i < num_shards(); ++i) v[i] = i;
    return v;
  }

  Ticket NewTicket() {
    Ticket t = next_ticket_++;
    TicketState& st = tickets_[t];
    st.result.min_clock = INT64_MAX;
    st.deadline = SteadyClock::now() + options_.deadline;
    return t;
  }

  StatusOr<Ticket> StartOnShards(const RequestHeader& base,
                                 const std::vector<int>& shards) {
    Ticket t = NewTicket();
    for (int s : shards) {
      RETURN_IF_ERROR(Enqueue(t, s, base, std::vector<Frame>(1)));
    }
    return t;
  }

  Status Enqueue(Ticket t, int shard, RequestHeader h,
                 std::vector<Frame> frames, std::vector<RowsSent> rows = {}) {
    if (pending_.size() >= options_.max_in_flight) {
      Abandon(t);
      return Status::ResourceExhausted("more than " +
                                       std::to_string(options_.max_in_flight) +
                                       " requests in flight");
    }
    h.id = next_id_++;
    const bool shm = !h.pull_shm_offsets.empty();
    // Armed before it can leave: the shard writes only into an armed slot.
    if (shm) shm_->Arm(h.pull_shm_slot, h.id);
    if (h.kind == RequestKind::kPush) {
      // Every push to this shard below the oldest one still pending is
      // finished: the shard may forget those ids (pending_ is in id order).
      h.done_below = h.id;
      for (const auto& [id, p] : pending_) {
        if (p.kind == RequestKind::kPush && p.shard == shard) {
          h.done_below = id;
          break;
        }
      }
    }
    frames[0] = Frame::Owned(EncodeRequest(h));
    Pending p;
    p.ticket = t;
    p.shard = shard;
    p.kind = h.kind;
    p.clock = h.clock;
    p.has_rows = !h.rows.empty();
    p.rows = std::move(rows);
    if (h.kind == RequestKind::kPush) {
      p.refs = h.chunks;
    } else if (h.kind == RequestKind::kPull && h.pull_dense) {
      p.codec = h.pull_codec;
      if (h.pull_chunks.empty() && layout_) {
        const auto& ids = layout_->shard_chunks(shard);
        p.ids.assign(ids.begin(), ids.end());
      } else {
        p.ids = h.pull_chunks;
      }
    }
    p.frames = std::move(frames);
    p.backoff = options_.attempt_timeout;
    p.next_send = SteadyClock::now() + p.backoff;
    p.shm = shm;
    p.shm_slot = h.pull_shm_slot;
    // Recorded before it can leave: a process killed in between has logged
    // a push that may not have been sent, never sent one it did not log.
    if (h.kind == RequestKind::kPush && options_.on_push) {
      options_.on_push(shard, h.id, false);
    }
    Status s = Send(p);
    if (!s.ok() && !s.IsRetryable()) {
      if (shm) DisarmShm(h.pull_shm_slot, h.id);
      Abandon(t);
      return s;
    }
    pending_.emplace(h.id, std::move(p));
    tickets_[t].remaining++;
    return Status::OK();
  }

  Status Send(Pending& p) {
    // Frames are shared, so a resend costs no copy of the payload.
    std::vector<Frame> copy = p.frames;
    p.answered = false;
    return sockets_[p.shard]->Send(copy);
  }

  // A heartbeat on the shard's own connection, at most once per attempt:
  // its answer (dropped as a late reply) shows the member is alive.
  void Probe(int shard, SteadyClock::time_point now) {
    if (probed_at_[shard] > last_reply_at_[shard]) return;  // one unanswered
    probed_at_[shard] = now;
    RequestHeader h = NewHeader(RequestKind::kHeartbeat);
    h.id = kProbeIds | next_id_++;
    std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
    (void)sockets_[shard]->Send(frames);
  }

  // Replica groups: the index of `endpoint` among the shard's members (added
  // when the group grew since the list was given).
  // True when a redirect of shard `shard`'s replica group to `endpoint`
  // may be followed: the endpoint is a member of the group this client was
  // given (ClientOptions::servers, an elastic layout document), or, with
  // etcd, a live member of the group in etcd (a replacement). A reply's
  // redirect is only what a peer says: followed anywhere, a hostile or
  // stale shard could send this worker's gradients to any process (and
  // take its pulls). Refusals are cached for a few seconds: no etcd read
  // per reply.
  bool RedirectInLayout(int shard, const std::string& endpoint,
                        SteadyClock::time_point now) {
    const auto& m = members_[shard];
    if (std::find(m.begin(), m.end(), endpoint) != m.end()) return true;
    auto refused = refused_redirects_.find(endpoint);
    if (refused != refused_redirects_.end() && now < refused->second) return false;
    bool member = false;
    if (!options_.etcd_endpoints.empty()) {
      EtcdOptions eo;
      eo.endpoints = options_.etcd_endpoints;
      eo.security = options_.etcd_security;
      eo.request_timeout = milliseconds(500);
      StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(eo);
      StatusOr<std::vector<EtcdKeyValue>> kvs =
          etcd.ok() ? (*etcd)->GetPrefix(options_.etcd_prefix + "/members/")
                    : StatusOr<std::vector<EtcdKeyValue>>(etcd.status());
      for (size_t i = 0; kvs.ok() && i < kvs->size() && !member; ++i) {
        nlohmann::json j = nlohmann::json::parse((*kvs)[i].value, nullptr, false);
        member = j.is_object() && j.value("endpoint", std::string()) == endpoint &&
                 j.value("group", -1) == shard;
      }
    }
    if (!member) {
      LOG_EVERY_N(WARNING, 20)
          << "shard " << shard << ": a redirect to " << endpoint
          << " is not followed: not a member of its replica group"
          << (options_.etcd_endpoints.empty() ? " as given (--servers)"
                                              : " in etcd");
      refused_redirects_[endpoint] = now + kRefusedRedirectFor;
      if (refused_redirects_.size() > 1024) refused_redirects_.clear();
    }
    return member;
  }

  size_t MemberIndex(int shard, const std::string& endpoint) {
    auto& m = members_[shard];
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i] == endpoint) return i;
    m.push_back(endpoint);
    return m.size() - 1;
  }
  size_t NextMember(int shard) const {
    return (current_[shard] + 1) % members_[shard].size();
  }

  // Talks to member `next` of the shard's replica group from now on: a new
  // connection, the highest clock announced again, then every request in
  // flight to the shard resent (the new primary applies each push once:
  // it holds the de-duplication table the old one replicated to it).
  void FailOver(int shard, size_t next) {
    if (next == current_[shard]) return;
    const std::string& to = members_[shard][next];
    StatusOr<std::unique_ptr<ClientSocket>> s =
        ClientSocket::Connect(to, options_.transport);
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 20) << "shard " << shard << ": connecting to " << to
                               << ": " << s.status().ToString();
      return;
    }
    LOG(INFO) << "shard " << shard << ": " << members_[shard][current_[shard]]
              << " -> " << to;
    sockets_[shard] = std::move(*s);
    sockets_[shard]->SetMaxMessageBytes(reply_limit_[shard]);
    raw_sockets_[shard] = sockets_[shard].get();
    current_[shard] = next;
    last_reply_at_[shard] = SteadyClock::now();  // a new member's own chance
    connects_[shard] = 0;  // this socket's first connection resends nothing
    ++failovers_;
    shm_ok_[shard] = false;  // another process: attached again if refused
    Reannounce(shard);
    ResendAll(shard);
  }

  void Abandon(Ticket t) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.ticket != t) {
        ++it;
        continue;
      }
      // After this, the shard writes nothing more into the buffers.
      if (it->second.shm) DisarmShm(it->second.shm_slot, it->first);
      it = pending_.erase(it);
    }
    auto it = tickets_.find(t);
    if (it != tickets_.end()) tickets_.erase(it);
  }

  // Receives replies until one arrives or `until` passes; resends requests
  // whose attempt timed out. Stops reading once `awaited` is complete.
  Status Pump(SteadyClock::time_point until, Ticket awaited) {
    auto now = SteadyClock::now();
    auto wake = until;
    // Replica groups: a member that has answered nothing for half an
    // attempt while requests wait on it is probed (a pull may just be
    // parked, waiting for the consistency bound); one that leaves its probe
    // unanswered for another half is gone: the next member of its group
    // gets every pending request of the shard.
    const auto half = options_.attempt_timeout / 2;
    for (auto& [id, p] : pending_) {
      const int s = p.shard;
      if (members_[s].size() < 2 || p.answered) continue;
      if (probed_at_[s] > last_reply_at_[s] && now - probed_at_[s] >= half) {
        abandoned_[s] = current_[s];
        abandoned_at_[s] = now;
        FailOver(s, NextMember(s));
        wake = now;
        break;
      }
      if (now - last_reply_at_[s] >= half) Probe(s, now);
      wake = std::min(wake, (probed_at_[s] > last_reply_at_[s] ? probed_at_[s]
                                                               : last_reply_at_[s]) +
                                half);
    }
    for (auto& [id, p] : pending_) {
      if (p.next_send <= now) {
        if (Send(p).ok()) ++resends_;
        p.backoff = std::min(p.backoff * 2, options_.max_backoff);
        p.next_send = now + p.backoff;
        VLOG(1) << "resending " << RequestKindName(p.kind) << " " << id
                << " to shard " << p.shard;
      }
      wake = std::min(wake, p.next_send);
    }
    // Replies already queued are taken first: no poll() system call while
    // they keep arriving. Reading the queues dry also lets PollAny wait in
    // one system call (zmq_poll polls once without waiting and asks each
    // socket and its monitor for events, a system call each, before and
    // after the wait). Connection events are read after every wait and
    // every kConnectCheckEvery rounds.
    if (++pump_rounds_ % kConnectCheckEvery == 0) ReadConnectionEvents();
    ASSIGN_OR_RETURN(size_t got, DrainReplies(awaited));
    if (got > 0) return Status::OK();
    auto wait = std::chrono::duration_cast<milliseconds>(wake - now);
    if (wait.count() < 0) wait = milliseconds(0);
    ASSIGN_OR_RETURN(
        int ready, ClientSocket::PollAny(raw_sockets_, wait + milliseconds(1)));
    if (ready < 0) return Status::OK();
    ReadConnectionEvents();
    return DrainReplies(awaited).status();
  }

  // Reads every socket's connection events: a shard that connected again
  // (it restarted) gets the clock announced again, the shared-memory segment
  // and every pending request resent.
  void ReadConnectionEvents() {
    for (size_t s = 0; s < sockets_.size(); ++s) {
      const int connects = sockets_[s]->TakeConnects();
      if (connects > 0 && connects_[s]++ > 0) {
        Reannounce(static_cast<int>(s));
        // A restarted shard has forgotten the segment: before the resends.
        if (shm_ok_[s]) SendAttach(static_cast<int>(s));
        ResendAll(static_cast<int>(s));
      }
    }
  }

  // Handles every reply queued on any socket, or those until `awaited` is
  // complete (the caller returns to its own work without another look at
  // the queues, a system call when they are empty); returns how many.
  StatusOr<size_t> DrainReplies(Ticket awaited) {
    size_t n = 0;
    for (size_t s = 0; s < sockets_.size(); ++s) {
      while (true) {
        ASSIGN_OR_RETURN(bool got,
                         sockets_[s]->Receive(&msg_, milliseconds(0)));
        if (!got) break;
        HandleReply(static_cast<int>(s));
        ++n;
        auto it = tickets_.find(awaited);
        if (it == tickets_.end() || it->second.remaining == 0) return n;
      }
    }
    return n;
  }

  // The shard is reachable again after a lost connection (it restarted):
  // whatever was in flight on the old connection is resent now, oldest
  // first, rather than when its attempt times out. Messages the socket still
  // held go out before these resends, so pushes may arrive out of order:
  // the shard applies each exactly once whatever the order; a duplicate
  // reply is dropped as a late one.
  void ResendAll(int shard) {
    const auto now = SteadyClock::now();
    for (auto& [id, p] : pending_) {
      if (p.shard != shard) continue;
      if (Send(p).ok()) ++resends_;
      p.backoff = options_.attempt_timeout;
      p.next_send = now + p.backoff;
    }
    VLOG(1) << "shard " << shard << " reconnected: resent its requests";
  }

  // A restarted shard without --durable recovers the clocks of its last
  // checkpoint: a clock this worker announced (and had acknowledged) since
  // then is gone, and the pull the worker now waits for would wait for it
  // forever under BSP/SSP. So the highest clock announced goes to the shard
  // again, ahead of the resends. Fire and forget: a shard that restarts again
  // gets it again; a reply is dropped as a late one; clocks never go back.
  void Reannounce(int shard) {
    if (options_.rank < 0 || announced_clock_[shard] < 0) return;
    // Never past a push still in flight: a clock of c tells the shard that
    // this worker's pushes of steps < c are there (under BSP it closes the
    // round), and a push re-routed by an elastic layout change may come
    // after this.
    int64_t clock = announced_clock_[shard];
    for (const auto& [id, p] : pending_) {
      if (p.kind == RequestKind::kPush) clock = std::min(clock, p.clock);
    }
    RequestHeader h = NewHeader(RequestKind::kClock);
    h.clock = clock;
    h.id = next_id_++;
    std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
    if (sockets_[shard]->Send(frames).ok()) ++resends_;
    VLOG(1) << "shard " << shard << " reconnected: clock " << clock
            << " announced again";
  }

  void HandleReply(int shard) {
    if (msg_.frames.empty()) return;
    Status st =
        DecodeReply(msg_.frames[0].data, msg_.frames[0].size, {}, &reply_);
    if (!st.ok()) {
      LOG(WARNING) << "undecodable reply from shard " << shard << ": "
                   << st.ToString();
      return;
    }
    last_reply_at_[shard] = SteadyClock::now();
    if (reply_.max_request_bytes > 0) {
      limit_bytes_[shard] = static_cast<int64_t>(
          std::min<uint64_t>(reply_.max_request_bytes, INT64_MAX));
    }
    if (reply_.max_frame_bytes > 0) {
      limit_frame_[shard] = static_cast<int64_t>(
          std::min<uint64_t>(reply_.max_frame_bytes, INT64_MAX));
    }
    auto pit = pending_.find(reply_.id);
    if (pit == pending_.end() || pit->second.shard != shard)
      return;  // late duplicate
    Pending& p = pit->second;
    if (reply_.status.code() == StatusCode::kUnavailable &&
        reply_.epoch > 0) {
      // A replica that is not its group's primary (or one whose group is
      // changing): go where it says the primary is, unless that is the
      // member this client just left for silence (its lease has not ended
      // yet: the group is about to fail over); else ask again shortly.
      const auto now = SteadyClock::now();
      if (!reply_.redirect.empty() &&
          reply_.redirect != members_[shard][current_[shard]] &&
          RedirectInLayout(shard, reply_.redirect, now)) {
        const size_t to = MemberIndex(shard, reply_.redirect);
        if (to != abandoned_[shard] ||
            now - abandoned_at_[shard] > kAbandonedFor) {
          FailOver(shard, to);
          return;
        }
      }
      p.next_send = now + std::min(p.backoff, kReplicaRetry);
      p.answered = true;  // the member is there: not a reason to leave it
      return;
    }
    if (reply_.status.code() == StatusCode::kFailedPrecondition &&
        !reply_.layout_doc.empty()) {
      Reroute(pit);
      return;
    }
    if (reply_.status.code() == StatusCode::kUnavailable && reply_.retry_ms > 0) {
      // The shard asks again shortly (chunks are moving): not a failure.
      p.next_send = SteadyClock::now() +
                    std::min<milliseconds>(p.backoff, milliseconds(reply_.retry_ms));
      p.answered = true;
      return;
    }
    if (p.shm && !reply_.status.ok() && ShmRetry(shard, p)) return;
    if (reply_.status.code() == StatusCode::kUnavailable ||
        reply_.status.code() == StatusCode::kResourceExhausted) {
      p.next_send =
          SteadyClock::now() + p.backoff;  // shard busy or recovering: retry
      return;
    }
    TicketState& t = tickets_[p.ticket];
    Status s;
    if (p.shm && shm_->IsDone(p.shm_slot, reply_.id)) {
      // The weights are in place, whatever the reply says: a resend of a
      // pull answered before (its reply lost) is refused as not awaited.
      s = reply_.status.ok() ? Absorb(shard, p, t) : Status::OK();
    } else if (p.shm && reply_.status.ok()) {
      s = Status::Corruption("shard answered a shared-memory pull without "
                             "writing it");
    } else {
      s = reply_.status.ok() ? Absorb(shard, p, t) : reply_.status;
    }
    if (p.shm) DisarmShm(p.shm_slot, reply_.id);
    if (s.ok() && p.kind == RequestKind::kRegister && !reply_.layout_doc.empty()) {
      KeepNewestDoc(reply_.layout_doc);
    }
    if (s.ok() && p.kind == RequestKind::kPush && options_.on_push) {
      options_.on_push(shard, reply_.id, true);
    }
    if (!s.ok() && t.status.ok())
      t.status = s.WithContext("shard " + std::to_string(shard));
    t.remaining--;
    const bool push = p.kind == RequestKind::kPush;
    pending_.erase(pit);
    if (push && !deferred_clocks_.empty()) FlushDeferredClocks();
  }

  // A shard's optimizer state (ReadOptimizerState): every chunk ref checked
  // against the layout before anything is written into state_sink_.
  Status AbsorbState(int shard) {
    const auto& owned = layout_->shard_chunks(shard);
    if (reply_.chunks.size() != owned.size()) {
      return Status::Corruption("optimizer state of " +
                                std::to_string(reply_.chunks.size()) +
                                " chunks, expected " +
                                std::to_string(owned.size()));
    }
    int k = state_sink_->per_weight;
    for (size_t i = 0; i < owned.size(); ++i) {
      const ChunkRef& c = reply_.chunks[i];
      const uint64_t n = layout_->chunks()[owned[i]].num_elems;
      if (c.chunk != owned[i] || c.frame < 1 || c.frame >= msg_.frames.size() ||
          n == 0 || c.num_elems % n != 0 || c.num_elems / n > 64 ||
          (k >= 0 && c.num_elems / n != static_cast<uint64_t>(k)) ||
          c.byte_size != c.num_elems * sizeof(float) ||
          c.byte_size != msg_.frames[c.frame].size) {
        return Status::Corruption("bad optimizer state ref for chunk " +
                                  std::to_string(c.chunk));
      }
      k = static_cast<int>(c.num_elems / n);
    }
    if (k < 0) return Status::OK();  // a shard without chunks
    OptimizerState& st = *state_sink_;
    if (st.per_weight < 0) {
      st.per_weight = k;
      st.slots.assign(k, {});
      for (auto& slot : st.slots) {
        for (const TensorSpec& t : layout_->tensors())
          slot.emplace_back(t.num_elements(), 0.0f);
      }
    }
    for (const ChunkRef& c : reply_.chunks) {
      const ChunkSpec& spec = layout_->chunks()[c.chunk];
      const uint8_t* src = msg_.frames[c.frame].data;
      for (int j = 0; j < k; ++j) {
        std::memcpy(st.slots[j][spec.tensor].data() + spec.offset,
                    src + j * spec.num_elems * sizeof(float),
                    spec.num_elems * sizeof(float));
      }
      st.steps = std::max(st.steps, c.version);
      st.chunk_steps.resize(layout_->chunks().size(), 0);
      st.chunk_steps[c.chunk] = c.version;
    }
    return Status::OK();
  }

  // Row records (ReadRowRecords): the reply's one rows ref checked against
  // the request before anything is written into records_sink_.
  Status AbsorbRecords() {
    const RecordsSink& k = records_sink_;
    const RowsRef* r = reply_.rows.size() == 1 ? &reply_.rows[0] : nullptr;
    if (r == nullptr || !reply_.chunks.empty() || r->table != k.table ||
        r->num_keys != k.n || r->codec != 0 || r->rows_frame < 1 ||
        r->rows_frame >= msg_.frames.size() ||
        msg_.frames[r->rows_frame].size != k.n * k.bytes) {
      return Status::Corruption("bad reply to a read of row records");
    }
    const uint8_t* src = msg_.frames[r->rows_frame].data;
    for (size_t j = 0; j < k.n; ++j)
      std::memcpy(k.out + k.at[j] * k.bytes, src + j * k.bytes, k.bytes);
    return Status::OK();
  }

  // A page of a scan (ScanRows): the reply's one rows ref checked (sizes,
  // keys increasing from the cursor) before anything is appended.
  Status AbsorbScan() {
    ScanSink& k = scan_sink_;
    const RowsRef* r = reply_.rows.size() == 1 ? &reply_.rows[0] : nullptr;
    const size_t frames = msg_.frames.size();
    if (r == nullptr || !reply_.chunks.empty() || r->table != k.table ||
        r->num_keys > k.max || r->codec != 0 || r->keys_frame < 1 ||
        r->keys_frame >= frames || r->rows_frame < 1 ||
        r->rows_frame >= frames || r->keys_frame == r->rows_frame ||
        msg_.frames[r->keys_frame].size != r->num_keys * sizeof(uint64_t) ||
        msg_.frames[r->rows_frame].size != r->num_keys * k.bytes) {
      return Status::Corruption("bad reply to a scan of rows");
    }
    // A page of a point-in-time scan names it: the one asked for, or a
    // new one when this page opened it.
    if (k.point_in_time
            ? reply_.scan_snapshot == 0 ||
                  (k.snapshot != 0 && reply_.scan_snapshot != k.snapshot)
            : reply_.scan_snapshot != 0) {
      return Status::Corruption(
          "a page of point-in-time scan " + std::to_string(k.snapshot) +
          " (0: to open) named scan " + std::to_string(reply_.scan_snapshot));
    }
    const uint8_t* src = msg_.frames[r->keys_frame].data;
    const size_t at = k.keys->size();
    k.keys->resize(at + r->num_keys);
    std::memcpy(k.keys->data() + at, src, r->num_keys * sizeof(uint64_t));
    for (size_t j = at; j < k.keys->size(); ++j) {
      if ((*k.keys)[j] < (j == at ? k.from : (*k.keys)[j - 1] + 1)) {
        k.keys->resize(at);
        return Status::Corruption("a scan of rows answered keys out of order");
      }
    }
    const uint8_t* rec = msg_.frames[r->rows_frame].data;
    k.records->insert(k.records->end(), rec, rec + r->num_keys * k.bytes);
    k.snapshot = reply_.scan_snapshot;
    return Status::OK();
  }

  // Folds a successful reply into its ticket.
  Status Absorb(int shard, const Pending& p, TicketState& t) {
    t.result.max_staleness = std::max(t.result.max_staleness, reply_.staleness);
    t.result.min_clock = std::min(t.result.min_clock, reply_.min_clock);
    t.result.created = t.result.created || reply_.created;
    if (p.kind == RequestKind::kStats && stats_sink_ != nullptr) {
      (*stats_sink_)[shard] = reply_.text;
    }
    if (p.kind == RequestKind::kAssign && state_sink_ != nullptr)
      return AbsorbState(shard);
    if (p.kind == RequestKind::kAssign && records_sink_.out != nullptr)
      return AbsorbRecords();
    if (p.kind == RequestKind::kAssign && scan_sink_.keys != nullptr)
      return AbsorbScan();
    if (p.kind != RequestKind::kPull) return Status::OK();
    // Validate every chunk ref and rows ref before writing anything.
    RETURN_IF_ERROR(CheckPulledRows(p));
    static const std::vector<uint32_t> kNoChunks;
    // The chunks asked for when it was sent (the layout may have changed
    // since: elastic shards), each answered once.
    const auto& owned = t.pull_dst.empty() && t.rows ? kNoChunks : p.ids;
    if (reply_.chunks.size() != owned.size()) {
      return Status::Corruption(
          "pull reply has " + std::to_string(reply_.chunks.size()) +
          " chunks, expected " + std::to_string(owned.size()));
    }
    if (p.shm) return AbsorbShm(shard, p, t);
    chunk_mark_.resize(layout_->chunks().size(), 0);
    mark_ += 2;
    for (uint32_t id : owned) chunk_mark_[id] = mark_;
    for (const ChunkRef& c : reply_.chunks) {
      if (c.chunk >= layout_->chunks().size() || chunk_mark_[c.chunk] != mark_ ||
          c.num_elems != layout_->chunks()[c.chunk].num_elems || c.frame == 0 ||
          c.frame >= msg_.frames.size() ||
          c.byte_size != msg_.frames[c.frame].size) {
        return Status::Corruption(
            "pull reply has an inconsistent chunk ref for chunk " +
            std::to_string(c.chunk));
      }
      chunk_mark_[c.chunk] = mark_ + 1;  // a second ref to it fails above
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
        const ByteView& f = msg_.frames[c.frame];
        Status v =
            compression::CodecForId(static_cast<compression::CodecId>(c.codec))
                .Validate(f.data, f.size, c.num_elems);
        if (!v.ok()) return Status::Corruption(v.message());
      }
    }
    for (const ChunkRef& c : reply_.chunks) {
      const ChunkSpec& spec = layout_->chunks()[c.chunk];
      float* dst = t.pull_dst[spec.tensor] + spec.offset;
      const ByteView& f = msg_.frames[c.frame];
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
      t.result.bytes_received += f.size;
    }
    if (reply_.pull_seq != 0) pull_seq_[shard] = reply_.pull_seq;
    for (size_t i = 0; i < reply_.rows.size(); ++i) {
      const RowsRef& r = reply_.rows[i];
      const ByteView& f = msg_.frames[r.rows_frame];
      if (r.codec == 0 &&
          reinterpret_cast<uintptr_t>(f.data) % alignof(float) == 0) {
        ScatterRows(t, p.rows[i], reinterpret_cast<const float*>(f.data));
      } else {
        // Unaligned fp32 (frames may sit anywhere in a message) or a codec.
        rows_scratch_.resize(r.num_keys * tables_[r.table].dim);
        if (r.codec == 0) {
          std::memcpy(rows_scratch_.data(), f.data, f.size);
        } else {
          RETURN_IF_ERROR(compression::CodecForId(
                              static_cast<compression::CodecId>(r.codec))
                              .Decode(f.data, f.size, rows_scratch_.size(),
                                      rows_scratch_.data()));
        }
        ScatterRows(t, p.rows[i], rows_scratch_.data());
      }
      t.result.bytes_received += f.size;
    }
    return Status::OK();
  }

  void ScatterRows(TicketState& t, const RowsSent& rs, const float* rows) {
    if (rs.subset.empty()) {
      t.rows->Scatter(rs.plan_shard, rs.plan_part, rows);
    } else {
      t.rows->ScatterSubset(rs.plan_shard, rs.plan_part, rs.subset, rows);
    }
  }

  // A pull answered in shared memory: the shard wrote every chunk of the
  // shard where the request said; check that the reply says so.
  Status AbsorbShm(int shard, const Pending& p, TicketState& t) {
    (void)shard;
    const auto& owned = p.ids;
    if (reply_.chunks.size() != owned.size() || !reply_.rows.empty()) {
      return Status::Corruption("shared-memory pull reply has " +
                                std::to_string(reply_.chunks.size()) +
                                " chunks, expected " +
                                std::to_string(owned.size()));
    }
    for (size_t i = 0; i < owned.size(); ++i) {
      const ChunkRef& c = reply_.chunks[i];
      const uint64_t n = layout_->chunks()[owned[i]].num_elems;
      if (c.chunk != owned[i] || c.frame != 0 || c.codec != 0 ||
          c.num_elems != n || c.byte_size != n * sizeof(float)) {
        return Status::Corruption(
            "shared-memory pull reply has an inconsistent chunk ref for "
            "chunk " + std::to_string(c.chunk));
      }
      t.result.bytes_received += c.byte_size;
    }
    return Status::OK();
  }

  // Fills h with a pull of every chunk of `shard` into shared memory, if
  // that shard has the segment, one of its kShmSlotsPerShard slots is free
  // (so many such pulls per shard at a time) and every destination lies in
  // the segment.
  bool ShmDestinations(int shard, const std::vector<float*>& tensors,
                       RequestHeader* h) {
    if (!shm_ || !shm_ok_[shard]) return false;
    const uint64_t first = uint64_t{kShmSlotsPerShard} * shard;
    bool found = false;
    for (uint64_t i = first;
         i < first + kShmSlotsPerShard && i < shm_->num_slots() && !found; ++i) {
      if (shm_->IsFree(static_cast<uint32_t>(i))) {
        h->pull_shm_slot = static_cast<uint32_t>(i);
        found = true;
      }
    }
    if (!found) return false;
    const auto& ids = layout_->shard_chunks(shard);
    h->pull_chunks.assign(ids.begin(), ids.end());
    h->pull_shm_offsets.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const ChunkSpec& spec = layout_->chunks()[ids[i]];
      if (!shm_->Contains(tensors[spec.tensor] + spec.offset,
                          spec.num_elems * sizeof(float),
                          &h->pull_shm_offsets[i])) {
        h->pull_chunks.clear();
        h->pull_shm_offsets.clear();
        return false;
      }
    }
    return !ids.empty();
  }

  // Frees a slot; if its shard is writing it right now, waits for it to
  // finish first (bounded: a shard that died mid-write never will).
  void DisarmShm(uint32_t slot, uint64_t id) {
    if (!shm_->Disarm(slot, id, milliseconds(5000))) {
      LOG(WARNING) << "a shard claimed shared-memory pull " << id
                   << " and did not finish writing it within 5 s";
    }
  }

  // A shard that lost the segment (restarted, or dropped it for newer
  // clients) refuses a pull into it with FailedPrecondition: send the
  // segment again, then the pull (once). True when the reply was handled so.
  bool ShmRetry(int shard, Pending& p) {
    if (reply_.status.code() != StatusCode::kFailedPrecondition ||
        p.shm_reattach > 0 || !shm_ok_[shard])
      return false;
    ++p.shm_reattach;
    SendAttach(shard);
    if (Send(p).ok()) ++resends_;
    p.next_send = SteadyClock::now() + p.backoff;
    return true;
  }

  RequestHeader AttachHeader() {
    RequestHeader h = NewHeader(RequestKind::kAttachShm);
    h.shm_pid = shm_->pid();
    h.shm_fd = shm_->fd();
    h.shm_size = shm_->size();
    h.shm_token = shm_->token();
    return h;
  }

  // Fire and forget (its reply is dropped as a late one).
  void SendAttach(int shard) {
    RequestHeader h = AttachHeader();
    h.id = next_id_++;
    std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
    (void)sockets_[shard]->Send(frames);
  }

  // Offers the segment to every shard; those that accept it (on this host,
  // same user, shared memory on) get pulls into it.
  void AttachShared() {
    if (!shm_) return;
    for (int s = 0; s < num_shards(); ++s) {
      if (shm_ok_[s]) continue;
      StatusOr<Ticket> t = StartOnShards(AttachHeader(), {s});
      Status st = t.ok() ? Wait(*t, options_.attempt_timeout * 2, nullptr)
                         : t.status();
      shm_ok_[s] = st.ok();
      if (!st.ok()) {
        LOG(INFO) << "shard " << s << " (" << options_.servers[s]
                  << ") pulls over its socket, not shared memory: "
                  << st.ToString();
      }
    }
  }

  // A pull reply's rows refs: one per part sent to this shard, in order,
  // each with its frame of part.n rows.
  Status CheckPulledRows(const Pending& p) {
    const size_t want = p.rows.size();
    if (reply_.rows.size() != want) {
      return Status::Corruption("pull reply has rows of " +
                                std::to_string(reply_.rows.size()) +
                                " tables, expected " + std::to_string(want));
    }
    for (size_t i = 0; i < want; ++i) {
      const RowsRef& r = reply_.rows[i];
      const RowsSent& part = p.rows[i];
      if (r.table != part.table || r.num_keys != part.n || r.rows_frame == 0 ||
          r.rows_frame >= msg_.frames.size()) {
        return Status::Corruption("pull reply has an inconsistent rows ref");
      }
      const ByteView& f = msg_.frames[r.rows_frame];
      const size_t values = part.n * tables_[part.table].dim;
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

  // Keeps `l` and lets every socket receive the largest reply a pull of it
  // can bring: each chunk once, through the widest pull codec (top-k with
  // ratio 1: an index and a value per element), plus headers.
  // The per-shard state of one more shard (a replica group's members
  // joined by '|'), connected to its first member.
  Status AddShardState(const std::string& group) {
    members_.push_back(ParseReplicaGroup(group));
    if (members_.back().empty())
      return Status::InvalidArgument("empty replica group '" + group + "'");
    current_.push_back(0);
    abandoned_.push_back(SIZE_MAX);
    abandoned_at_.push_back(SteadyClock::time_point{});
    last_reply_at_.push_back(SteadyClock::now());
    probed_at_.push_back(SteadyClock::time_point{});
    reply_limit_.push_back(options_.transport.max_message_bytes);
    ASSIGN_OR_RETURN(auto s, ClientSocket::Connect(members_.back()[0],
                                                   options_.transport));
    sockets_.push_back(std::move(s));
    raw_sockets_.push_back(sockets_.back().get());
    connects_.push_back(0);
    announced_clock_.push_back(-1);
    pull_seq_.push_back(0);
    limit_bytes_.push_back(options_.max_request_bytes);
    limit_frame_.push_back(options_.max_request_frame_bytes);
    shm_ok_.push_back(false);
    return Status::OK();
  }

  // Elastic layouts (common/elastic_doc.h): a shard refused a request routed
  // by an older epoch and sent its layout document. From now on requests go
  // by it: shards that joined are connected (and told this worker's clock),
  // shards that left get nothing more.
  Status AdoptLayout(const std::string& text) {
    ASSIGN_OR_RETURN(ElasticDoc doc, ElasticDoc::FromJson(text));
    if (doc.epoch <= layout_epoch_) return Status::OK();  // known already
    if (!layout_) return Status::FailedPrecondition("elastic layout before Register()");
    if (doc.owners.size() != layout_->chunks().size() ||
        doc.servers.size() < options_.servers.size()) {
      return Status::Corruption("elastic layout of epoch " + std::to_string(doc.epoch) +
                                " lists " + std::to_string(doc.owners.size()) +
                                " chunks and " + std::to_string(doc.servers.size()) +
                                " shards; this client has " +
                                std::to_string(layout_->chunks().size()) + " and " +
                                std::to_string(options_.servers.size()));
    }
    RETURN_IF_ERROR(ConnectJoined(doc));
    ASSIGN_OR_RETURN(Layout l, layout_->WithOwners(doc.owners, num_shards()));
    SetLayout(std::move(l));
    if (doc.num_buckets > 0) {
      // Rows of sparse tables go by the document's key ranges from now on.
      auto ranges = std::make_shared<KeyRanges>();
      ranges->num_buckets = doc.num_buckets;
      ranges->owners = doc.bucket_owners;
      key_ranges_ = std::move(ranges);
    }
    layout_epoch_ = doc.epoch;
    active_ = doc.Active();
    LOG(INFO) << "elastic layout epoch " << doc.epoch << ": " << active_.size()
              << " shards own chunks or key ranges";
    // A shard that joined took the workers' clocks from the shards it copied
    // from; this worker's later clocks reach it as Reroute() resends them.
    return Status::OK();
  }

  // Shards that joined (listed after this client's): connected, heartbeaten.
  Status ConnectJoined(const ElasticDoc& doc) {
    for (size_t i = options_.servers.size(); i < doc.servers.size(); ++i) {
      RETURN_IF_ERROR(AddShardState(doc.servers[i]));
      options_.servers.push_back(doc.servers[i]);
      if (heartbeater_) RETURN_IF_ERROR(heartbeater_->Add(doc.servers[i]));
    }
    return Status::OK();
  }

  // A registration reply's document, kept if newer than the one held.
  void KeepNewestDoc(const std::string& text) {
    StatusOr<ElasticDoc> got = ElasticDoc::FromJson(text);
    if (!got.ok()) return;  // AdoptLayout() of the held one reports errors
    if (!register_doc_.empty()) {
      StatusOr<ElasticDoc> held = ElasticDoc::FromJson(register_doc_);
      if (held.ok() && held->epoch >= got->epoch) return;
    }
    register_doc_ = text;
  }

  // Before the first registration of an elastic fleet's worker: the layout
  // document in etcd (ClientOptions::etcd_endpoints), its shards that
  // joined connected and kept for AdoptLayout(); returns the shards that
  // own chunks or key ranges (all of this client's when there is no
  // document or etcd).
  StatusOr<std::vector<int>> ShardsFromEtcd() {
    if (options_.etcd_endpoints.empty() || layout_epoch_ > 0) return AllShards();
    EtcdOptions eo;
    eo.endpoints = options_.etcd_endpoints;
    eo.security = options_.etcd_security;
    ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Create(eo));
    const std::string key = options_.etcd_prefix + "/elastic";
    StatusOr<std::optional<EtcdKeyValue>> kv = etcd->Get(key);
    if (!kv.ok()) {
      // The shards in `servers` that are still there hand out the layout.
      LOG(WARNING) << "elastic layout " << key << " not read from etcd ("
                   << kv.status().ToString() << "); registering with the "
                   << "shards given";
      return AllShards();
    }
    if (!kv->has_value()) return AllShards();  // a fleet that never changed
    StatusOr<ElasticDoc> doc = ElasticDoc::FromJson((*kv)->value);
    if (!doc.ok()) return doc.status().WithContext("etcd key " + key);
    for (size_t i = 0; i < options_.servers.size(); ++i) {
      if (i >= doc->servers.size() || doc->servers[i] != options_.servers[i]) {
        return Status::InvalidArgument(
            "etcd's layout " + key + " (epoch " + std::to_string(doc->epoch) +
            ") lists " +
            (i < doc->servers.size() ? doc->servers[i] : std::string("nothing")) +
            " as shard " + std::to_string(i) + ", this client was given " +
            options_.servers[i] +
            ": give the fleet's first shards as servers, or its own etcd prefix");
      }
    }
    RETURN_IF_ERROR(ConnectJoined(*doc));
    KeepNewestDoc((*kv)->value);
    LOG(INFO) << "elastic layout epoch " << doc->epoch << " from etcd: "
              << doc->Active().size() << " of " << doc->servers.size()
              << " shards own chunks or key ranges";
    return doc->Active();
  }

  // Sends what shard `shard` refused for a stale layout again, split by the
  // layout adopted since: the chunks of a push (the same payload frames, no
  // copy; nothing of it was applied) or of a pull go to their new owners,
  // under the same ticket.
  void Reroute(std::map<uint64_t, Pending>::iterator pit) {
    Pending p = std::move(pit->second);
    pending_.erase(pit);
    if (p.shm) DisarmShm(p.shm_slot, reply_.id);
    TicketState& t = tickets_[p.ticket];
    t.remaining--;
    Status s = AdoptLayout(reply_.layout_doc);
    if (s.ok() && p.kind == RequestKind::kClock) {
      // Sent again to every shard of the new layout, but only once every
      // push of an earlier step has been acknowledged: a clock of c tells a
      // shard that this worker's pushes of steps < c are there, and under
      // BSP one that arrived first would close the round without them.
      bool known = false;
      for (const DeferredClock& d : deferred_clocks_) {
        known = known || (d.ticket == p.ticket && d.clock == p.clock);
      }
      if (!known) {
        deferred_clocks_.push_back({p.ticket, p.clock});
        t.remaining++;
      }
      FlushDeferredClocks();
      return;
    }
    if (s.ok() && p.kind != RequestKind::kPush && p.kind != RequestKind::kPull) {
      s = Status::FailedPrecondition(std::string(RequestKindName(p.kind)) +
                                     " refused for a stale layout");
    }
    std::map<int, std::vector<size_t>> by_shard;
    const size_t n = p.kind == RequestKind::kPush ? p.refs.size() : p.ids.size();
    for (size_t i = 0; s.ok() && i < n; ++i) {
      const uint32_t id = p.kind == RequestKind::kPush ? p.refs[i].chunk : p.ids[i];
      by_shard[layout_->chunks()[id].shard].push_back(i);
    }
    // Rows go by the key ranges adopted: each part split by its keys' new
    // owners (pulled rows still land where the ticket's plan says).
    std::map<int, std::vector<RowsSent>> rows_by_shard;
    if (s.ok()) rows_by_shard = SplitRows(p.rows);
    for (const auto& entry : rows_by_shard) by_shard[entry.first];
    const bool push = p.kind == RequestKind::kPush;
    for (const auto& [shard, items] : by_shard) {
      if (!s.ok()) break;
      RequestHeader h = NewHeader(p.kind);
      h.clock = p.clock;
      std::vector<Frame> frames(1);
      if (push) {
        for (size_t i : items) {
          ChunkRef ref = p.refs[i];
          frames.push_back(p.frames[ref.frame]);
          ref.frame = static_cast<uint32_t>(frames.size() - 1);
          h.chunks.push_back(ref);
        }
      } else {
        h.pull_codec = p.codec;
        h.pull_base_seq = pull_seq_[shard];
        h.pull_dense = !items.empty();  // else rows only
        for (size_t i : items) h.pull_chunks.push_back(p.ids[i]);
      }
      std::vector<RowsSent> sent;
      auto rit = rows_by_shard.find(shard);
      if (rit != rows_by_shard.end()) {
        sent = std::move(rit->second);
        s = AddRows(sent, push, &h, &frames);
        if (!s.ok()) break;
      }
      s = Enqueue(p.ticket, shard, h, std::move(frames), std::move(sent));
      if (!s.ok()) return;  // Enqueue abandoned the ticket
    }
    if (!s.ok() && t.status.ok()) t.status = s;
  }

  // Sends the clocks Reroute() deferred whose earlier pushes are all
  // acknowledged.
  void FlushDeferredClocks() {
    for (size_t i = 0; i < deferred_clocks_.size();) {
      const DeferredClock d = deferred_clocks_[i];
      bool waits = false;
      for (const auto& [id, p] : pending_) {
        waits = waits || (p.kind == RequestKind::kPush && p.clock < d.clock);
      }
      if (waits) {
        ++i;
        continue;
      }
      deferred_clocks_.erase(deferred_clocks_.begin() + static_cast<std::ptrdiff_t>(i));
      auto it = tickets_.find(d.ticket);
      if (it == tickets_.end()) continue;  // abandoned meanwhile
      RequestHeader h = NewHeader(RequestKind::kClock);
      h.clock = d.clock;
      Status s;
      for (int shard : AllShards()) {
        s = Enqueue(d.ticket, shard, h, std::vector<Frame>(1));
        if (!s.ok()) break;  // Enqueue abandoned the ticket
      }
      it = tickets_.find(d.ticket);
      if (it != tickets_.end()) it->second.remaining--;
    }
  }

  void SetLayout(Layout l) {
    layout_ = std::make_unique<Layout>(std::move(l));
    for (int s = 0; s < num_shards(); ++s) {
      uint64_t need = uint64_t{1} << 20;
      // Shards known from etcd before the document is adopted: none yet.
      if (s < layout_->num_shards()) {
        for (uint32_t id : layout_->shard_chunks(s))
          need += 2 * layout_->chunks()[id].num_elems * sizeof(float) + 128;
      }
      reply_limit_[s] = std::max<int64_t>(
          options_.transport.max_message_bytes,
          static_cast<int64_t>(std::min<uint64_t>(need, INT64_MAX)));
      sockets_[s]->SetMaxMessageBytes(reply_limit_[s]);
    }
  }

  Status Simple(RequestKind kind, milliseconds timeout) {
    ASSIGN_OR_RETURN(Ticket t, StartOnShards(NewHeader(kind), AllShards()));
    return Wait(t, timeout, nullptr);
  }

  uint64_t incarnation_;
  // The shards the chunks were cut for: the servers this client was given
  // (the fleet's first shards). Shards that joined later (ConnectJoined)
  // own chunks of that cut, so a registration, the second one too, names
  // this count, whatever num_shards() has grown to.
  const int cut_shards_;
  std::vector<std::unique_ptr<ClientSocket>> sockets_;
  std::vector<ClientSocket*> raw_sockets_;
  std::unique_ptr<Heartbeater> heartbeater_;
  std::unique_ptr<Layout> layout_;
  uint64_t layout_epoch_ = 0;  // elastic layouts: the epoch routed by
  std::shared_ptr<const KeyRanges> key_ranges_;  // null: ShardOfKey
  std::vector<uint64_t> chunk_mark_;  // Absorb: chunks asked for / answered
  std::string register_doc_;  // an elastic layout sent with a registration
  std::vector<DeferredClock> deferred_clocks_;  // see Reroute()
  uint64_t mark_ = 0;
  std::vector<int> active_;    // elastic layouts: shards that own chunks
                               // or key ranges
  std::map<uint64_t, Pending> pending_;  // by request id: resends go in order
  std::unordered_map<Ticket, TicketState> tickets_;
  uint64_t next_id_ = 1;
  Ticket next_ticket_ = 1;
  uint64_t resends_ = 0;
  std::vector<int> connects_;         // per shard: connections seen (1 = first)
  // Replica groups: per shard, its members' endpoints, the one talked to,
  // and how many times it changed (a pending request sent before the last
  // change is not held against the new member).
  std::vector<std::vector<std::string>> members_;
  std::vector<size_t> current_;
  std::vector<int64_t> reply_limit_;  // per shard: largest reply accepted
  // Per shard: the member last left for silence, and when.
  std::vector<size_t> abandoned_;
  std::vector<SteadyClock::time_point> abandoned_at_;
  // A member left for silence is not returned to on a redirect for this
  // long (its lease, and so the group's view of it, lasts about as long).
  static constexpr milliseconds kAbandonedFor{3000};
  // Redirects not followed (RedirectInLayout), until when.
  std::map<std::string, SteadyClock::time_point> refused_redirects_;
  static constexpr milliseconds kRefusedRedirectFor{5000};
  // A replica's refusal is asked again after at most this long.
  static constexpr milliseconds kReplicaRetry{50};
  // Per shard: when its member last answered anything, and was last probed.
  std::vector<SteadyClock::time_point> last_reply_at_;
  std::vector<SteadyClock::time_point> probed_at_;
  // Ids of probes (heartbeats on a shard's connection): apart from requests'.
  static constexpr uint64_t kProbeIds = uint64_t{1} << 62;
  uint64_t failovers_ = 0;
  // Per shard: the highest clock started to it (StartClock, StartClockShards).
  std::vector<int64_t> announced_clock_;
  std::vector<uint64_t> pull_seq_;    // per shard: last sparse pull applied
  std::vector<int64_t> limit_bytes_;  // per shard: its request limit
  std::vector<int64_t> limit_frame_;  // per shard: its frame limit
  std::vector<std::string>* stats_sink_ = nullptr;
  OptimizerState* state_sink_ = nullptr;  // during ReadOptimizerState
  // During ReadRowRecords: where the records of the request in flight go
  // (record j to out + at[j] * bytes).
  struct RecordsSink {
    uint32_t table = 0;
    const size_t* at = nullptr;
    size_t n = 0;
    size_t bytes = 0;
    uint8_t* out = nullptr;
  };
  RecordsSink records_sink_;
  // During ScanRows: where the page goes (appended).
  struct ScanSink {
    uint32_t table = 0;
    uint64_t from = 0;
    size_t max = 0;
    size_t bytes = 0;
    std::vector<uint64_t>* keys = nullptr;
    std::vector<uint8_t>* records = nullptr;
    // A point-in-time scan: the id asked for (0: open one), then the id
    // the reply named.
    bool point_in_time = false;
    uint64_t snapshot = 0;
  };
  ScanSink scan_sink_;
  std::unique_ptr<ShmSegment> shm_;  // shared_memory_bytes > 0
  std::vector<bool> shm_ok_;         // per shard: the segment is attached
  std::vector<TableSpec> tables_;
  std::vector<float> rows_scratch_;
  // Pump() rounds between two reads of the connection events without a wait.
  static constexpr uint64_t kConnectCheckEvery = 64;
  // Shared-memory pulls in flight per shard, at most.
  static constexpr uint32_t kShmSlotsPerShard = 8;
  uint64_t pump_rounds_ = 0;
  Message msg_;        // reused receive buffer
  ReplyHeader reply_;  // reused decoded header
};

}  // namespace

namespace {

// Splits `list` at `sep`, dropping empty items.
std::vector<std::string> Split(const std::string& list, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(sep, pos);
    if (end == std::string::npos) end = list.size();
    if (end > pos) out.push_back(list.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> ParseReplicaGroup(const std::string& group) {
  return Split(group, '|');
}

std::vector<std::string> ParseEndpoints(const std::string& list) {
  return Split(list, ',');
}

StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  auto c = std::make_unique<ClientImpl>(options);
  RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace asyncps::worker
