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
  ChangeReport rep;
  rep.command = add ? "add-shard" : "remove-shard";
  rep.endpoint = endpoint;
  if (endpoint.empty())
    return Status::InvalidArgument(rep.command + ": no endpoint");

  // 1. The document, or the static fleet's.
  StatusOr<std::optional<EtcdKeyValue>> kv = etcd->Get(Key());
  if (!kv.ok())
    return kv.status().WithContext("reading " + Key() + " from etcd");
  ElasticDoc doc;
  int64_t mod_revision = 0;
  const bool from_etcd = kv->has_value();
  if (from_etcd) {
    StatusOr<ElasticDoc> d = ElasticDoc::FromJson((*kv)->value);
    if (!d.ok()) return d.status().WithContext("etcd " + Key());
    doc = std::move(*d);
    mod_revision = (*kv)->mod_revision;
  } else {
    if (o.servers.empty()) {
      return Status::InvalidArgument(
          "no elastic layout in etcd at " + Key() +
          " yet: give the fleet's shard endpoints in shard order (--servers) "
          "for its first change, and the --etcd_prefix the fleet uses");
    }
    doc.servers = o.servers;
  }
  const uint64_t epoch = doc.epoch, next = doc.epoch + 1;
  rep.epoch_before = epoch;
  rep.epoch_after = next;

  // Participants: the shards that own chunks, and the one joining.
  std::vector<int> active = from_etcd ? doc.Active() : std::vector<int>();
  if (!from_etcd)
    for (size_t i = 0; i < doc.servers.size(); ++i)
      active.push_back(static_cast<int>(i));
  const auto pos = std::find(doc.servers.begin(), doc.servers.end(), endpoint);
  int index = static_cast<int>(pos - doc.servers.begin());
  const bool known = pos != doc.servers.end();
  const bool is_active = std::count(active.begin(), active.end(), index) > 0;
  if (add && is_active)
    return Status::InvalidArgument(endpoint + " is already shard " +
                                   std::to_string(index) + " of the fleet");
  if (!add && !known) {
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
  rep.shard = index;
  std::vector<std::string> servers = doc.servers;
  if (add && !known) servers.push_back(endpoint);
  std::vector<int> new_active = active;
  if (add) {
    new_active.push_back(index);
  } else {
    new_active.erase(std::find(new_active.begin(), new_active.end(), index));
  }
  std::sort(new_active.begin(), new_active.end());
  // Shard indexes, the one joining first (its checks say how to start it).
  std::vector<int> part = active;
  if (add) part.insert(part.begin(), index);
  std::vector<std::string> eps;
  for (int i : part) eps.push_back(servers[i]);

  // 2. Describe them.
  std::map<int, ShardView> views;
  auto describe_all = [&]() -> Status {
    for (int i : part) {
      ASSIGN_OR_RETURN(views[i], Describe(servers[i]));
    }
    return Status::OK();
  };
  RETURN_IF_ERROR(describe_all());
  const ShardView* first = nullptr;
  for (int i : part) {
    const ShardView& v = views[i];
    const std::string& ep = servers[i];
    if (add && i == index) {
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
      if (!from_etcd) doc.owners = v.owners;
    }
    if (v.num_chunks != first->num_chunks ||
        v.consistency != first->consistency)
      return Status::FailedPrecondition(
          ep + " holds a different model or consistency than " +
          servers[active[0]]);
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
  rep.consistency = first->consistency;
  for (int o_ : doc.owners)
    if (o_ < 0 || o_ >= static_cast<int>(doc.servers.size()))
      return Status::Corruption("a chunk owner outside the fleet");
  const std::vector<uint64_t> sizes = first->chunk_elems;
  const bool bsp = first->consistency == "bsp";
  // Sparse tables: key ranges. The first change of a static fleet of n
  // shards cuts the keys into n * kBucketsPerShard buckets, owned as the
  // static function routes them (common/sparse_table.h), so nothing moves
  // that Rebalance does not move.
  const bool sparse = first->sparse;
  std::vector<int> bucket_owners = doc.bucket_owners;
  uint32_t num_buckets = doc.num_buckets;
  if (sparse && num_buckets == 0) {
    if (from_etcd)
      return Status::FailedPrecondition(
          Key() + " has no key ranges, but the model has sparse tables");
    if (doc.servers.size() * kBucketsPerShard > kMaxBuckets)
      return Status::InvalidArgument("too many shards to cut sparse keys");
    const KeyRanges initial =
        KeyRanges::Static(static_cast<int>(doc.servers.size()));
    num_buckets = initial.num_buckets;
    bucket_owners = initial.owners;
  }

  // 3. New owners.
  const std::vector<int> owners = Rebalance(sizes, doc.owners, new_active);
  std::map<std::pair<int, int>, std::vector<uint32_t>>
      moves;  // (from, to) -> chunks
  std::set<int> receivers;
  for (uint32_t c = 0; c < owners.size(); ++c) {
    if (owners[c] == doc.owners[c]) continue;
    moves[{doc.owners[c], owners[c]}].push_back(c);
    receivers.insert(owners[c]);
    ++rep.moved_chunks;
  }
  std::vector<int> new_bucket_owners;
  std::map<std::pair<int, int>, std::vector<uint32_t>>
      bucket_moves;  // (from, to) -> buckets
  if (sparse) {
    new_bucket_owners = RebalanceBuckets(bucket_owners, new_active);
    for (uint32_t b = 0; b < num_buckets; ++b) {
      if (new_bucket_owners[b] == bucket_owners[b]) continue;
      bucket_moves[{bucket_owners[b], new_bucket_owners[b]}].push_back(b);
      receivers.insert(new_bucket_owners[b]);
      ++rep.moved_buckets;
    }
  }
  rep.active_before = active;
  rep.active_after = new_active;
  rep.imbalance_before = Imbalance(sizes, doc.owners, active);
  rep.imbalance_after = Imbalance(sizes, owners, new_active);
  if (add && receivers.count(index) == 0)
    return Status::FailedPrecondition(
        "no chunk would move to " + endpoint + ": the model's " +
        std::to_string(sizes.size()) +
        " chunk(s) are too few to spread further");
  LOG(INFO) << "elastic: " << rep.command << " " << endpoint << " (shard "
            << index << "): epoch " << epoch << " -> " << next << ", active {"
            << Join(active) << "} -> {" << Join(new_active) << "}, "
            << rep.moved_chunks << " chunk(s), " << rep.moved_buckets
            << " key-range bucket(s) move; imbalance " << rep.imbalance_before
            << " -> " << rep.imbalance_after;

  // 4. Freeze, with a later clock when a worker got past it.
  SteadyClock::time_point frozen_at;
  Status freeze_status;
  for (int attempt = 1; attempt <= o.freeze_attempts; ++attempt) {
    if (attempt > 1) {
      RETURN_IF_ERROR(describe_all());
    }
    // The first clock no worker has reached or pushed for: an idle fleet
    // (every worker at clock c, round c not started) freezes at c and is
    // drained at once; one with pushes for round c under way freezes at
    // c + 1, after that round. Each retry goes one further.
    int64_t first_free = 0;
    for (int i : part)
      if (views[i].registered)
        first_free = std::max(
            {first_free, views[i].max_clock, views[i].max_pushed_round + 1});
    rep.freeze_clock = bsp ? first_free + attempt - 1 : -1;
    rep.freeze_tries = attempt;
    frozen_at = SteadyClock::now();
    std::vector<std::string> frozen;
    freeze_status = Status::OK();
    for (const std::string& ep : eps) {
      RequestHeader req = Migrate(MigrateOp::kFreeze, next);
      req.migrate_at_clock = rep.freeze_clock;
      req.migrate_deadline_ms = o.freeze_deadline_ms;
      freeze_status = Call(ep, req);
      if (!freeze_status.ok()) break;
      frozen.push_back(ep);
    }
    if (freeze_status.ok()) break;
    // Abort on every shard, the refusing one too (a freeze that reached it
    // but whose reply was lost would otherwise hold it until its deadline).
    AbortAll(eps, next);
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

  // Everything from here on aborts every shard when it fails.
  auto fail = [&](Status s) -> Status {
    AbortAll(eps, next);
    return s;
  };

  // 5. Wait until nothing is half applied.
  const auto drain_deadline = SteadyClock::now() + o.drain_timeout;
  for (;;) {
    std::string waiting;
    for (size_t k = 0; k < eps.size(); ++k) {
      StatusOr<ShardView> v = Describe(eps[k]);
      if (!v.ok()) return fail(v.status().WithContext("waiting for the drain"));
      if (v->registered && !v->frozen)
        return fail(
            Status::FailedPrecondition(eps[k] +
                                       " is no longer frozen (its freeze "
                                       "deadline passed?)"));
      if (v->registered && !v->drained)
        waiting += (waiting.empty() ? "" : ", ") + eps[k];
    }
    if (waiting.empty()) break;
    if (SteadyClock::now() > drain_deadline) {
      return fail(Status::TimedOut("shards not drained within " +
                                   std::to_string(o.drain_timeout.count()) +
                                   " ms of the freeze at clock " +
                                   std::to_string(rep.freeze_clock) + ": " +
                                   waiting));
    }
    std::this_thread::sleep_for(o.drain_poll);
  }
  rep.drain_ms = MsSince(frozen_at);

  // 6. Copy the chunks that move, per (source, destination), in requests
  // of at most max_request_bytes.
  const auto copy_start = SteadyClock::now();
  for (const auto& [route, chunks] : moves) {
    const std::string& from = servers[route.first];
    const std::string& to = servers[route.second];
    size_t k = 0;
    while (k < chunks.size()) {
      std::vector<uint32_t> batch;
      uint64_t bytes = 0;
      while (k < chunks.size()) {
        const uint64_t b = sizes[chunks[k]] * 16;
        if (!batch.empty() && bytes + b > o.max_request_bytes) break;
        batch.push_back(chunks[k++]);
        bytes += b;
      }
      ReplyHeader reply;
      Message msg;
      Status s = Call(from, Migrate(MigrateOp::kExport, next, batch), {},
                      &reply, &msg);
      if (!s.ok()) return fail(s.WithContext("export of chunks to " + to));
      if (msg.frames.size() != batch.size() + 3) {
        return fail(Status::Corruption(
            from + ": export of " + std::to_string(batch.size()) +
            " chunk(s) answered " + std::to_string(msg.frames.size() - 1) +
            " data frame(s), not " + std::to_string(batch.size() + 2)));
      }
      std::vector<ByteView> data(msg.frames.begin() + 1, msg.frames.end());
      for (size_t f = 3; f < msg.frames.size(); ++f)
        rep.moved_bytes += msg.frames[f].size;
      ReplyHeader ireply;
      Message imsg;
      s = Call(to, Migrate(MigrateOp::kImport, next, batch), data, &ireply,
               &imsg);
      if (!s.ok()) return fail(s.WithContext("import of chunks from " + from));
    }
  }
  // A shard that joins with key ranges but no chunk still needs the layout
  // and the clocks: an export of no chunks carries both.
  bool gets_chunks = false;
  for (const auto& [route, chunks] : moves)
    gets_chunks |= route.second == index;
  if (add && !gets_chunks && !bucket_moves.empty()) {
    const std::string& from = servers[active[0]];
    ReplyHeader reply;
    Message msg;
    Status s =
        Call(from, Migrate(MigrateOp::kExport, next, {}), {}, &reply, &msg);
    if (!s.ok())
      return fail(s.WithContext("export of the layout to " + endpoint));
    if (msg.frames.size() != 3)
      return fail(Status::Corruption(
          from + ": an export of no chunks answered " +
          std::to_string(msg.frames.size() - 1) + " data frame(s), not 2"));
    std::vector<ByteView> data(msg.frames.begin() + 1, msg.frames.end());
    ReplyHeader ireply;
    Message imsg;
    s = Call(endpoint, Migrate(MigrateOp::kImport, next, {}), data, &ireply,
             &imsg);
    if (!s.ok())
      return fail(s.WithContext("import of the layout from " + from));
  }
  for (const auto& [route, buckets] : bucket_moves) {
    Status s = CopyRows(
        servers[route.first], servers[route.second], next, num_buckets, buckets,
        RowsPerBucketBytes(views[route.first], bucket_owners, route.first),
        &rep);
    if (!s.ok()) return fail(s);
  }
  rep.copy_ms =
      std::chrono::duration<double, std::milli>(SteadyClock::now() - copy_start)
          .count();

  // 7. Commit: etcd decides the flip once.
  ElasticDoc next_doc;
  next_doc.epoch = next;
  next_doc.servers = servers;
  next_doc.owners = owners;
  if (sparse) {
    next_doc.num_buckets = num_buckets;
    next_doc.bucket_owners = new_bucket_owners;
  }
  const std::string text = next_doc.ToJson();
  StatusOr<bool> cas = etcd->CompareAndPut(Key(), text, mod_revision);
  if (!cas.ok()) {
    // The answer may have been lost after etcd applied it: look.
    StatusOr<std::optional<EtcdKeyValue>> now = etcd->Get(Key());
    if (now.ok() && now->has_value() && (*now)->value == text) {
      cas = true;
    } else {
      return fail(cas.status().WithContext("committing " + Key() + " in etcd"));
    }
  }
  if (!*cas) {
    return fail(Status::FailedPrecondition(
        Key() +
        " changed in etcd during the move (another ps_ctl?): nothing changed"));
  }

  // 8. Adopt: receivers first (they must hold their chunks before the
  // others stop serving them), then everyone else.
  std::vector<std::string> order;
  for (int r : receivers) order.push_back(servers[r]);
  for (const std::string& ep : eps)
    if (std::find(order.begin(), order.end(), ep) == order.end())
      order.push_back(ep);
  for (const std::string& ep : order) {
    RequestHeader req = Migrate(MigrateOp::kAdopt, next);
    req.migrate_doc = text;
    Status s;
    for (int t = 0; t < 3; ++t) {
      s = Call(ep, req);
      if (s.ok() || s.code() == StatusCode::kFailedPrecondition) break;
    }
    if (!s.ok()) {
      LOG(ERROR) << "elastic: adopt of epoch " << next << " by " << ep << ": "
                 << s.ToString();
      rep.adopt_failures.push_back(s.ToString());
    }
  }
  rep.frozen_ms = MsSince(frozen_at);
  LOG(INFO) << "elastic: epoch " << next << " adopted: " << rep.moved_chunks
            << " chunk(s), " << rep.moved_bytes << " bytes moved; frozen "
            << rep.frozen_ms << " ms (drain " << rep.drain_ms << " ms, copy "
            << rep.copy_ms << " ms)";
  return rep;
}

}  // namespace asyncps::server::elastic
