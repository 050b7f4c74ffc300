// ElasticRouter (worker/client/elastic_router.h): adopting elastic layouts,
// rerouting refused requests, and the etcd reads behind both.
#include "worker/client/elastic_router.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/etcd_client.h"
#include "common/hash.h"
#include "worker/client/core.h"

namespace asyncps::worker::client {

using std::chrono::milliseconds;

Status ElasticRouter::Adopt(ClientCore& core, const std::string& text) {
  ASSIGN_OR_RETURN(ElasticDoc doc, ElasticDoc::FromJson(text));
  if (doc.epoch <= epoch_) return Status::OK();  // known already
  if (!core.has_layout())
    return Status::FailedPrecondition("elastic layout before Register()");
  const Layout& layout = core.layout();
  if (doc.owners.size() != layout.chunks().size() ||
      doc.servers.size() < options_.servers.size()) {
    return Status::Corruption(
        "elastic layout of epoch " + std::to_string(doc.epoch) + " lists " +
        std::to_string(doc.owners.size()) + " chunks and " +
        std::to_string(doc.servers.size()) + " shards; this client has " +
        std::to_string(layout.chunks().size()) + " and " +
        std::to_string(options_.servers.size()));
  }
  RETURN_IF_ERROR(core.ConnectJoined(doc.servers));
  ASSIGN_OR_RETURN(Layout l, layout.WithOwners(doc.owners, core.num_shards()));
  core.SetLayout(std::move(l));
  if (doc.num_buckets > 0) {
    // Rows of sparse tables go by the document's key ranges from now on.
    auto ranges = std::make_shared<KeyRanges>();
    ranges->num_buckets = doc.num_buckets;
    ranges->owners = doc.bucket_owners;
    key_ranges_ = std::move(ranges);
  }
  epoch_ = doc.epoch;
  active_ = doc.Active();
  LOG(INFO) << "elastic layout epoch " << doc.epoch << ": " << active_.size()
            << " shards own chunks or key ranges";
  // A shard that joined took the workers' clocks from the shards it copied
  // from; this worker's later clocks reach it as Reroute() resends them.
  return Status::OK();
}

void ElasticRouter::KeepNewestDoc(const std::string& text) {
  StatusOr<ElasticDoc> got = ElasticDoc::FromJson(text);
  if (!got.ok()) return;  // Adopt() of the held one reports errors
  if (!register_doc_.empty()) {
    StatusOr<ElasticDoc> held = ElasticDoc::FromJson(register_doc_);
    if (held.ok() && held->epoch >= got->epoch) return;
  }
  register_doc_ = text;
}

StatusOr<std::vector<int>> ElasticRouter::ShardsFromEtcd(ClientCore& core) {
  if (options_.etcd_endpoints.empty() || epoch_ > 0) return core.AllShards();
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
    return core.AllShards();
  }
  if (!kv->has_value()) return core.AllShards();  // a fleet that never changed
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
  RETURN_IF_ERROR(core.ConnectJoined(doc->servers));
  KeepNewestDoc((*kv)->value);
  LOG(INFO) << "elastic layout epoch " << doc->epoch
            << " from etcd: " << doc->Active().size() << " of "
            << doc->servers.size() << " shards own chunks or key ranges";
  return doc->Active();
}

