#include "server/elastic/coordinator.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "common/etcd_client.h"
#include "common/sparse_table.h"
#include "common/wire.h"
#include "server/elastic/elastic_doc.h"

namespace asyncps::server::elastic {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double MsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t)
      .count();
}

// One shard's answer to kDescribe (see common/protocol.capnp, Migrate).
struct ShardView {
  int shard = -1;
  uint64_t epoch = 0;
  bool registered = false;
  std::string consistency;
  bool frozen = false;
  bool drained = false;
  int64_t max_clock = 0;
  int64_t max_pushed_round = -1;  // BSP: the latest round with a push
  uint32_t num_chunks = 0;
  std::vector<uint64_t> chunk_elems;
  std::vector<int> owners;
  bool sparse = false;        // the model has sparse tables
  uint32_t num_buckets = 0;   // key ranges served (0: static)
  uint64_t sparse_bytes = 0;  // rows held (estimate)
};

StatusOr<ShardView> ParseDescribe(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption("describe: not a JSON object: " +
                              text.substr(0, 200));
  ShardView v;
  try {
    v.shard = j.at("shard").get<int>();
    v.registered = j.at("registered").get<bool>();
    if (!v.registered) return v;
    v.epoch = j.value("epoch", uint64_t{0});
    v.consistency = j.at("consistency").get<std::string>();
    v.frozen = j.value("frozen", false);
    v.drained = j.value("drained", false);
    v.max_clock = j.value("max_clock", int64_t{0});
    // A shard that does not say is taken to have a push in its newest round.
    v.max_pushed_round = j.value("max_pushed_round", v.max_clock);
    v.num_chunks = j.at("num_chunks").get<uint32_t>();
    v.chunk_elems = j.at("chunk_elems").get<std::vector<uint64_t>>();
    v.owners = j.at("owners").get<std::vector<int>>();
    v.sparse = j.value("sparse_tables", false);
    v.num_buckets = j.value("num_buckets", uint32_t{0});
    v.sparse_bytes = j.value("sparse_bytes", uint64_t{0});
  } catch (const json::exception& e) {
    return Status::Corruption(std::string("describe: ") + e.what());
  }
  if (v.chunk_elems.size() != v.num_chunks || v.owners.size() != v.num_chunks)
    return Status::Corruption(
        "describe: chunk_elems/owners do not list num_chunks entries");
  return v;
}

RequestHeader Migrate(MigrateOp op, uint64_t epoch,
                      std::vector<uint32_t> chunks = {}) {
  RequestHeader req;
  req.migrate_op = op;
  req.migrate_epoch = epoch;
  req.migrate_chunks = std::move(chunks);
  return req;
}

