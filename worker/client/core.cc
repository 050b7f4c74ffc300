// ClientCore (worker/client/core.h): start, wait, pump. The formats are in
// common/protocol.capnp; what a ticket's replies become is its ReplyReader's.
#include "worker/client/core.h"

#include <glog/logging.h>

#include <algorithm>
#include <random>

#include "common/etcd_client.h"
#include "common/hash.h"
#include "compression/codec.h"

namespace asyncps::worker::client {

using std::chrono::milliseconds;

namespace {

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

}  // namespace

ClientCore::ClientCore(const ClientOptions& o)
    : Client(o),
      incarnation_(RandomIncarnation()),
      cut_shards_(static_cast<int>(o.servers.size())),
      router_(options_),
      admin_(this),
      uploads_(this) {}

ClientCore::~ClientCore() {
  if (heartbeater_) heartbeater_->Stop();
}

Status ClientCore::Init() {
  if (options_.servers.empty())
    return Status::InvalidArgument("client needs at least one server endpoint");
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
        shm_, ShmPulls::Create(options_.shared_memory_bytes, num_shards()));
  }
  if (options_.heartbeat_interval.count() > 0) {
    heartbeater_ = std::make_unique<Heartbeater>(options_, incarnation_);
    RETURN_IF_ERROR(heartbeater_->Start());
  }
  return Status::OK();
}

Status ClientCore::RegisterModel(const std::vector<TensorSpec>& tensors,
                                 LayoutOptions layout,
                                 const std::vector<TableSpec>& tables) {
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
  ASSIGN_OR_RETURN(std::vector<int> targets, router_.ShardsFromEtcd(*this));
  RequestHeader h = NewHeader(RequestKind::kRegister);
  h.tensors = tensors;
  h.layout = layout;
  h.tables = tables;
  ASSIGN_OR_RETURN(Ticket t, StartOnShards(h, targets));
  TicketResult r;
  RETURN_IF_ERROR(Wait(t, options_.deadline, &r));
  // Registered before and routing by an elastic layout already: the
  // shards found the same model, keep that routing.
  if (router_.epoch() == 0) SetLayout(std::move(l));
  tables_ = tables;
  // Shards joined or left since the fleet started: route by their layout
  // from the start.
  RETURN_IF_ERROR(router_.AdoptKept(*this));
  AttachShared();
  return Status::OK();
}

Status ClientCore::UseLayout(const std::vector<TensorSpec>& tensors,
                             LayoutOptions layout) {
  layout.num_shards = cut_shards_;
  ASSIGN_OR_RETURN(Layout l, Layout::Create(tensors, layout));
  RETURN_IF_ERROR(router_.ShardsFromEtcd(*this).status());
  if (router_.epoch() == 0) SetLayout(std::move(l));  // as RegisterModel
  RETURN_IF_ERROR(router_.AdoptKept(*this));
  AttachShared();
  return Status::OK();
}