bool ElasticRouter::RedirectAllowed(int shard,
                                    const std::vector<std::string>& members,
                                    const std::string& endpoint,
                                    SteadyClock::time_point now) {
  if (std::find(members.begin(), members.end(), endpoint) != members.end())
    return true;
  auto refused = refused_redirects_.find(endpoint);
  if (refused != refused_redirects_.end() && now < refused->second)
    return false;
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
      member = j.is_object() &&
               j.value("endpoint", std::string()) == endpoint &&
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

std::map<int, std::vector<RowsSent>> ElasticRouter::SplitRows(
    const ClientCore& core, const std::vector<RowsSent>& rows) const {
  std::map<int, std::vector<RowsSent>> out;
  for (const RowsSent& rs : rows) {
    const size_t dim = core.tables()[rs.table].dim;
    const uint64_t* keys = reinterpret_cast<const uint64_t*>(rs.keys->data());
    std::map<int, std::vector<uint32_t>> picked;  // shard -> indices in rs
    for (size_t j = 0; j < rs.n; ++j)
      picked[core.ShardOfRow(rs.table, keys[j])].push_back(
          static_cast<uint32_t>(j));
    for (const auto& [shard, idx] : picked) {
      RowsSent part{rs.table,
                    idx.size(),
                    Buffer::Allocate(idx.size() * sizeof(uint64_t)),
                    nullptr,
                    rs.plan_shard,
                    rs.plan_part,
                    {}};
      uint64_t* k = reinterpret_cast<uint64_t*>(part.keys->data());
      if (rs.grads)
        part.grads = Buffer::Allocate(idx.size() * dim * sizeof(float));
      for (size_t i = 0; i < idx.size(); ++i) {
        k[i] = keys[idx[i]];
        if (rs.grads)
          std::memcpy(part.grads->floats() + i * dim,
                      rs.grads->floats() + idx[i] * dim, dim * sizeof(float));
        part.subset.push_back(rs.subset.empty() ? idx[i] : rs.subset[idx[i]]);
      }
      out[shard].push_back(std::move(part));
    }
  }
  return out;
}

void ElasticRouter::RerouteClock(ClientCore& core, const Pending& p) {
  // Sent again to every shard of the new layout, but only once every push
  // of an earlier step has been acknowledged: a clock of c tells a shard
  // that this worker's pushes of steps < c are there, and under BSP one
  // that arrived first would close the round without them.
  bool known = false;
  for (const DeferredClock& d : deferred_clocks_) {
    known = known || (d.ticket == p.ticket && d.clock == p.clock);
  }
  if (!known) {
    deferred_clocks_.push_back({p.ticket, p.clock});
    core.FindTicket(p.ticket)->remaining++;
  }
  FlushDeferredClocks(core);
}

void ElasticRouter::Reroute(ClientCore& core, Pending p,
                            const std::string& doc) {
  TicketState& t = *core.FindTicket(p.ticket);
  Status s = Adopt(core, doc);
  if (s.ok() && p.kind == RequestKind::kClock) {
    RerouteClock(core, p);
    return;
  }
  if (s.ok() && p.kind != RequestKind::kPush && p.kind != RequestKind::kPull) {
    s = Status::FailedPrecondition(std::string(RequestKindName(p.kind)) +
                                   " refused for a stale layout");
  }
  const Layout& layout = core.layout();
  std::map<int, std::vector<size_t>> by_shard;
  const size_t n = p.kind == RequestKind::kPush ? p.refs.size() : p.ids.size();
  for (size_t i = 0; s.ok() && i < n; ++i) {
    const uint32_t id =
        p.kind == RequestKind::kPush ? p.refs[i].chunk : p.ids[i];
    by_shard[layout.chunks()[id].shard].push_back(i);
  }
  // Rows go by the key ranges adopted: each part split by its keys' new
  // owners (pulled rows still land where the ticket's plan says).
  std::map<int, std::vector<RowsSent>> rows_by_shard;
  if (s.ok()) rows_by_shard = SplitRows(core, p.rows);
  for (const auto& entry : rows_by_shard) by_shard[entry.first];
  const bool push = p.kind == RequestKind::kPush;
  for (const auto& [shard, items] : by_shard) {
    if (!s.ok()) break;
    RequestHeader h = core.NewHeader(p.kind);
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
      h.pull_base_seq = core.shard(shard).pull_seq;
      h.pull_dense = !items.empty();  // else rows only
      for (size_t i : items) h.pull_chunks.push_back(p.ids[i]);
    }
    std::vector<RowsSent> sent;
    auto rit = rows_by_shard.find(shard);
    if (rit != rows_by_shard.end()) {
      sent = std::move(rit->second);
      s = core.AddRows(sent, push, &h, &frames);
      if (!s.ok()) break;
    }
    s = core.Enqueue(p.ticket, shard, h, std::move(frames), std::move(sent));
    if (!s.ok()) return;  // Enqueue abandoned the ticket
  }
  if (!s.ok() && t.status.ok()) t.status = s;
}

void ElasticRouter::FlushDeferredClocks(ClientCore& core) {
  for (size_t i = 0; i < deferred_clocks_.size();) {
    const DeferredClock d = deferred_clocks_[i];
    if (core.PushInFlightBefore(d.clock)) {
      ++i;
      continue;
    }
    deferred_clocks_.erase(deferred_clocks_.begin() +
                           static_cast<std::ptrdiff_t>(i));
    if (core.FindTicket(d.ticket) == nullptr) continue;  // abandoned meanwhile
    RequestHeader h = core.NewHeader(RequestKind::kClock);
    h.clock = d.clock;
    Status s;
    for (int shard : core.AllShards()) {
      s = core.Enqueue(d.ticket, shard, h, std::vector<Frame>(1));
      if (!s.ok()) break;  // Enqueue abandoned the ticket
    }
    if (TicketState* t = core.FindTicket(d.ticket)) t->remaining--;
  }
}

}  // namespace asyncps::worker::client
