// ClientCore: the Client (worker/client.h) implementation's core. It owns
// one ShardConn per shard (shard_conn.h), the tickets and the requests in
// flight (request.h), and does the three things every call is made of:
// start requests (Enqueue: encode, send, keep for resending), wait for a
// ticket (Wait, with its deadline and interrupt) and pump the sockets
// (Pump: resends with backoff, probes and failover inside a replica group,
// reconnects, replies handed to the ticket's ReplyReader). Pushes, pulls
// and clocks are started in transfers.cc and pulled weights written by
// PullReader (pull_reader.h). The rest are types of their own over this
// core: AdminCalls (admin.h), Uploads (uploads.h), ShmPulls (shm_pulls.h),
// ElasticRouter (elastic_router.h), Heartbeater (heartbeater.h).
//
// Thread safety: one thread at a time, as Client; the Heartbeater runs a
// thread of its own with its own sockets.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/layout.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "worker/client.h"
#include "worker/client/admin.h"
#include "worker/client/elastic_router.h"
#include "worker/client/heartbeater.h"
#include "worker/client/request.h"
#include "worker/client/shard_conn.h"
#include "worker/client/shm_pulls.h"
#include "worker/client/uploads.h"

namespace asyncps::worker::client {

class ClientCore : public Client {
 public:
  explicit ClientCore(const ClientOptions& o);
  ~ClientCore() override;

  // Checks the options, connects to every shard, creates the segment and
  // starts the heartbeats.
  [[nodiscard]] Status Init();

  // --- Client ---
  Status Register(const std::vector<TensorSpec>& tensors,
                  LayoutOptions layout) override {
    return RegisterModel(tensors, layout, {});
  }
  Status RegisterModel(const std::vector<TensorSpec>& tensors,
                       LayoutOptions layout,
                       const std::vector<TableSpec>& tables) override;
  Status UseLayout(const std::vector<TensorSpec>& tensors,
                   LayoutOptions layout) override;
  const Layout& layout() const override { return *layout_; }
  const std::vector<TableSpec>& tables() const override { return tables_; }
  int ShardOfRow(uint32_t table, uint64_t key) const override;

  // transfers.cc
  StatusOr<Ticket> StartPush(int64_t clock,
                             std::vector<ChunkPayload> chunks) override {
    return StartPushRows(clock, std::move(chunks), {});
  }
  StatusOr<Ticket> StartPushRows(int64_t clock,
                                 std::vector<ChunkPayload> chunks,
                                 const std::vector<RowsPush>& rows) override;
  StatusOr<Ticket> StartPull(int64_t clock, const std::vector<float*>& tensors,
                             const std::string& codec) override {
    return StartPullRows(clock, tensors, {}, codec);
  }
  StatusOr<Ticket> StartPullRows(int64_t clock,
                                 const std::vector<float*>& tensors,
                                 const std::vector<RowsPull>& rows,
                                 const std::string& codec) override;
  StatusOr<Ticket> StartPullChunks(int64_t clock,
                                   const std::vector<uint32_t>& chunks,
                                   const std::vector<float*>& tensors) override;
  StatusOr<Ticket> StartClock(int64_t clock) override {
    return StartClockShards(clock, AllShards());
  }
  StatusOr<Ticket> StartClockShards(int64_t clock,
                                    const std::vector<int>& shards) override;
  StatusOr<Ticket> StartHeartbeatShards(
      const std::vector<int>& shards) override;

  Status Wait(Ticket ticket, std::chrono::milliseconds timeout,
              TicketResult* result) override;
  Status WaitAll(std::chrono::milliseconds timeout) override;

  Status Stats(std::vector<std::string>* replies,
               std::chrono::milliseconds timeout) override {
    return admin_.Stats(replies, timeout);
  }
  Status Checkpoint(std::chrono::milliseconds timeout) override {
    return admin_.Checkpoint(timeout);
  }
  Status Shutdown(std::chrono::milliseconds timeout) override {
    return admin_.Shutdown(timeout);
  }
  Status Heartbeat(std::chrono::milliseconds timeout) override {
    return admin_.Heartbeat(timeout);
  }

  float* AllocateShared(size_t num_floats) override {
    return shm_ ? shm_->Allocate(num_floats) : nullptr;
  }
  int shared_memory_shards() const override;

  Status Assign(int shard, AssignRequest request, bool* claimed,
                std::chrono::milliseconds timeout) override {
    return uploads_.Assign(shard, std::move(request), claimed, timeout);
  }
  Status ReadOptimizerState(OptimizerState* out,
                            std::chrono::milliseconds timeout) override {
    return uploads_.ReadOptimizerState(out, timeout);
  }
  Status ReadRowRecords(uint32_t table, const uint64_t* keys, size_t n,
                        uint8_t* out,
                        std::chrono::milliseconds timeout) override {
    return uploads_.ReadRowRecords(table, keys, n, out, timeout);
  }
  Status ScanRows(int shard, uint32_t table, uint64_t from, size_t max_rows,
                  std::vector<uint64_t>* keys, std::vector<uint8_t>* records,
                  std::chrono::milliseconds timeout,
                  uint64_t* snapshot) override {
    return uploads_.ScanRows(shard, table, from, max_rows, keys, records,
                             timeout, snapshot);
  }

  uint64_t layout_epoch() const override { return router_.epoch(); }
  uint64_t resends() const override { return resends_; }
  uint64_t failovers() const override { return failovers_; }
  uint64_t incarnation() const override { return incarnation_; }