Status ClientCore::Wait(Ticket ticket, milliseconds timeout,
                        TicketResult* result) {
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

Status ClientCore::WaitAll(milliseconds timeout) {
  Status first;
  while (!tickets_.empty()) {
    Status s = Wait(tickets_.begin()->first, timeout, nullptr);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

int ClientCore::shared_memory_shards() const {
  return static_cast<int>(
      std::count_if(shards_.begin(), shards_.end(),
                    [](const ShardConn& c) { return c.shm_ok; }));
}

int ClientCore::ShardOfRow(uint32_t table, uint64_t key) const {
  const uint64_t h = HashName(tables_[table].name);
  const KeyRanges* ranges = router_.key_ranges();
  return ranges ? ranges->Owner(h, key)
                : ShardOfKeyHashed(h, key, num_shards());
}

RequestHeader ClientCore::NewHeader(RequestKind kind) const {
  RequestHeader h;
  h.kind = kind;
  h.rank = options_.rank;
  h.incarnation = incarnation_;
  if (kind == RequestKind::kPush || kind == RequestKind::kClock) h.lr = lr_;
  h.layout_epoch = router_.epoch();
  return h;
}

std::vector<int> ClientCore::AllShards() const {
  if (router_.epoch() > 0)
    return router_.active();  // shards that left get nothing
  std::vector<int> v(num_shards());
  for (int i = 0; i < num_shards(); ++i) v[i] = i;
  return v;
}

Ticket ClientCore::NewTicket(std::unique_ptr<ReplyReader> reader) {
  Ticket t = next_ticket_++;
  TicketState& st = tickets_[t];
  st.result.min_clock = INT64_MAX;
  st.deadline = SteadyClock::now() + options_.deadline;
  st.reader = std::move(reader);
  return t;
}

TicketState* ClientCore::FindTicket(Ticket t) {
  auto it = tickets_.find(t);
  return it == tickets_.end() ? nullptr : &it->second;
}

StatusOr<Ticket> ClientCore::StartOnShards(
    const RequestHeader& base, const std::vector<int>& shards,
    std::unique_ptr<ReplyReader> reader) {
  Ticket t = NewTicket(std::move(reader));
  for (int s : shards) {
    RETURN_IF_ERROR(Enqueue(t, s, base, std::vector<Frame>(1)));
  }
  return t;
}

Status ClientCore::Enqueue(Ticket t, int shard, RequestHeader h,
                           std::vector<Frame> frames,
                           std::vector<RowsSent> rows) {
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

Status ClientCore::Send(Pending& p) {
  // Frames are shared, so a resend costs no copy of the payload.
  std::vector<Frame> copy = p.frames;
  p.answered = false;
  return shards_[p.shard].socket->Send(copy);
}

// A heartbeat on the shard's own connection, at most once per attempt:
// its answer (dropped as a late reply) shows the member is alive.
void ClientCore::Probe(int shard, SteadyClock::time_point now) {
  if (shards_[shard].probed_at > shards_[shard].last_reply_at)
    return;  // one unanswered
  shards_[shard].probed_at = now;
  RequestHeader h = NewHeader(RequestKind::kHeartbeat);
  h.id = kProbeIds | next_id_++;
  std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
  (void)shards_[shard].socket->Send(frames);
}

size_t ClientCore::MemberIndex(int shard, const std::string& endpoint) {
  auto& m = shards_[shard].members;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] == endpoint) return i;
  m.push_back(endpoint);
  return m.size() - 1;
}
size_t ClientCore::NextMember(int shard) const {
  return (shards_[shard].current + 1) % shards_[shard].members.size();
}

// Talks to member `next` of the shard's replica group from now on: a new
// connection, the highest clock announced again, then every request in
// flight to the shard resent (the new primary applies each push once:
// it holds the de-duplication table the old one replicated to it).
void ClientCore::FailOver(int shard, size_t next) {
  if (next == shards_[shard].current) return;
  const std::string& to = shards_[shard].members[next];
  StatusOr<std::unique_ptr<ClientSocket>> s =
      ClientSocket::Connect(to, options_.transport);
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 20) << "shard " << shard << ": connecting to " << to
                             << ": " << s.status().ToString();
    return;
  }
  LOG(INFO) << "shard " << shard << ": "
            << shards_[shard].members[shards_[shard].current] << " -> " << to;
  shards_[shard].socket = std::move(*s);
  shards_[shard].socket->SetMaxMessageBytes(shards_[shard].reply_limit);
  raw_sockets_[shard] = shards_[shard].socket.get();
  shards_[shard].current = next;
  shards_[shard].last_reply_at =
      SteadyClock::now();  // a new member's own chance
  shards_[shard].connects =
      0;  // this socket's first connection resends nothing
  ++failovers_;
  shards_[shard].shm_ok = false;  // another process: attached again if refused
  Reannounce(shard);
  ResendAll(shard);
}

