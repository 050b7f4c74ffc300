#include "server/replication/replicator.h"

#include <glog/logging.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/buffer.h"

namespace asyncps::server::replication {

// One backup: its connection and the highest sequence number it has
// acknowledged (acknowledgements arrive in order: one DEALER, one
// event loop applying in order).
struct Replicator::Backup {
  std::string endpoint;
  std::unique_ptr<ClientSocket> socket;
  uint64_t acked = 0;
  // A spare being copied to: its acknowledgements hold nothing until it
  // acknowledged the snapshot's last piece, `snapshot_seq`.
  bool joining = false;
  uint64_t snapshot_seq = 0;
  bool broken = false;  // left an update unapplied: holds until dropped
  std::chrono::steady_clock::time_point sent_at{};  // last message sent
  // When it last acknowledged anything; set when it is connected.
  std::chrono::steady_clock::time_point acked_at =
      std::chrono::steady_clock::now();
  bool silent = false;      // reported (broken_) for not answering
  bool ever_acked = false;  // answered anything since it was connected
};

namespace {

uint64_t RandomSeqStart() {
  std::random_device rd;
  // Below 2^62: never wraps in a process's life.
  return ((static_cast<uint64_t>(rd()) << 20) ^ rd()) + 1;
}

// Requests only the primary answers (a backup redirects them): the
// workers' and the elastic coordinator's (kMigrate).
bool WorkerDataRequest(RequestKind k) {
  return k == RequestKind::kRegister || k == RequestKind::kPush ||
         k == RequestKind::kPull || k == RequestKind::kClock ||
         k == RequestKind::kAttachShm || k == RequestKind::kAssign ||
         k == RequestKind::kMigrate;
}

// Requests that may change the shard: refused by a primary that cannot
// confirm its lease. HandedOn() is the subset handed on to backups.
bool Write(RequestKind k) {
  return k == RequestKind::kRegister || k == RequestKind::kPush ||
         k == RequestKind::kClock || k == RequestKind::kAssign ||
         k == RequestKind::kMigrate;
}

}  // namespace

Replicator::Replicator(const ReplicatorOptions& options)
    : options_(options), next_seq_(RandomSeqStart()) {}

StatusOr<std::unique_ptr<Replicator>> Replicator::Create(
    const ReplicatorOptions& options) {
  std::unique_ptr<Replicator> r(new Replicator(options));
  if (!options.secret.empty()) {
    ASSIGN_OR_RETURN(r->mac_,
                     ReplicaMac::Create(options.secret, options.group));
  } else if (options.transport.curve_secret_key.empty()) {
    return Status::InvalidArgument(
        "replica traffic needs authentication: the group's secret or a "
        "CurveZMQ replica key");
  }
  return r;
}

StatusOr<std::unique_ptr<ClientSocket>> Replicator::ConnectTo(
    const std::string& endpoint) const {
  TransportOptions to = options_.transport;
  if (!to.curve_secret_key.empty()) {
    const ReplicaMember* m = view_.MemberAt(endpoint);
    if (m == nullptr || m->server_key.empty()) {
      return Status::FailedPrecondition(
          "replica " + endpoint +
          " has no server key in its etcd member record (CurveZMQ)");
    }
    to.curve_server_key = m->server_key;
  }
  return ClientSocket::Connect(endpoint, to);
}

const uint8_t* Replicator::Tag(const RequestHeader& h,
                               const std::vector<uint8_t>& header,
                               const std::vector<ByteView>& data) {
  if (!mac_) return nullptr;
  std::vector<TagPiece> pieces;
  pieces.reserve(data.size() + 1);
  pieces.emplace_back(header.data(), header.size());
  for (const ByteView& f : data) pieces.emplace_back(f.data, f.size);
  tag_ = mac_->Sign(h.id, pieces,
                    h.replica_tag_all ? Coverage::kAll : Coverage::kHeader);
  return tag_.data();
}

Status Replicator::SendTo(Backup& b, const std::vector<uint8_t>& header,
                          const std::vector<ByteView>& data,
                          const uint8_t* tag) {
  frames_.clear();
  frames_.push_back(Frame::Copy(header.data(), header.size()));
  for (const ByteView& f : data)
    frames_.push_back(Frame::Ref(f.data, f.size, f.owner));
  if (tag != nullptr) frames_.push_back(Frame::Copy(tag, kReplicaTagBytes));
  Status s = b.socket->Send(frames_);
  frames_.clear();
  b.sent_at = std::chrono::steady_clock::now();
  return s;
}

Replicator::~Replicator() = default;

Status Replicator::SetView(const ReplicaView& view,
                           std::vector<OutgoingReply>* out) {
  const bool changed = !(view == view_);
  const bool was_primary = view_.primary;
  view_ = view;
  if (!changed) return Status::OK();
  ++counters_.view_changes;
  LOG(INFO) << "replica view: epoch " << view.epoch
            << (view.primary  ? " primary"
                : view.backup ? " backup"
                              : " spare")
            << ", primary "
            << (view.primary_endpoint.empty() ? "?" : view.primary_endpoint)
            << ", " << view.backup_endpoints.size() << " backup(s)";
  if (!view.primary) {
    if (was_primary && num_held() > 0) {
      LOG(WARNING) << "no longer primary: " << num_held()
                   << " unacknowledged replies dropped (workers resend them "
                      "to the new primary)";
    }
    counters_.dropped_held += held_.size() + batch_.size();
    held_.clear();
    ClearBatch();
    backups_.clear();
    return Status::OK();
  }
  // Keep the connections (and acknowledgement marks) of backups still
  // listed, and of spares being (or just) copied to that are still alive;
  // connect to new backups. One that cannot be connected to is listed all
  // the same, without a socket, and holds every reply until Membership
  // dropped it (TakeBroken): the view takes effect whole, never with a
  // backup silently left out.
  Status result;
  std::vector<std::unique_ptr<Backup>> next;
  for (auto& b : backups_) {
    if (b && !b->broken && !b->silent &&
        std::find(view.spare_endpoints.begin(), view.spare_endpoints.end(),
                  b->endpoint) != view.spare_endpoints.end())
      next.push_back(std::move(b));
  }
  for (const std::string& e : view.backup_endpoints) {
    auto it = std::find_if(backups_.begin(), backups_.end(),
                           [&](const std::unique_ptr<Backup>& b) {
                             return b && b->endpoint == e;
                           });
    if (it != backups_.end()) {
      next.push_back(std::move(*it));  // broken ones too: they hold
      continue;
    }
    auto b = std::make_unique<Backup>();
    b->endpoint = e;
    // Everything handed on before this backup joined is not its to answer.
    b->acked = next_seq_ - 1;
    StatusOr<std::unique_ptr<ClientSocket>> c = ConnectTo(e);
    if (c.ok()) {
      b->socket = std::move(c).value();
    } else {
      ++counters_.backup_connect_errors;
      b->broken = true;
      broken_.push_back(e);
      result = c.status().WithContext("backup " + e + " of epoch " +
                                      std::to_string(view.epoch) +
                                      " cannot be connected to (asking etcd "
                                      "to drop it; replies wait until then)");
    }
    next.push_back(std::move(b));
  }
  backups_ = std::move(next);
  if (backups_.empty() && !batch_.empty()) {
    // Alone now: nothing to wait for (the sums stay with the shard).
    ReleaseBatch(out);
  }
  Release(out);
  return result;
}

Status Replicator::Admit(RequestKind kind, TimePoint now,
                         std::string* redirect) {
  if (!WorkerDataRequest(kind)) return Status::OK();
  if (!view_.primary) {
    ++counters_.refused_not_primary;
    *redirect = view_.primary_endpoint;
    return Status::Unavailable(
        "not the primary of replica group " + std::to_string(options_.group) +
        " (epoch " + std::to_string(view_.epoch) + "); primary: " +
        (view_.primary_endpoint.empty() ? "unknown" : view_.primary_endpoint));
  }
  // A primary must know that etcd still holds its lease, or hear from its
  // backups: otherwise one of them may have been promoted already. With
  // backups answering it keeps serving while etcd is away (their refusal
  // of a stale epoch fences it); cut off from both (partitioned), it stops
  // taking writes once its lease may have ended.
  if (Write(kind) && view_.waiting_for_backups) {
    *redirect = "";
    return Status::Unavailable("replica group " +
                               std::to_string(options_.group) +
                               " is starting: its backups are not up yet");
  }
  const bool alone = std::none_of(
      backups_.begin(), backups_.end(),
      [](const std::unique_ptr<Backup>& b) { return !b->joining; });
  const bool backups_heard =
      !alone && now - last_ack_at_ < std::max(options_.suspect_after,
                                              std::chrono::milliseconds(500));
  if (Write(kind) && now >= view_.lease_valid_until && !backups_heard) {
    ++counters_.refused_no_lease;
    *redirect = "";
    return Status::Unavailable(
        "primary of replica group " + std::to_string(options_.group) +
        " cannot confirm its etcd lease" +
        (alone ? "" : " nor hear from its backups") + ": writes refused");
  }
  return Status::OK();
}

// An upload (kAssign) is handed on like a push: backups hold the values.
// So is every step of an elastic change that changes the shard, so a backup
// promoted during or after a change holds what its primary held.
bool HandedOn(const RequestHeader& req) {
  if (req.kind == RequestKind::kMigrate) {
    return req.migrate_op != MigrateOp::kDescribe &&
           req.migrate_op != MigrateOp::kExport;
  }
  return Write(req.kind);
}

bool Replicator::Replicates(const RequestHeader& req) const {
  return view_.primary && !backups_.empty() && HandedOn(req);
}

void Replicator::Forward(const Message& msg, OutgoingReply* hold,
                         std::vector<OutgoingReply>* out) {
  if (backups_.empty()) {
    if (hold != nullptr) out->push_back(std::move(*hold));
    return;
  }
  const RequestHeader h = NewReplicate();
  const uint64_t seq = h.id;
  SendToBackups(h, msg.frames);
  if (hold != nullptr) held_.push_back(Held{seq, std::move(*hold)});
}

RequestHeader Replicator::NewReplicate() {
  RequestHeader h;
  h.kind = RequestKind::kReplicate;
  h.id = next_seq_++;
  h.rank = -1;
  h.replicate_epoch = view_.epoch;
  h.replicate_group = options_.group;
  h.replica_sender = options_.name;
  h.replica_incarnation = options_.incarnation;
  if (mac_) {
    h.replica_session = mac_->session();
    h.replica_tag_all = options_.tag_coverage == Coverage::kAll;
  }
  return h;
}

bool Replicator::aggregating() const {
  return options_.aggregate_rounds && view_.primary && !backups_.empty();
}

bool Replicator::Batches(const RequestHeader& req,
                         bool shard_aggregates) const {
  return shard_aggregates && aggregating() && Replicates(req) &&
         ((req.kind == RequestKind::kPush && req.rows.empty()) ||
          req.kind == RequestKind::kClock);
}

void Replicator::Batch(const Message& msg, const RequestHeader& req,
                       OutgoingReply* hold, TimePoint now) {
  ++counters_.batched;
  batch_.push_back(Batched{msg.frames[0], std::move(*hold)});
  auto it = std::find_if(unclocked_.begin(), unclocked_.end(),
                         [&](const auto& e) { return e.first == req.rank; });
  if (req.kind == RequestKind::kClock) {
    if (it != unclocked_.end()) unclocked_.erase(it);
  } else if (it == unclocked_.end()) {
    unclocked_.emplace_back(req.rank, now);
  }
}

bool Replicator::RankAwaitsClock(TimePoint now) const {
  return std::any_of(unclocked_.begin(), unclocked_.end(), [&](const auto& e) {
    return now - e.second >= options_.flush_unclocked_after;
  });
}

void Replicator::ForwardRound(RoundSums sums, std::vector<OutgoingReply>* out) {
  if (backups_.empty()) {
    ReleaseBatch(out);
    return;
  }
  RequestHeader h = NewReplicate();
  const uint64_t seq = h.id;
  h.replicate_aggregate = true;
  h.replicate_requests = static_cast<uint32_t>(batch_.size());
  h.replicate_round = sums.round;
  std::vector<ByteView> frames;
  frames.reserve(batch_.size() + sums.frames.size());
  for (const Batched& b : batch_) frames.push_back(b.header);
  for (ByteView& f : sums.frames) frames.push_back(std::move(f));
  SendToBackups(h, frames);
  counters_.records_forwarded += backups_.size();
  for (Batched& b : batch_) held_.push_back(Held{seq, std::move(b.reply)});
  ClearBatch();
}

void Replicator::ForwardWorkers(std::vector<WorkerLiveness> states) {
  if (!view_.primary || backups_.empty() || states.empty()) return;
  RequestHeader h = NewReplicate();
  h.replicate_workers = std::move(states);
  SendToBackups(h, {});
  counters_.liveness_forwarded += backups_.size();
}

void Replicator::ReleaseBatch(std::vector<OutgoingReply>* out) {
  for (Batched& b : batch_) out->push_back(std::move(b.reply));
  ClearBatch();
}

void Replicator::ClearBatch() {
  batch_.clear();
  unclocked_.clear();
}

void Replicator::SendToBackups(const RequestHeader& h,
                               const std::vector<ByteView>& data) {
  const std::vector<uint8_t> header = EncodeRequest(h);
  const uint8_t* tag = Tag(h, header, data);  // one tag for every backup
  for (auto& b : backups_) {
    if (b->socket == nullptr) continue;  // not connected: it holds replies
    Status s = SendTo(*b, header, data, tag);
    if (!s.ok()) {
      // Its queue is full: it is far behind or gone. The reply waits until
      // it answers or the view drops it.
      LOG_EVERY_N(WARNING, 100)
          << "replicate to " << b->endpoint << ": " << s.ToString();
    }
    ++counters_.forwarded;
  }
}

Status Replicator::Authenticate(Message* msg, const RequestHeader& req,
                                ReplicaMember* sender) {
  const Status refused = Status::PermissionDenied(
      std::string(RequestKindName(req.kind)) +
      " refused: its sender is not authenticated as a member of replica "
      "group " +
      std::to_string(options_.group));
  if (!mac_) {
    const ReplicaMember* m = view_.MemberWithKey(msg->client_key);
    if (m == nullptr) {
      ++counters_.refused_sender;
      return refused;
    }
    *sender = *m;
    return Status::OK();
  }
  if (msg->frames.size() < 2) {
    ++counters_.refused_sender;
    return refused;
  }
  const ByteView& tag = msg->frames.back();
  std::vector<TagPiece> pieces;
  pieces.reserve(msg->frames.size() - 1);
  for (size_t i = 0; i + 1 < msg->frames.size(); ++i)
    pieces.emplace_back(msg->frames[i].data, msg->frames[i].size);
  // Snapshots, and everything when this replica is set to kAll, must be
  // tagged in full; the coverage is under the tag, so no one without the
  // secret can lower it.
  const bool need_all = req.kind == RequestKind::kSnapshot ||
                        options_.tag_coverage == Coverage::kAll;
  if ((need_all && !req.replica_tag_all) ||
      !mac_->Verify(req.replica_session, req.id, pieces,
                    req.replica_tag_all ? Coverage::kAll : Coverage::kHeader,
                    tag.data, tag.size)
           .ok()) {
    ++counters_.refused_sender;
    return refused;
  }
  msg->frames.pop_back();
  sender->name = req.replica_sender;
  sender->incarnation = req.replica_incarnation;
  const ReplicaMember* m =
      view_.Member(req.replica_sender, req.replica_incarnation);
  if (m != nullptr) *sender = *m;
  return Status::OK();
}

namespace {

bool Same(const ReplicaMember& a, const std::string& name,
          uint64_t incarnation) {
  return !name.empty() && a.name == name && a.incarnation == incarnation;
}

}  // namespace

Status Replicator::CheckReplicate(const RequestHeader& req,
                                  const ReplicaMember& sender) {
  // From the primary the view names, at its epoch. A spare that installed
  // a snapshot takes its primary's updates (from the snapshot's epoch on)
  // before the layout lists it. A request from a newer epoch than this
  // process has read comes from a primary that read a layout listing it (a
  // primary hands updates only to the backups its layout lists): this
  // process has not caught up yet (it is starting, say) and takes it, but
  // only from a live member of its group.
  // A spare that installed a snapshot at epoch E and was then listed (a
  // later epoch) takes updates the same primary still stamps with an epoch
  // from E on until it reads the layout that lists the spare: they come in
  // order from the process its view still names as primary, which no other
  // process has replaced in between (then the view would name that one).
  // Refused, the primary would drop the new backup as diverged.
  const bool from_primary =
      Same(sender, view_.primary_name, view_.primary_incarnation);
  const bool from_joined =
      joined_epoch_ > 0 && req.replicate_epoch >= joined_epoch_ &&
      Same(sender, joined_primary_.name, joined_primary_.incarnation);
  const bool from_member =
      sender.name != options_.name &&
      view_.Member(sender.name, sender.incarnation) != nullptr;
  const bool joined_primary_behind =
      from_joined && view_.backup &&
      Same(joined_primary_, view_.primary_name, view_.primary_incarnation);
  bool ok = false;
  if (req.replicate_epoch > view_.epoch) {
    ok = from_member;
  } else if (req.replicate_epoch == view_.epoch) {
    ok = (view_.backup && from_primary) ||
         (from_joined && (from_primary || view_.primary_name.empty()));
  } else {
    ok = joined_primary_behind;
  }
  if (view_.primary || !ok || req.replicate_group != options_.group) {
    ++counters_.refused_stale;
    return Status::FailedPrecondition(
        "replicate from epoch " + std::to_string(req.replicate_epoch) +
        " refused: this replica of group " + std::to_string(options_.group) +
        " is at epoch " + std::to_string(view_.epoch) +
        (view_.primary  ? " and is the primary"
         : view_.backup ? ""
                        : " and is not a backup") +
        (from_primary || from_joined || req.replicate_epoch > view_.epoch
             ? ""
             : ", and the sender is not its primary"));
  }
  // Only the primary's traffic (pings too) says it is alive.
  heard_at_ = std::chrono::steady_clock::now();
  heard_epoch_ = std::max(heard_epoch_, req.replicate_epoch);
  return Status::OK();
}

uint64_t Replicator::PrimarySuspected(TimePoint now) const {
  if (options_.suspect_after.count() == 0 || !view_.backup ||
      heard_epoch_ < view_.epoch || now - heard_at_ < options_.suspect_after)
    return 0;
  return view_.epoch;
}

void Replicator::Poll(std::vector<OutgoingReply>* out) {
  bool any = false;
  const auto now = std::chrono::steady_clock::now();
  if (view_.primary) {
    for (auto& b : backups_) {
      if (b->joining || b->socket == nullptr ||
          now - b->sent_at < options_.ping_every)
        continue;
      const RequestHeader h = NewReplicate();
      const std::vector<uint8_t> header = EncodeRequest(h);
      // A full queue: the backup is far behind.
      (void)SendTo(*b, header, {}, Tag(h, header, {}));
    }
  }
  for (auto& b : backups_) {
    while (b->socket != nullptr) {
      StatusOr<bool> got =
          b->socket->Receive(&msg_, std::chrono::milliseconds(0));
      if (!got.ok() || !*got) break;
      if (msg_.frames.empty()) continue;
      ReplyHeader r;
      Status d = DecodeReply(msg_.frames[0].data, msg_.frames[0].size, {}, &r);
      if (!d.ok()) {
        LOG_EVERY_N(WARNING, 100) << "undecodable ack from " << b->endpoint;
        continue;
      }
      ++counters_.acked;
      if (!b->joining) last_ack_at_ = now;
      if (b->joining && !r.status.ok()) {
        // The spare could not install the snapshot: drop it; it is offered
        // again after a pause.
        LOG(WARNING) << "spare " << b->endpoint
                     << " refused its snapshot: " << r.status.ToString();
        ++counters_.snapshots_failed;
        b->socket.reset();
        break;
      }
      if (!r.status.ok() || b->broken) {
        // The backup did not apply something this primary handed it (it
        // refused a stale epoch: this process was deposed; or it failed
        // the update): nothing after it counts either. Its acknowledgement
        // mark stays, so the replies wait until the view drops it.
        if (!b->broken) {
          b->broken = true;
          LOG(WARNING) << "backup " << b->endpoint << " did not apply update "
                       << r.id << ": " << r.status.ToString();
          if (r.status.code() != StatusCode::kFailedPrecondition)
            ++counters_.backup_errors;
          // Drop it from the layout (as primary; a deposed process's request
          // changes nothing): it comes back as a spare and is copied to.
          broken_.push_back(b->endpoint);
        }
        continue;
      }
      if (r.id > b->acked && r.id < next_seq_) b->acked = r.id;
      b->acked_at = now;
      b->ever_acked = true;
      if (b->joining && b->acked >= b->snapshot_seq) {
        b->joining = false;
        ++counters_.spares_joined;
        joined_.push_back(b->endpoint);
        LOG(INFO) << "spare " << b->endpoint
                  << " installed the snapshot: it is a backup now";
      }
      any = true;
    }
  }
  // A backup that answered nothing (it is pinged every ping_every) for
  // suspect_after while updates wait on it is gone or cut off: the layout
  // drops it (it comes back as a spare), so the replies it holds are
  // released without waiting for its etcd lease to end.
  if (view_.primary && options_.suspect_after.count() > 0) {
    for (auto& b : backups_) {
      // One that never answered yet is still connecting (with CURVE its
      // handshake waits until it read this primary's member record): it
      // gets four times as long.
      const auto patience =
          b->ever_acked ? options_.suspect_after : 4 * options_.suspect_after;
      if (b->joining || b->broken || b->silent || b->socket == nullptr ||
          b->acked + 1 >= next_seq_ || now - b->acked_at < patience)
        continue;
      b->silent = true;
      LOG(WARNING) << "backup " << b->endpoint << " silent for "
                   << std::chrono::duration_cast<std::chrono::milliseconds>(
                          now - b->acked_at)
                          .count()
                   << " ms: asking etcd to drop it";
      silent_.push_back(b->endpoint);
    }
  }
  // Spares whose snapshot failed (a listed backup that could not be
  // connected to stays: it holds replies until the view drops it).
  backups_.erase(std::remove_if(backups_.begin(), backups_.end(),
                                [](const std::unique_ptr<Backup>& b) {
                                  return b->joining && b->socket == nullptr;
                                }),
                 backups_.end());
  if (any) Release(out);
}

std::vector<std::string> Replicator::TakeJoiners(TimePoint now) {
  // A spare offered this long ago and still not a backup is offered again.
  constexpr auto kRetry = std::chrono::seconds(10);
  std::vector<std::string> out;
  if (!view_.primary) return out;
  for (const std::string& e : view_.spare_endpoints) {
    const bool connected = std::any_of(
        backups_.begin(), backups_.end(),
        [&](const std::unique_ptr<Backup>& b) { return b->endpoint == e; });
    if (connected) continue;
    auto it = std::find_if(offered_.begin(), offered_.end(),
                           [&](const auto& o) { return o.first == e; });
    if (it != offered_.end() && now - it->second < kRetry) continue;
    if (it == offered_.end()) {
      offered_.emplace_back(e, now);
    } else {
      it->second = now;
    }
    out.push_back(e);
  }
  return out;
}

std::vector<std::string> Replicator::TakeBroken() {
  std::vector<std::string> out;
  out.swap(broken_);
  return out;
}

std::vector<std::string> Replicator::TakeSilent() {
  std::vector<std::string> out;
  out.swap(silent_);
  return out;
}

std::vector<std::string> Replicator::TakeJoined() {
  std::vector<std::string> out;
  out.swap(joined_);
  return out;
}

Status Replicator::StartJoin(const std::string& endpoint,
                             const std::string& dir, size_t piece_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<std::string, uint64_t>> files;
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const uint64_t size = entry.file_size(ec);
    if (ec) break;
    files.emplace_back(entry.path().filename().string(), size);
    total += size;
  }
  if (ec) return Status::Unavailable("listing " + dir + ": " + ec.message());
  if (files.empty()) return Status::Internal("empty checkpoint in " + dir);
  std::sort(files.begin(), files.end());
  auto b = std::make_unique<Backup>();
  b->endpoint = endpoint;
  ASSIGN_OR_RETURN(b->socket, ConnectTo(endpoint));
  b->joining = true;
  b->acked = next_seq_ - 1;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& [name, size] = files[f];
    std::ifstream in(dir + "/" + name, std::ios::binary);
    if (!in) return Status::Unavailable("reading " + dir + "/" + name);
    uint64_t offset = 0;
    do {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(piece_bytes, size - offset));
      std::vector<uint8_t> bytes(n);
      if (n > 0 && !in.read(reinterpret_cast<char*>(bytes.data()),
                            static_cast<std::streamsize>(n))) {
        return Status::Unavailable("reading " + dir + "/" + name);
      }
      RequestHeader h = NewReplicate();
      h.kind = RequestKind::kSnapshot;
      h.snapshot_file = name;
      h.snapshot_offset = offset;
      h.snapshot_file_size = size;
      h.snapshot_total_bytes = total;
      offset += n;
      h.snapshot_last = f + 1 == files.size() && offset == size;
      h.replica_tag_all = mac_ != nullptr;  // a spare's whole store: every byte
      const std::vector<uint8_t> header = EncodeRequest(h);
      auto piece = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
      const std::vector<ByteView> data{
          ByteView{piece->data(), piece->size(), piece}};
      RETURN_IF_ERROR(SendTo(*b, header, data, Tag(h, header, data))
                          .WithContext("sending the snapshot to " + endpoint));
      b->snapshot_seq = h.id;
    } while (offset < size);
  }
  ++counters_.snapshots_sent;
  counters_.snapshot_bytes_sent += total;
  LOG(INFO) << "copying " << total << " bytes (" << files.size()
            << " files) of state to spare " << endpoint;
  backups_.push_back(std::move(b));
  return Status::OK();
}