RequestHeader MigrateRows(MigrateOp op, uint64_t epoch, uint32_t num_buckets,
                          std::vector<uint32_t> buckets) {
  RequestHeader req = Migrate(op, epoch);
  req.migrate_num_buckets = num_buckets;
  req.migrate_buckets = std::move(buckets);
  return req;
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

std::string ChangeReport::ToJson() const {
  nlohmann::ordered_json j;
  j["command"] = command;
  j["ok"] = adopt_failures.empty();
  j["endpoint"] = endpoint;
  j["shard"] = shard;
  j["epoch_before"] = epoch_before;
  j["epoch"] = epoch_after;
  j["active_before"] = active_before;
  j["active"] = active_after;
  j["consistency"] = consistency;
  j["freeze_clock"] = freeze_clock;
  j["freeze_tries"] = freeze_tries;
  j["moved_chunks"] = moved_chunks;
  j["moved_bytes"] = moved_bytes;
  j["moved_buckets"] = moved_buckets;
  j["moved_rows"] = moved_rows;
  j["moved_row_bytes"] = moved_row_bytes;
  j["frozen_ms"] = frozen_ms;
  j["drain_ms"] = drain_ms;
  j["copy_ms"] = copy_ms;
  j["imbalance_before"] = imbalance_before;
  j["imbalance_after"] = imbalance_after;
  j["adopt_failures"] = adopt_failures;
  return j.dump();
}

// What one change of the fleet carries from each step of
// Coordinator::Impl::Change to the next.
struct ChangeState {
  bool add = false;
  std::string endpoint;
  ChangeReport rep;
  // 1. The document (or the static fleet's) and the participants.
  ElasticDoc doc;
  int64_t mod_revision = 0;
  bool from_etcd = false;
  uint64_t epoch = 0, next = 0;
  std::vector<int> active, new_active;
  int index = 0;  // the shard joining or leaving
  bool known = false;
  std::vector<std::string> servers;
  std::vector<int> part;         // shard indexes, the one joining first
  std::vector<std::string> eps;  // their endpoints
  // 2. Their descriptions, and the model's as the first registered one
  // described it.
  std::map<int, ShardView> views;
  std::vector<uint64_t> sizes;
  bool bsp = false;
  bool sparse = false;
  std::vector<int> bucket_owners;
  uint32_t num_buckets = 0;
  // 3. The new owners and what moves.
  std::vector<int> owners;
  std::map<std::pair<int, int>, std::vector<uint32_t>>
      moves;  // (from, to) -> chunks
  std::set<int> receivers;
  std::vector<int> new_bucket_owners;
  std::map<std::pair<int, int>, std::vector<uint32_t>>
      bucket_moves;  // (from, to) -> buckets
  // 4. When the freeze began; 6. when the copy began; 7. the committed
  // document.
  SteadyClock::time_point frozen_at;
  SteadyClock::time_point copy_start;
  std::string text;
};

struct Coordinator::Impl {
  CoordinatorOptions o;
  std::unique_ptr<EtcdClient> etcd;
  std::map<std::string, std::unique_ptr<ClientSocket>> sockets;
  uint64_t next_id = 1;

  std::string Key() const { return o.etcd_prefix + "/elastic"; }

  // The member of a replica group ("ep1|ep2|...") believed its primary.
  std::map<std::string, size_t> primary_of;

  StatusOr<ClientSocket*> Socket(const std::string& ep) {
    auto it = sockets.find(ep);
    if (it == sockets.end()) {
      ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> s,
                       ClientSocket::Connect(ep, o.transport));
      it = sockets.emplace(ep, std::move(s)).first;
    }
    return it->second.get();
  }

  // One request to the shard at `ep` with `data` frames after the header;
  // the reply's header in `reply`, its frames in `msg`. Transport failures
  // and the shard's own error both come back as the Status, naming `ep`.
  // A replica group ("ep1|ep2|...", ps_server --replicas) is asked through
  // its primary: a member that is not (Unavailable from a replica, epoch >
  // 0) names the primary, or is asked again shortly while its group
  // changes; a member silent for kMemberSilence is left for the next. Each
  // step is safe to send again (describe and export read; freeze, import,
  // adopt and abort of one epoch are idempotent), and a backup promoted
  // meanwhile holds what its primary applied (every step that changes a
  // shard is replicated before it is answered).
  Status Call(const std::string& ep, RequestHeader req,
              const std::vector<ByteView>& data, ReplyHeader* reply,
              Message* msg) {
    constexpr std::chrono::milliseconds kMemberSilence{1000};
    constexpr std::chrono::milliseconds kReplicaRetry{25};
    std::vector<std::string> members;
    for (size_t at = 0; at <= ep.size();) {
      size_t bar = ep.find('|', at);
      if (bar == std::string::npos) bar = ep.size();
      if (bar > at) members.push_back(ep.substr(at, bar - at));
      at = bar + 1;
    }
    if (members.empty()) return Status::InvalidArgument("empty endpoint");
    size_t& member = primary_of[ep];
    req.rank = -1;
    req.kind = RequestKind::kMigrate;
    const auto deadline = SteadyClock::now() + o.request_timeout;
    for (;;) {
      const std::string& to = members[member % members.size()];
      ASSIGN_OR_RETURN(ClientSocket * sock, Socket(to));
      req.id = next_id++;
      std::vector<Frame> frames;
      frames.push_back(Frame::Owned(EncodeRequest(req)));
      for (const ByteView& v : data)
        frames.push_back(Frame::Ref(v.data, v.size, v.owner));
      RETURN_IF_ERROR(sock->Send(frames).WithContext(to));
      auto until = deadline;
      if (members.size() > 1)
        until = std::min(until, SteadyClock::now() + kMemberSilence);
      bool answered = false;
      while (!answered) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - SteadyClock::now());
        if (left.count() <= 0) break;
        msg->Clear();
        ASSIGN_OR_RETURN(bool got, sock->Receive(msg, left));
        if (!got) continue;
        RETURN_IF_ERROR(msg->error.WithContext(to));
        if (msg->frames.empty())
          return Status::Corruption(to + ": empty reply");
        RETURN_IF_ERROR(DecodeReply(msg->frames[0].data, msg->frames[0].size,
                                    DecodeLimits(), reply)
                            .WithContext(to));
        answered = reply->id == req.id;  // else a late reply to an earlier call
      }
      if (SteadyClock::now() >= deadline && !answered) {
        return Status::Unavailable(ep + ": no reply within " +
                                   std::to_string(o.request_timeout.count()) +
                                   " ms (is a ps_server running there?)");
      }
      if (!answered) {  // silent: the next member of the group
        ++member;
        continue;
      }
      if (reply->status.code() == StatusCode::kUnavailable &&
          reply->epoch > 0 && reply->retry_ms == 0 &&
          SteadyClock::now() < deadline) {
        auto named = std::find(members.begin(), members.end(), reply->redirect);
        if (named != members.end() && *named != to) {
          member = static_cast<size_t>(named - members.begin());
        } else {
          std::this_thread::sleep_for(kReplicaRetry);
        }
        continue;
      }
      return reply->status.WithContext(ep);
    }
  }

  Status Call(const std::string& ep, const RequestHeader& req) {
    ReplyHeader reply;
    Message msg;
    return Call(ep, req, {}, &reply, &msg);
  }

  StatusOr<ShardView> Describe(const std::string& ep) {
    ReplyHeader reply;
    Message msg;
    RETURN_IF_ERROR(
        Call(ep, Migrate(MigrateOp::kDescribe, 0), {}, &reply, &msg));
    StatusOr<ShardView> v = ParseDescribe(reply.text);
    if (!v.ok()) return v.status().WithContext(ep);
    return v;
  }

  // Best effort: every shard in `eps` back on its old layout.
  void AbortAll(const std::vector<std::string>& eps, uint64_t epoch) {
    for (const std::string& ep : eps) {
      Status s = Call(ep, Migrate(MigrateOp::kAbort, epoch));
      if (!s.ok())
        LOG(WARNING) << "elastic: abort of " << ep << ": " << s.ToString();
    }
  }

  StatusOr<ChangeReport> Change(bool add, const std::string& endpoint);
  // The steps of Change, in order; each reads and fills `st`.
  Status ReadLayout(ChangeState* st);
  Status ChooseParticipants(ChangeState* st);
  Status DescribeAll(ChangeState* st);
  Status CheckShards(ChangeState* st);
  Status PlanMoves(ChangeState* st);
  Status Freeze(ChangeState* st);
  // Steps 5-7: a failure leaves every shard frozen (Change aborts them).
  Status Drain(ChangeState* st);
  Status CopyChunks(ChangeState* st);
  Status CopyLayoutToJoiner(ChangeState* st);
  Status CopyBuckets(ChangeState* st);
  Status Commit(ChangeState* st);
  void Adopt(ChangeState* st);

  // Bytes of rows per bucket on shard `shard` (an estimate from its
  // describe), at least 1.
  static uint64_t RowsPerBucketBytes(const ShardView& v,
                                     const std::vector<int>& bucket_owners,
                                     int shard) {
    const uint64_t held = static_cast<uint64_t>(
        std::count(bucket_owners.begin(), bucket_owners.end(), shard));
    return v.sparse_bytes / std::max<uint64_t>(held, 1) + 1;
  }

  // Copies the rows of `buckets` (of num_buckets) from `from` to `to`, in
  // exports of about max_request_bytes by the estimate `per_bucket`; an
  // export the source finds too large is asked again with half the
  // buckets.
  Status CopyRows(const std::string& from, const std::string& to,
                  uint64_t epoch, uint32_t num_buckets,
                  const std::vector<uint32_t>& buckets, uint64_t per_bucket,
                  ChangeReport* rep) {
    size_t per_request = static_cast<size_t>(std::clamp<uint64_t>(
        o.max_request_bytes / per_bucket, 1, buckets.size()));
    size_t k = 0;
    while (k < buckets.size()) {
      const size_t n = std::min(per_request, buckets.size() - k);
      std::vector<uint32_t> batch(buckets.begin() + k, buckets.begin() + k + n);
      ReplyHeader reply;
      Message msg;
      Status s =
          Call(from, MigrateRows(MigrateOp::kExport, epoch, num_buckets, batch),
               {}, &reply, &msg);
      if (s.code() == StatusCode::kResourceExhausted && n > 1) {
        per_request = n / 2;
        continue;
      }
      if (!s.ok()) return s.WithContext("export of rows to " + to);
      if (msg.frames.size() < 3) {
        return Status::Corruption(from + ": an export of rows answered " +
                                  std::to_string(msg.frames.size() - 1) +
                                  " data frame(s)");
      }
      const json j =
          json::parse(reply.text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) {
        rep->moved_rows += j.value("rows", uint64_t{0});
        rep->moved_row_bytes += j.value("bytes", uint64_t{0});
      }
      std::vector<ByteView> data(msg.frames.begin() + 1, msg.frames.end());
      ReplyHeader ireply;
      Message imsg;
      s = Call(to, MigrateRows(MigrateOp::kImport, epoch, num_buckets, batch),
               data, &ireply, &imsg);
      if (!s.ok()) return s.WithContext("import of rows from " + from);
      k += n;
    }
    return Status::OK();
  }
};

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() = default;

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  if (options.etcd_endpoints.empty())
    return Status::InvalidArgument(
        "elastic shards need etcd: no etcd endpoint given");
  if (options.etcd_prefix.empty() || options.etcd_prefix[0] != '/')
    return Status::InvalidArgument("the etcd prefix must start with '/'");
  if (options.freeze_attempts < 1 || options.request_timeout.count() < 1 ||
      options.max_request_bytes < 1)
    return Status::InvalidArgument(
        "freeze_attempts, request_timeout and max_request_bytes must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  if (!impl->o.transport.context)
    impl->o.transport.context = Context::Create(1);
  EtcdOptions eo;
  eo.endpoints = options.etcd_endpoints;
  eo.security = options.etcd_security;
  ASSIGN_OR_RETURN(impl->etcd, EtcdClient::Create(eo));
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

StatusOr<ChangeReport> Coordinator::AddShard(const std::string& endpoint) {
  return impl_->Change(/*add=*/true, endpoint);
}

StatusOr<ChangeReport> Coordinator::RemoveShard(const std::string& endpoint) {
  return impl_->Change(/*add=*/false, endpoint);
}

StatusOr<ChangeReport> Coordinator::Impl::Change(bool add,
                                                 const std::string& endpoint) {
  ChangeState st;
  st.add = add;
  st.endpoint = endpoint;
  st.rep.command = add ? "add-shard" : "remove-shard";
  st.rep.endpoint = endpoint;
  if (endpoint.empty())
    return Status::InvalidArgument(st.rep.command + ": no endpoint");

  RETURN_IF_ERROR(ReadLayout(&st));          // 1.
  RETURN_IF_ERROR(ChooseParticipants(&st));  // 1.
  RETURN_IF_ERROR(CheckShards(&st));         // 2.
  RETURN_IF_ERROR(PlanMoves(&st));           // 3.
  RETURN_IF_ERROR(Freeze(&st));              // 4.

  // Everything from here on aborts every shard when it fails.
  Status s = Drain(&st);            // 5.
  if (s.ok()) s = CopyChunks(&st);  // 6.
  if (s.ok()) s = CopyLayoutToJoiner(&st);
  if (s.ok()) s = CopyBuckets(&st);
  if (s.ok()) s = Commit(&st);  // 7.
  if (!s.ok()) {
    AbortAll(st.eps, st.next);
    return s;
  }
  Adopt(&st);  // 8.
  return st.rep;
}

// 1. The document, or the static fleet's.
Status Coordinator::Impl::ReadLayout(ChangeState* st) {
  StatusOr<std::optional<EtcdKeyValue>> kv = etcd->Get(Key());
  if (!kv.ok())
    return kv.status().WithContext("reading " + Key() + " from etcd");
  st->from_etcd = kv->has_value();
  if (st->from_etcd) {
    StatusOr<ElasticDoc> d = ElasticDoc::FromJson((*kv)->value);
    if (!d.ok()) return d.status().WithContext("etcd " + Key());
    st->doc = std::move(*d);
    st->mod_revision = (*kv)->mod_revision;
  } else {
    if (o.servers.empty()) {
      return Status::InvalidArgument(
          "no elastic layout in etcd at " + Key() +
          " yet: give the fleet's shard endpoints in shard order (--servers) "
          "for its first change, and the --etcd_prefix the fleet uses");
    }
    st->doc.servers = o.servers;
  }
  st->epoch = st->doc.epoch;
  st->next = st->doc.epoch + 1;
  st->rep.epoch_before = st->epoch;
  st->rep.epoch_after = st->next;
  return Status::OK();
}

// Participants: the shards that own chunks, and the one joining.
Status Coordinator::Impl::ChooseParticipants(ChangeState* st) {
  const bool add = st->add;
  const std::string& endpoint = st->endpoint;
  const ElasticDoc& doc = st->doc;
  std::vector<int>& active = st->active;
  if (st->from_etcd) {
    active = doc.Active();
  } else {
    for (size_t i = 0; i < doc.servers.size(); ++i)
      active.push_back(static_cast<int>(i));
  }
  const auto pos = std::find(doc.servers.begin(), doc.servers.end(), endpoint);
  const int index = static_cast<int>(pos - doc.servers.begin());
  st->index = index;
  st->known = pos != doc.servers.end();
  const bool is_active = std::count(active.begin(), active.end(), index) > 0;
  if (add && is_active)
    return Status::InvalidArgument(endpoint + " is already shard " +
                                   std::to_string(index) + " of the fleet");
  if (!add && !st->known) {
    std::string list;
    for (const std::string& s : doc.servers)
      list += (list.empty() ? "" : ", ") + s;
    return Status::InvalidArgument(endpoint + " is not a shard of the fleet (" +
                                   list + ")");
  }
  if (!add && !is_active)
    return Status::InvalidArgument(
        endpoint + " (shard " + std::to_string(index) +
        ") holds no chunk: it already left the fleet");
  if (!add && active.size() < 2)
    return Status::InvalidArgument("cannot remove " + endpoint +
                                   ": it is the only shard holding chunks");
  st->rep.shard = index;
  st->servers = doc.servers;
  if (add && !st->known) st->servers.push_back(endpoint);
  st->new_active = active;
  if (add) {
    st->new_active.push_back(index);
  } else {
    st->new_active.erase(
        std::find(st->new_active.begin(), st->new_active.end(), index));
  }
  std::sort(st->new_active.begin(), st->new_active.end());
  // Shard indexes, the one joining first (its checks say how to start it).
  st->part = active;
  if (add) st->part.insert(st->part.begin(), index);
  for (int i : st->part) st->eps.push_back(st->servers[i]);
  return Status::OK();
}

Status Coordinator::Impl::DescribeAll(ChangeState* st) {
  for (int i : st->part) {
    ASSIGN_OR_RETURN(st->views[i], Describe(st->servers[i]));
  }
  return Status::OK();
}

// 2. Describe them.
Status Coordinator::Impl::CheckShards(ChangeState* st) {
  RETURN_IF_ERROR(DescribeAll(st));
  ElasticDoc& doc = st->doc;
  const std::vector<std::string>& servers = st->servers;
  const int index = st->index;
  const uint64_t epoch = st->epoch;
  const ShardView* first = nullptr;
  for (int i : st->part) {
    const ShardView& v = st->views[i];
    const std::string& ep = servers[i];
    if (st->add && i == index) {
      if (v.shard != index) {
        return Status::InvalidArgument(
            ep + " was started as shard " + std::to_string(v.shard) +
            "; the fleet has " + std::to_string(doc.servers.size()) +
            " shard(s), so the one joining it must be " + "started as shard " +
            std::to_string(index) +
            ": ps_server --shard_id=" + std::to_string(index) +
            " --num_shards=" + std::to_string(servers.size()) +
            " --endpoint=" + ep + " (with the fleet's other server flags)");
      }
      if (v.registered)
        return Status::FailedPrecondition(
            ep +
            " already holds a model: a shard joins empty (start it without "
            "an old --db_path)");
      continue;
    }
    if (v.shard != i)
      return Status::FailedPrecondition(
          ep + " answers as shard " + std::to_string(v.shard) +
          ", the layout says shard " + std::to_string(i));
    if (!v.registered)
      return Status::FailedPrecondition(
          ep +
          " holds no model yet: change the fleet once "
          "the workers registered theirs");
    if (v.frozen)
      return Status::FailedPrecondition(
          ep +
          " is frozen by another change (or one that died: it aborts by itself "
          "within its freeze deadline); try again later");
    if (v.epoch != epoch)
      return Status::FailedPrecondition(
          ep + " serves layout epoch " + std::to_string(v.epoch) + ", etcd's " +
          Key() + " says " + std::to_string(epoch));
    if (first == nullptr) {
      first = &v;
      if (!st->from_etcd) doc.owners = v.owners;
    }
    if (v.num_chunks != first->num_chunks ||
        v.consistency != first->consistency)
      return Status::FailedPrecondition(
          ep + " holds a different model or consistency than " +
          servers[st->active[0]]);
    if (v.owners != doc.owners)
      return Status::FailedPrecondition(
          ep + "'s chunk owners differ from the layout of epoch " +
          std::to_string(epoch));
    if (v.num_buckets != doc.num_buckets)
      return Status::FailedPrecondition(
          ep + " cuts sparse keys into " + std::to_string(v.num_buckets) +
          " buckets, the layout of epoch " + std::to_string(epoch) + " into " +
          std::to_string(doc.num_buckets));
  }
  if (first == nullptr)
    return Status::Internal("no registered shard described");
  st->rep.consistency = first->consistency;
  for (int o_ : doc.owners)
    if (o_ < 0 || o_ >= static_cast<int>(doc.servers.size()))
      return Status::Corruption("a chunk owner outside the fleet");
  st->sizes = first->chunk_elems;
  st->bsp = first->consistency == "bsp";
  // Sparse tables: key ranges. The first change of a static fleet of n
  // shards cuts the keys into n * kBucketsPerShard buckets, owned as the
  // static function routes them (common/sparse_table.h), so nothing moves
  // that Rebalance does not move.
  st->sparse = first->sparse;
  st->bucket_owners = doc.bucket_owners;
  st->num_buckets = doc.num_buckets;
  if (st->sparse && st->num_buckets == 0) {
    if (st->from_etcd)
      return Status::FailedPrecondition(
          Key() + " has no key ranges, but the model has sparse tables");
    if (doc.servers.size() * kBucketsPerShard > kMaxBuckets)
      return Status::InvalidArgument("too many shards to cut sparse keys");
    const KeyRanges initial =
        KeyRanges::Static(static_cast<int>(doc.servers.size()));
    st->num_buckets = initial.num_buckets;
    st->bucket_owners = initial.owners;
  }
  return Status::OK();
}

// 3. New owners.
Status Coordinator::Impl::PlanMoves(ChangeState* st) {
  const ElasticDoc& doc = st->doc;
  ChangeReport& rep = st->rep;
  st->owners = Rebalance(st->sizes, doc.owners, st->new_active);
  const std::vector<int>& owners = st->owners;
  for (uint32_t c = 0; c < owners.size(); ++c) {
    if (owners[c] == doc.owners[c]) continue;
    st->moves[{doc.owners[c], owners[c]}].push_back(c);
    st->receivers.insert(owners[c]);
    ++rep.moved_chunks;
  }
  if (st->sparse) {
    st->new_bucket_owners = RebalanceBuckets(st->bucket_owners, st->new_active);
    for (uint32_t b = 0; b < st->num_buckets; ++b) {
      if (st->new_bucket_owners[b] == st->bucket_owners[b]) continue;
      st->bucket_moves[{st->bucket_owners[b], st->new_bucket_owners[b]}]
          .push_back(b);
      st->receivers.insert(st->new_bucket_owners[b]);
      ++rep.moved_buckets;
    }
  }
  rep.active_before = st->active;
  rep.active_after = st->new_active;
  rep.imbalance_before = Imbalance(st->sizes, doc.owners, st->active);
  rep.imbalance_after = Imbalance(st->sizes, owners, st->new_active);
  if (st->add && st->receivers.count(st->index) == 0)
    return Status::FailedPrecondition(
        "no chunk would move to " + st->endpoint + ": the model's " +
        std::to_string(st->sizes.size()) +
        " chunk(s) are too few to spread further");
  LOG(INFO) << "elastic: " << rep.command << " " << st->endpoint << " (shard "
            << st->index << "): epoch " << st->epoch << " -> " << st->next
            << ", active {" << Join(st->active) << "} -> {"
            << Join(st->new_active) << "}, " << rep.moved_chunks
            << " chunk(s), " << rep.moved_buckets
            << " key-range bucket(s) move; imbalance " << rep.imbalance_before
            << " -> " << rep.imbalance_after;
  return Status::OK();
}

// 4. Freeze, with a later clock when a worker got past it.
Status Coordinator::Impl::Freeze(ChangeState* st) {
  ChangeReport& rep = st->rep;
  Status freeze_status;
  for (int attempt = 1; attempt <= o.freeze_attempts; ++attempt) {
    if (attempt > 1) {
      RETURN_IF_ERROR(DescribeAll(st));
    }
    // The first clock no worker has reached or pushed for: an idle fleet
    // (every worker at clock c, round c not started) freezes at c and is
    // drained at once; one with pushes for round c under way freezes at
    // c + 1, after that round. Each retry goes one further.
    int64_t first_free = 0;
    for (int i : st->part) {
      const ShardView& v = st->views[i];
      if (v.registered)
        first_free =
            std::max({first_free, v.max_clock, v.max_pushed_round + 1});
    }
    rep.freeze_clock = st->bsp ? first_free + attempt - 1 : -1;
    rep.freeze_tries = attempt;
    st->frozen_at = SteadyClock::now();
    freeze_status = Status::OK();
    for (const std::string& ep : st->eps) {
      RequestHeader req = Migrate(MigrateOp::kFreeze, st->next);
      req.migrate_at_clock = rep.freeze_clock;
      req.migrate_deadline_ms = o.freeze_deadline_ms;
      freeze_status = Call(ep, req);
      if (!freeze_status.ok()) break;
    }
    if (freeze_status.ok()) break;
    // Abort on every shard, the refusing one too (a freeze that reached it
    // but whose reply was lost would otherwise hold it until its deadline).
    AbortAll(st->eps, st->next);
    LOG(WARNING) << "elastic: freeze at clock " << rep.freeze_clock << " (try "
                 << attempt << "): " << freeze_status.ToString();
    if (freeze_status.code() != StatusCode::kFailedPrecondition)
      return freeze_status;
  }
  if (!freeze_status.ok()) {
    return Status::FailedPrecondition(
        "workers kept passing the freeze clock (" +
        std::to_string(o.freeze_attempts) +
        " tries): " + freeze_status.ToString());
  }
  return Status::OK();
}

// 5. Wait until nothing is half applied.
Status Coordinator::Impl::Drain(ChangeState* st) {
  const std::vector<std::string>& eps = st->eps;
  const auto drain_deadline = SteadyClock::now() + o.drain_timeout;
  for (;;) {
    std::string waiting;
    for (size_t k = 0; k < eps.size(); ++k) {
      StatusOr<ShardView> v = Describe(eps[k]);
      if (!v.ok()) return v.status().WithContext("waiting for the drain");
      if (v->registered && !v->frozen)
        return Status::FailedPrecondition(eps[k] +
                                          " is no longer frozen (its freeze "
                                          "deadline passed?)");
      if (v->registered && !v->drained)
        waiting += (waiting.empty() ? "" : ", ") + eps[k];
    }
    if (waiting.empty()) break;
    if (SteadyClock::now() > drain_deadline) {
      return Status::TimedOut("shards not drained within " +
                              std::to_string(o.drain_timeout.count()) +
                              " ms of the freeze at clock " +
                              std::to_string(st->rep.freeze_clock) + ": " +
                              waiting);
    }
    std::this_thread::sleep_for(o.drain_poll);
  }
  st->rep.drain_ms = MsSince(st->frozen_at);
  return Status::OK();
}

// 6. Copy the chunks that move, per (source, destination), in requests
// of at most max_request_bytes.
Status Coordinator::Impl::CopyChunks(ChangeState* st) {
  st->copy_start = SteadyClock::now();
  for (const auto& [route, chunks] : st->moves) {
    const std::string& from = st->servers[route.first];
    const std::string& to = st->servers[route.second];
    size_t k = 0;
    while (k < chunks.size()) {
      std::vector<uint32_t> batch;
      uint64_t bytes = 0;
      while (k < chunks.size()) {
        const uint64_t b = st->sizes[chunks[k]] * 16;
        if (!batch.empty() && bytes + b > o.max_request_bytes) break;
        batch.push_back(chunks[k++]);
        bytes += b;
      }
      ReplyHeader reply;
      Message msg;
      Status s = Call(from, Migrate(MigrateOp::kExport, st->next, batch), {},
                      &reply, &msg);
      if (!s.ok()) return s.WithContext("export of chunks to " + to);
      if (msg.frames.size() != batch.size() + 3) {
        return Status::Corruption(
            from + ": export of " + std::to_string(batch.size()) +
            " chunk(s) answered " + std::to_string(msg.frames.size() - 1) +
            " data frame(s), not " + std::to_string(batch.size() + 2));
      }
      std::vector<ByteView> data(msg.frames.begin() + 1, msg.frames.end());
      for (size_t f = 3; f < msg.frames.size(); ++f)
        st->rep.moved_bytes += msg.frames[f].size;
      ReplyHeader ireply;
      Message imsg;
      s = Call(to, Migrate(MigrateOp::kImport, st->next, batch), data, &ireply,
               &imsg);
      if (!s.ok()) return s.WithContext("import of chunks from " + from);
    }
  }
  return Status::OK();
}

// A shard that joins with key ranges but no chunk still needs the layout
// and the clocks: an export of no chunks carries both.
Status Coordinator::Impl::CopyLayoutToJoiner(ChangeState* st) {
  bool gets_chunks = false;
  for (const auto& [route, chunks] : st->moves)
    gets_chunks |= route.second == st->index;
  if (!st->add || gets_chunks || st->bucket_moves.empty()) return Status::OK();
  const std::string& from = st->servers[st->active[0]];
  ReplyHeader reply;
  Message msg;
  Status s =
      Call(from, Migrate(MigrateOp::kExport, st->next, {}), {}, &reply, &msg);
  if (!s.ok()) return s.WithContext("export of the layout to " + st->endpoint);
  if (msg.frames.size() != 3)
    return Status::Corruption(from + ": an export of no chunks answered " +
                              std::to_string(msg.frames.size() - 1) +
                              " data frame(s), not 2");
  std::vector<ByteView> data(msg.frames.begin() + 1, msg.frames.end());
  ReplyHeader ireply;
  Message imsg;
  s = Call(st->endpoint, Migrate(MigrateOp::kImport, st->next, {}), data,
           &ireply, &imsg);
  if (!s.ok()) return s.WithContext("import of the layout from " + from);
  return Status::OK();
}

// The key-range buckets that move, then the copy's time.
Status Coordinator::Impl::CopyBuckets(ChangeState* st) {
  for (const auto& [route, buckets] : st->bucket_moves) {
    RETURN_IF_ERROR(CopyRows(st->servers[route.first],
                             st->servers[route.second], st->next,
                             st->num_buckets, buckets,
                             RowsPerBucketBytes(st->views[route.first],
                                                st->bucket_owners, route.first),
                             &st->rep));
  }
  st->rep.copy_ms = MsSince(st->copy_start);
  return Status::OK();
}

// 7. Commit: etcd decides the flip once.
Status Coordinator::Impl::Commit(ChangeState* st) {
  ElasticDoc next_doc;
  next_doc.epoch = st->next;
  next_doc.servers = st->servers;
  next_doc.owners = st->owners;
  if (st->sparse) {
    next_doc.num_buckets = st->num_buckets;
    next_doc.bucket_owners = st->new_bucket_owners;
  }
  st->text = next_doc.ToJson();
  StatusOr<bool> cas = etcd->CompareAndPut(Key(), st->text, st->mod_revision);
  if (!cas.ok()) {
    // The answer may have been lost after etcd applied it: look.
    StatusOr<std::optional<EtcdKeyValue>> now = etcd->Get(Key());
    if (now.ok() && now->has_value() && (*now)->value == st->text) {
      cas = true;
    } else {
      return cas.status().WithContext("committing " + Key() + " in etcd");
    }
  }
  if (!*cas) {
    return Status::FailedPrecondition(
        Key() +
        " changed in etcd during the move (another ps_ctl?): nothing changed");
  }
  return Status::OK();
}

// 8. Adopt: receivers first (they must hold their chunks before the
// others stop serving them), then everyone else.
void Coordinator::Impl::Adopt(ChangeState* st) {
  ChangeReport& rep = st->rep;
  std::vector<std::string> order;
  for (int r : st->receivers) order.push_back(st->servers[r]);
  for (const std::string& ep : st->eps)
    if (std::find(order.begin(), order.end(), ep) == order.end())
      order.push_back(ep);
  for (const std::string& ep : order) {
    RequestHeader req = Migrate(MigrateOp::kAdopt, st->next);
    req.migrate_doc = st->text;
    Status s;
    for (int t = 0; t < 3; ++t) {
      s = Call(ep, req);
      if (s.ok() || s.code() == StatusCode::kFailedPrecondition) break;
    }
    if (!s.ok()) {
      LOG(ERROR) << "elastic: adopt of epoch " << st->next << " by " << ep
                 << ": " << s.ToString();
      rep.adopt_failures.push_back(s.ToString());
    }
  }
  rep.frozen_ms = MsSince(st->frozen_at);
  LOG(INFO) << "elastic: epoch " << st->next << " adopted: " << rep.moved_chunks
            << " chunk(s), " << rep.moved_bytes << " bytes moved; frozen "
            << rep.frozen_ms << " ms (drain " << rep.drain_ms << " ms, copy "
            << rep.copy_ms << " ms)";
}

}  // namespace asyncps::server::elastic