void ClientCore::Abandon(Ticket t) {
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
Status ClientCore::Pump(SteadyClock::time_point until, Ticket awaited) {
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
    if (shards_[s].members.size() < 2 || p.answered) continue;
    if (shards_[s].probed_at > shards_[s].last_reply_at &&
        now - shards_[s].probed_at >= half) {
      shards_[s].abandoned = shards_[s].current;
      shards_[s].abandoned_at = now;
      FailOver(s, NextMember(s));
      wake = now;
      break;
    }
    if (now - shards_[s].last_reply_at >= half) Probe(s, now);
    wake = std::min(wake, (shards_[s].probed_at > shards_[s].last_reply_at
                               ? shards_[s].probed_at
                               : shards_[s].last_reply_at) +
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
  ASSIGN_OR_RETURN(int ready,
                   ClientSocket::PollAny(raw_sockets_, wait + milliseconds(1)));
  if (ready < 0) return Status::OK();
  ReadConnectionEvents();
  return DrainReplies(awaited).status();
}

// Reads every socket's connection events: a shard that connected again
// (it restarted) gets the clock announced again, the shared-memory segment
// and every pending request resent.
void ClientCore::ReadConnectionEvents() {
  for (size_t s = 0; s < shards_.size(); ++s) {
    const int connects = shards_[s].socket->TakeConnects();
    if (connects > 0 && shards_[s].connects++ > 0) {
      Reannounce(static_cast<int>(s));
      // A restarted shard has forgotten the segment: before the resends.
      if (shards_[s].shm_ok) SendAttach(static_cast<int>(s));
      ResendAll(static_cast<int>(s));
    }
  }
}

// Handles every reply queued on any socket, or those until `awaited` is
// complete (the caller returns to its own work without another look at
// the queues, a system call when they are empty); returns how many.
StatusOr<size_t> ClientCore::DrainReplies(Ticket awaited) {
  size_t n = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    while (true) {
      ASSIGN_OR_RETURN(bool got,
                       shards_[s].socket->Receive(&msg_, milliseconds(0)));
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
void ClientCore::ResendAll(int shard) {
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
void ClientCore::Reannounce(int shard) {
  if (options_.rank < 0 || shards_[shard].announced_clock < 0) return;
  // Never past a push still in flight: a clock of c tells the shard that
  // this worker's pushes of steps < c are there (under BSP it closes the
  // round), and a push re-routed by an elastic layout change may come
  // after this.
  int64_t clock = shards_[shard].announced_clock;
  for (const auto& [id, p] : pending_) {
    if (p.kind == RequestKind::kPush) clock = std::min(clock, p.clock);
  }
  RequestHeader h = NewHeader(RequestKind::kClock);
  h.clock = clock;
  h.id = next_id_++;
  std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
  if (shards_[shard].socket->Send(frames).ok()) ++resends_;
  VLOG(1) << "shard " << shard << " reconnected: clock " << clock
          << " announced again";
}

void ClientCore::HandleReply(int shard) {
  if (msg_.frames.empty()) return;
  Status st =
      DecodeReply(msg_.frames[0].data, msg_.frames[0].size, {}, &reply_);
  if (!st.ok()) {
    LOG(WARNING) << "undecodable reply from shard " << shard << ": "
                 << st.ToString();
    return;
  }
  shards_[shard].last_reply_at = SteadyClock::now();
  if (reply_.max_request_bytes > 0) {
    shards_[shard].limit_bytes = static_cast<int64_t>(
        std::min<uint64_t>(reply_.max_request_bytes, INT64_MAX));
  }
  if (reply_.max_frame_bytes > 0) {
    shards_[shard].limit_frame = static_cast<int64_t>(
        std::min<uint64_t>(reply_.max_frame_bytes, INT64_MAX));
  }
  auto pit = pending_.find(reply_.id);
  if (pit == pending_.end() || pit->second.shard != shard)
    return;  // late duplicate
  if (HandleRefusal(shard, pit)) return;
  Pending& p = pit->second;
  TicketState& t = tickets_[p.ticket];
  Status s;
  if (p.shm && shm_->IsDone(p.shm_slot, reply_.id)) {
    // The weights are in place, whatever the reply says: a resend of a
    // pull answered before (its reply lost) is refused as not awaited.
    s = reply_.status.ok() ? Absorb(shard, p, t) : Status::OK();
  } else if (p.shm && reply_.status.ok()) {
    s = Status::Corruption(
        "shard answered a shared-memory pull without "
        "writing it");
  } else {
    s = reply_.status.ok() ? Absorb(shard, p, t) : reply_.status;
  }
  if (p.shm) DisarmShm(p.shm_slot, reply_.id);
  if (s.ok() && p.kind == RequestKind::kRegister &&
      !reply_.layout_doc.empty()) {
    router_.KeepNewestDoc(reply_.layout_doc);
  }
  if (s.ok() && p.kind == RequestKind::kPush && options_.on_push) {
    options_.on_push(shard, reply_.id, true);
  }
  if (!s.ok() && t.status.ok())
    t.status = s.WithContext("shard " + std::to_string(shard));
  t.remaining--;
  const bool push = p.kind == RequestKind::kPush;
  pending_.erase(pit);
  if (push && router_.has_deferred_clocks()) router_.FlushDeferredClocks(*this);
}

bool ClientCore::HandleRefusal(int shard,
                               std::map<uint64_t, Pending>::iterator pit) {
  Pending& p = pit->second;
  if (reply_.status.code() == StatusCode::kUnavailable && reply_.epoch > 0) {
    // A replica that is not its group's primary (or one whose group is
    // changing): go where it says the primary is, unless that is the
    // member this client just left for silence (its lease has not ended
    // yet: the group is about to fail over); else ask again shortly.
    const auto now = SteadyClock::now();
    if (!reply_.redirect.empty() &&
        reply_.redirect != shards_[shard].members[shards_[shard].current] &&
        router_.RedirectAllowed(shard, shards_[shard].members, reply_.redirect,
                                now)) {
      const size_t to = MemberIndex(shard, reply_.redirect);
      if (to != shards_[shard].abandoned ||
          now - shards_[shard].abandoned_at > kAbandonedFor) {
        FailOver(shard, to);
        return true;
      }
    }
    p.next_send = now + std::min(p.backoff, kReplicaRetry);
    p.answered = true;  // the member is there: not a reason to leave it
    return true;
  }
  if (reply_.status.code() == StatusCode::kFailedPrecondition &&
      !reply_.layout_doc.empty()) {
    Reroute(pit);
    return true;
  }
  if (reply_.status.code() == StatusCode::kUnavailable && reply_.retry_ms > 0) {
    // The shard asks again shortly (chunks are moving): not a failure.
    p.next_send =
        SteadyClock::now() +
        std::min<milliseconds>(p.backoff, milliseconds(reply_.retry_ms));
    p.answered = true;
    return true;
  }
  if (p.shm && !reply_.status.ok() && ShmRetry(shard, p)) return true;
  if (reply_.status.code() == StatusCode::kUnavailable ||
      reply_.status.code() == StatusCode::kResourceExhausted) {
    p.next_send =
        SteadyClock::now() + p.backoff;  // shard busy or recovering: retry
    return true;
  }
  return false;
}

// Folds a successful reply into its ticket: the fields every reply
// carries, then the ticket's reader.
Status ClientCore::Absorb(int shard, Pending& p, TicketState& t) {
  t.result.max_staleness = std::max(t.result.max_staleness, reply_.staleness);
  t.result.min_clock = std::min(t.result.min_clock, reply_.min_clock);
  t.result.created = t.result.created || reply_.created;
  if (!t.reader) return Status::OK();
  Reply r;
  r.shard = shard;
  r.conn = &shards_[shard];
  r.sent = &p;
  r.header = &reply_;
  r.msg = &msg_;
  return t.reader->Read(r, &t.result);
}

// Takes a request its shard refused for a stale layout off the requests
// in flight and its ticket's count, and lets the router send it again.
void ClientCore::Reroute(std::map<uint64_t, Pending>::iterator pit) {
  Pending p = std::move(pit->second);
  pending_.erase(pit);
  if (p.shm) DisarmShm(p.shm_slot, reply_.id);
  tickets_[p.ticket].remaining--;
  router_.Reroute(*this, std::move(p), reply_.layout_doc);
}

bool ClientCore::PushInFlightBefore(int64_t clock) const {
  for (const auto& [id, p] : pending_) {
    if (p.kind == RequestKind::kPush && p.clock < clock) return true;
  }
  return false;
}

Status ClientCore::ConnectJoined(const std::vector<std::string>& servers) {
  for (size_t i = options_.servers.size(); i < servers.size(); ++i) {
    RETURN_IF_ERROR(AddShardState(servers[i]));
    options_.servers.push_back(servers[i]);
    if (heartbeater_) RETURN_IF_ERROR(heartbeater_->Add(servers[i]));
  }
  return Status::OK();
}

bool ClientCore::ShmRetry(int shard, Pending& p) {
  if (reply_.status.code() != StatusCode::kFailedPrecondition ||
      p.shm_reattach > 0 || !shards_[shard].shm_ok)
    return false;
  ++p.shm_reattach;
  SendAttach(shard);
  if (Send(p).ok()) ++resends_;
  p.next_send = SteadyClock::now() + p.backoff;
  return true;
}

RequestHeader ClientCore::AttachHeader() const {
  RequestHeader h = NewHeader(RequestKind::kAttachShm);
  shm_->FillAttach(&h);
  return h;
}

// Fire and forget (its reply is dropped as a late one).
void ClientCore::SendAttach(int shard) {
  RequestHeader h = AttachHeader();
  h.id = next_id_++;
  std::vector<Frame> frames{Frame::Owned(EncodeRequest(h))};
  (void)shards_[shard].socket->Send(frames);
}

// Offers the segment to every shard; those that accept it (on this host,
// same user, shared memory on) get pulls into it.
void ClientCore::AttachShared() {
  if (!shm_) return;
  for (int s = 0; s < num_shards(); ++s) {
    if (shards_[s].shm_ok) continue;
    StatusOr<Ticket> t = StartOnShards(AttachHeader(), {s});
    Status st =
        t.ok() ? Wait(*t, options_.attempt_timeout * 2, nullptr) : t.status();
    shards_[s].shm_ok = st.ok();
    if (!st.ok()) {
      LOG(INFO) << "shard " << s << " (" << options_.servers[s]
                << ") pulls over its socket, not shared memory: "
                << st.ToString();
    }
  }
}

Status ClientCore::AddShardState(const std::string& group) {
  ShardConn c;
  c.members = ParseReplicaGroup(group);
  if (c.members.empty())
    return Status::InvalidArgument("empty replica group '" + group + "'");
  c.last_reply_at = SteadyClock::now();
  c.reply_limit = options_.transport.max_message_bytes;
  c.limit_bytes = options_.max_request_bytes;
  c.limit_frame = options_.max_request_frame_bytes;
  ASSIGN_OR_RETURN(c.socket,
                   ClientSocket::Connect(c.members[0], options_.transport));
  raw_sockets_.push_back(c.socket.get());
  shards_.push_back(std::move(c));
  return Status::OK();
}

void ClientCore::SetLayout(Layout l) {
  layout_ = std::make_unique<Layout>(std::move(l));
  for (int s = 0; s < num_shards(); ++s) {
    uint64_t need = uint64_t{1} << 20;
    // Shards known from etcd before the document is adopted: none yet.
    if (s < layout_->num_shards()) {
      for (uint32_t id : layout_->shard_chunks(s))
        need += 2 * layout_->chunks()[id].num_elems * sizeof(float) + 128;
    }
    shards_[s].reply_limit = std::max<int64_t>(
        options_.transport.max_message_bytes,
        static_cast<int64_t>(std::min<uint64_t>(need, INT64_MAX)));
    shards_[s].socket->SetMaxMessageBytes(shards_[s].reply_limit);
  }
}

}  // namespace asyncps::worker::client