  // --- The core, for the types over it ---
  bool has_layout() const { return layout_ != nullptr; }
  ShardConn& shard(int s) { return shards_[s]; }
  ElasticRouter& router() { return router_; }
  // A request header of `kind` with this client's rank, incarnation, layout
  // epoch and (pushes, clocks) learning rate.
  RequestHeader NewHeader(RequestKind kind) const;
  // A ticket whose replies `reader` reads (none: only TicketResult).
  Ticket NewTicket(std::unique_ptr<ReplyReader> reader = nullptr);
  // The ticket's state, or nullptr once it completed or was abandoned.
  TicketState* FindTicket(Ticket t);
  // The shards requests go to: all, or an elastic layout's active ones.
  std::vector<int> AllShards() const;
  // A ticket with header `base` (no frames) sent to each of `shards`.
  StatusOr<Ticket> StartOnShards(const RequestHeader& base,
                                 const std::vector<int>& shards,
                                 std::unique_ptr<ReplyReader> reader = nullptr);
  // Sends one request of ticket t to `shard` and keeps it until its reply
  // (frames[0] is replaced by the encoded header). On an error that is not
  // retryable, or past max_in_flight, the ticket is abandoned.
  [[nodiscard]] Status Enqueue(Ticket t, int shard, RequestHeader h,
                               std::vector<Frame> frames,
                               std::vector<RowsSent> rows = {});
  // Rows refs (and their frames) of a push or pull, in the order of `sent`.
  [[nodiscard]] Status AddRows(const std::vector<RowsSent>& sent, bool push,
                               RequestHeader* h, std::vector<Frame>* frames);
  // True when a push made at a clock below `clock` is still in flight.
  bool PushInFlightBefore(int64_t clock) const;
  // Keeps `l` and lets every socket receive the largest reply a pull of it
  // can bring: each chunk once, through the widest pull codec (top-k with
  // ratio 1: an index and a value per element), plus headers.
  void SetLayout(Layout l);
  // Shards of `servers` past this client's (they joined an elastic
  // fleet): connected, heartbeaten.
  [[nodiscard]] Status ConnectJoined(const std::vector<std::string>& servers);
  // Scratch reused by pull replies (no allocation per reply).
  struct PullScratch {
    std::vector<uint64_t> chunk_mark;  // chunks asked for / answered
    uint64_t mark = 0;
    std::vector<float> rows;  // decoded or aligned rows
  };
  PullScratch& pull_scratch() { return pull_scratch_; }

 private:
  // InvalidArgument unless every shard is in [0, num_shards()) and listed
  // once; `what` names the request.
  Status CheckShardList(const char* what, const std::vector<int>& shards);
  StatusOr<BufferPtr> EncodeRows(uint32_t table, const BufferPtr& grads,
                                 size_t n);
  Status AddShardState(const std::string& group);
  Status Send(Pending& p);
  void Probe(int shard, SteadyClock::time_point now);
  size_t MemberIndex(int shard, const std::string& endpoint);
  size_t NextMember(int shard) const;
  void FailOver(int shard, size_t next);
  void Abandon(Ticket t);
  Status Pump(SteadyClock::time_point until, Ticket awaited);
  void ReadConnectionEvents();
  StatusOr<size_t> DrainReplies(Ticket awaited);
  void ResendAll(int shard);
  void Reannounce(int shard);
  void HandleReply(int shard);
  // A refusal that is a redirect or a retry: handled (true) or not.
  bool HandleRefusal(int shard, std::map<uint64_t, Pending>::iterator pit);
  Status Absorb(int shard, Pending& p, TicketState& t);
  void Reroute(std::map<uint64_t, Pending>::iterator pit);
  void DisarmShm(uint32_t slot, uint64_t id) { shm_->Disarm(slot, id); }
  bool ShmRetry(int shard, Pending& p);
  RequestHeader AttachHeader() const;
  void SendAttach(int shard);
  void AttachShared();

  uint64_t incarnation_;
  // The shards the chunks were cut for: the servers this client was given
  // (the fleet's first shards). Shards that joined later (ConnectJoined)
  // own chunks of that cut, so a registration, the second one too, names
  // this count, whatever num_shards() has grown to.
  const int cut_shards_;
  std::vector<ShardConn> shards_;           // by shard index
  std::vector<ClientSocket*> raw_sockets_;  // shards_[i].socket, for PollAny
  std::unique_ptr<Heartbeater> heartbeater_;
  std::unique_ptr<Layout> layout_;
  std::vector<TableSpec> tables_;
  ElasticRouter router_;
  AdminCalls admin_;
  Uploads uploads_;
  std::unique_ptr<ShmPulls> shm_;        // shared_memory_bytes > 0
  std::map<uint64_t, Pending> pending_;  // by request id: resends go in order
  std::unordered_map<Ticket, TicketState> tickets_;
  uint64_t next_id_ = 1;
  Ticket next_ticket_ = 1;
  uint64_t resends_ = 0;
  uint64_t failovers_ = 0;
  PullScratch pull_scratch_;
  // A member left for silence is not returned to on a redirect for this
  // long (its lease, and so the group's view of it, lasts about as long).
  static constexpr std::chrono::milliseconds kAbandonedFor{3000};
  // A replica's refusal is asked again after at most this long.
  static constexpr std::chrono::milliseconds kReplicaRetry{50};
  // Ids of probes (heartbeats on a shard's connection): apart from requests'.
  static constexpr uint64_t kProbeIds = uint64_t{1} << 62;
  // Pump() rounds between two reads of the connection events without a wait.
  static constexpr uint64_t kConnectCheckEvery = 64;
  uint64_t pump_rounds_ = 0;
  Message msg_;        // reused receive buffer
  ReplyHeader reply_;  // reused decoded header
};

}  // namespace asyncps::worker::client