Status Replicator::CheckSnapshot(const RequestHeader& req,
                                 const ReplicaMember& sender) {
  // A spare's whole store is replaced by what it installs: only from the
  // primary of its view's epoch, or of a newer epoch (this process has not
  // read that layout yet) from a live member of its group.
  const bool from_primary =
      Same(sender, view_.primary_name, view_.primary_incarnation);
  const bool from_member =
      sender.name != options_.name &&
      view_.Member(sender.name, sender.incarnation) != nullptr;
  const bool sender_ok =
      req.replicate_epoch > view_.epoch ? from_member : from_primary;
  if (view_.primary || view_.backup || req.replicate_epoch < view_.epoch ||
      req.replicate_group != options_.group || !sender_ok) {
    ++counters_.refused_stale;
    return Status::FailedPrecondition(
        "snapshot from epoch " + std::to_string(req.replicate_epoch) +
        " refused: this process of group " + std::to_string(options_.group) +
        " is " +
        (view_.primary  ? "its primary"
         : view_.backup ? "a backup"
                        : "") +
        (view_.primary || view_.backup
             ? ""
             : "at epoch " + std::to_string(view_.epoch)) +
        (sender_ok ? "" : ", and the sender is not its primary"));
  }
  return Status::OK();
}

std::vector<ClientSocket*> Replicator::wake_sockets() const {
  std::vector<ClientSocket*> v;
  for (const auto& b : backups_)
    if (b->socket != nullptr) v.push_back(b->socket.get());
  return v;
}

void Replicator::Release(std::vector<OutgoingReply>* out) {
  uint64_t all = next_seq_;  // without backups everything is released
  for (const auto& b : backups_) {
    if (!b->joining) all = std::min(all, b->acked + 1);
  }
  while (!held_.empty() && held_.front().seq < all) {
    out->push_back(std::move(held_.front().reply));
    held_.pop_front();
  }
}

}  // namespace asyncps::server::replication
