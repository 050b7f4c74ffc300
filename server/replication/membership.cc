#include "server/replication/membership.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/etcd_client.h"
#include "server/replication/replica_auth.h"

namespace asyncps::server::replication {

using SteadyClock = std::chrono::steady_clock;

namespace {

struct Member {
  std::string endpoint;
  uint64_t incarnation = 0;
  int group = -1;
  std::string replica_key;  // Z85, "" without CURVE
  std::string server_key;
};

std::string MemberValue(const MembershipOptions& o, uint64_t incarnation) {
  nlohmann::json j;
  j["endpoint"] = o.endpoint;
  j["group"] = o.group;
  j["replica"] = o.replica;
  j["incarnation"] = incarnation;
  if (!o.replica_key.empty()) j["replica_key"] = o.replica_key;
  if (!o.server_key.empty()) j["server_key"] = o.server_key;
  return j.dump();
}

bool ParseMember(const std::string& value, Member* m) {
  // A member record is a few hundred bytes; anything much larger is not one.
  if (value.size() > 4096) return false;
  nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    m->endpoint = j.at("endpoint").get<std::string>();
    m->incarnation = j.at("incarnation").get<uint64_t>();
    m->group = j.at("group").get<int>();
    m->replica_key = j.value("replica_key", std::string());
    m->server_key = j.value("server_key", std::string());
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

}  // namespace

Membership::Membership(const MembershipOptions& options)
    : options_(options), name_(ReplicaName(options.group, options.replica)) {}

Membership::~Membership() { Stop(false); }

StatusOr<std::unique_ptr<Membership>> Membership::Create(
    const MembershipOptions& options) {
  if (options.etcd_endpoints.empty())
    return Status::InvalidArgument("membership needs etcd endpoints");
  if (options.groups < 1 || options.replicas < 1 || options.group < 0 ||
      options.group >= options.groups || options.replica < 0 ||
      options.replica >= options.replicas) {
    return Status::InvalidArgument(
        "replica " + std::to_string(options.replica) + " of group " +
        std::to_string(options.group) + " out of range (" +
        std::to_string(options.groups) + " groups x " +
        std::to_string(options.replicas) + " replicas)");
  }
  if (options.endpoint.empty())
    return Status::InvalidArgument("membership needs this process's endpoint");
  if (options.lease_ttl.count() <= 0 || options.poll.count() <= 0 ||
      options.poll >= options.lease_ttl) {
    return Status::InvalidArgument(
        "membership: poll must be positive and shorter than the lease TTL");
  }
  std::unique_ptr<Membership> m(new Membership(options));
  EtcdOptions eo;
  eo.endpoints = options.etcd_endpoints;
  eo.request_timeout = options.request_timeout;
  eo.security = options.etcd_security;
  ASSIGN_OR_RETURN(m->etcd_, EtcdClient::Create(eo));
  m->incarnation_ =
      options.incarnation != 0 ? options.incarnation : RandomIncarnation();
  m->member_value_ = MemberValue(options, m->incarnation_);
  m->started_ = SteadyClock::now();
  // etcd may still be starting: a few tries.
  Status s;
  for (int i = 0; i < 20; ++i) {
    s = m->Join();
    if (s.ok() || !s.IsRetryable()) break;
    std::this_thread::sleep_for(options.poll);
  }
  RETURN_IF_ERROR(s.WithContext("joining the fleet in etcd"));
  if (options.group_secret_in_etcd) {
    RETURN_IF_ERROR(m->FetchGroupSecret().WithContext(
        "reading the group's replica secret in etcd"));
  }
  // The first view before returning: a step that lost a race for the
  // layout key (every member binds its incarnation at start) publishes
  // none, and a replica without a view would refuse its primary.
  for (int i = 0; i < 20; ++i) {
    RETURN_IF_ERROR(m->Step(SteadyClock::now()));
    MutexLock l(&m->mu_);
    if (m->published_ > 0) break;
  }
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

Status Membership::Join() {
  const auto sent = SteadyClock::now();
  ASSIGN_OR_RETURN(lease_, etcd_->GrantLease(options_.lease_ttl));
  RETURN_IF_ERROR(
      etcd_->Put(options_.prefix + "/members/" + name_, member_value_, lease_)
          .status());
  {
    MutexLock l(&mu_);
    view_.lease_valid_until = sent + options_.lease_ttl;
  }
  const ReplicaLayout initial =
      ReplicaLayout::Initial(options_.groups, options_.replicas);
  ASSIGN_OR_RETURN(
      bool created,
      etcd_->CompareAndPut(options_.prefix + "/layout", initial.ToJson(), 0));
  LOG(INFO) << "member " << name_ << " joined (lease " << lease_ << ")"
            << (created ? ", created the layout" : "");
  return Status::OK();
}

Status Membership::FetchGroupSecret() {
  // Created with the group by whichever member comes first (create-only),
  // read by the others: every member ends up with the same one.
  const std::string key =
      options_.prefix + "/secrets/g" + std::to_string(options_.group);
  Status last;
  for (int i = 0; i < 20; ++i) {
    StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(key);
    if (kv.ok() && kv->has_value()) {
      StatusOr<std::string> secret = SecretFromHex((*kv)->value);
      if (!secret.ok()) {
        return Status::Corruption("the replica secret at " + key +
                                  " is not one: " + secret.status().message());
      }
      group_secret_ = std::move(secret).value();
      return Status::OK();
    }
    if (kv.ok()) {
      ASSIGN_OR_RETURN(std::string fresh, NewReplicaSecret());
      StatusOr<bool> put = etcd_->CompareAndPut(key, SecretToHex(fresh), 0);
      if (put.ok()) continue;  // read what won
      last = put.status();
    } else {
      last = kv.status();
    }
    if (!last.IsRetryable()) return last;
    std::this_thread::sleep_for(options_.poll);
  }
  return last;
}

Status Membership::KeepAlive(SteadyClock::time_point now) {
  std::chrono::milliseconds left{0};
  Status s = etcd_->KeepAlive(lease_, &left);
  if (s.code() == StatusCode::kNotFound) {
    // etcd let the lease go (we were away longer than its TTL): whatever
    // the layout says of us now was decided without us. Join again.
    ++counters_.lease_renewals;
    LOG(WARNING) << "etcd lease of " << name_ << " expired; joining again";
    return Join();
  }
  if (!s.ok()) {
    ++counters_.keepalive_failures;
    return s;
  }
  MutexLock l(&mu_);
  view_.lease_valid_until = now + std::min(left, options_.lease_ttl);
  return Status::OK();
}

namespace {

bool ListedIn(const GroupLayout& gl, const std::string& n) {
  return gl.primary == n ||
         std::find(gl.backups.begin(), gl.backups.end(), n) != gl.backups.end();
}

}  // namespace

// What one Step carries from each of its parts to the next.
struct Membership::StepState {
  SteadyClock::time_point now;
  std::string layout_key;
  EtcdKeyValue kv;  // the layout key as read
  ReplicaLayout layout;
  std::map<std::string, Member> alive;  // member name -> its member key
  const std::map<std::string, uint64_t>* seen = nullptr;  // Membership::seen_
  bool grace_over = false;
  GroupLayout* g = nullptr;  // this process's group, in `layout`
  bool me_listed = false;
  bool was_primary = false;
  // Backups the replicator asked to drop (DropBackup), taken for this step;
  // given back if the layout changed under it (another group's write won):
  // lost, a silent backup would stay listed until its lease ended, and the
  // primary's acknowledgements wait for it meanwhile.
  std::vector<std::pair<std::string, bool>> broken;
  std::vector<std::string> add;  // spares taken from add_backups_
  uint64_t dropped = 0;
  bool change = false;  // roles changed: a new epoch
  bool bind = false;    // only incarnations bound

  GroupLayout* GroupOf(const std::string& n) {
    for (GroupLayout& gl : layout.groups)
      if (ListedIn(gl, n)) return &gl;
    return nullptr;
  }
  bool IsAlive(const std::string& n) const {
    auto it = alive.find(n);
    if (it == alive.end()) return false;
    auto s = seen->find(n);
    return s == seen->end() || s->second == it->second.incarnation;
  }
  bool Gone(const std::string& n) const {
    if (n.empty()) return true;
    if (IsAlive(n)) return false;
    return seen->count(n) > 0 || grace_over;
  }
};

Status Membership::Step(SteadyClock::time_point now) {
  if (now >= next_keepalive_) {
    RETURN_IF_ERROR(KeepAlive(now));  // a failed one is tried next step
    const std::chrono::milliseconds every = options_.keepalive_every.count() > 0
                                                ? options_.keepalive_every
                                                : options_.lease_ttl / 4;
    next_keepalive_ = now + std::max(every, options_.poll);
  }
  StepState st;
  st.now = now;
  st.seen = &seen_;
  bool read_again = false;
  RETURN_IF_ERROR(ReadLayout(&st, &read_again));
  if (read_again) return Status::OK();
  BindMembers(&st);
  ChangeRoles(&st);
  ListAddedBackups(&st);
  bool written = true;
  RETURN_IF_ERROR(WriteLayout(&st, &written));
  if (!written) return Status::OK();
  PublishView(st);
  return Status::OK();
}

Status Membership::ReadLayout(StepState* st, bool* read_again) {
  st->layout_key = options_.prefix + "/layout";
  const std::string& layout_key = st->layout_key;
  const std::string members = options_.prefix + "/members/";
  // The layout key and the member keys in one read: "<prefix>/layout" sorts
  // right before "<prefix>/members/", which ends before "<prefix>/members0".
  ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs,
                   etcd_->GetRange(layout_key, options_.prefix + "/members0"));
  std::optional<EtcdKeyValue> kv;
  for (EtcdKeyValue& k : kvs) {
    if (k.key == layout_key) kv = std::move(k);
  }
  if (!kv) {
    // Deleted by hand: put the initial layout back (create-only).
    const ReplicaLayout initial =
        ReplicaLayout::Initial(options_.groups, options_.replicas);
    ASSIGN_OR_RETURN(bool created,
                     etcd_->CompareAndPut(layout_key, initial.ToJson(), 0));
    (void)created;
    ASSIGN_OR_RETURN(kv, etcd_->Get(layout_key));
    if (!kv) return Status::Unavailable("layout key vanished");
  }
  ASSIGN_OR_RETURN(st->layout, ReplicaLayout::FromJson(kv->value));
  ReplicaLayout& layout = st->layout;
  const size_t have = layout.groups.size();
  if (static_cast<size_t>(options_.group) == have &&
      options_.groups == options_.group + 1) {
    // The fleet's next group, joining it (ps_ctl add-shard: a shard started
    // with --shard_id=N --num_shards=N+1): appended to the layout, its
    // replica 0 the primary, as in a new fleet. Written once (the
    // compare-and-swap); the others of the group read it next time.
    const ReplicaLayout one =
        ReplicaLayout::Initial(options_.groups, options_.replicas);
    layout.groups.push_back(one.groups[static_cast<size_t>(options_.group)]);
    layout.groups.back().epoch = ++layout.epoch;
    ASSIGN_OR_RETURN(
        bool appended,
        etcd_->CompareAndPut(layout_key, layout.ToJson(), kv->mod_revision));
    if (appended) {
      LOG(INFO) << "member " << name_ << " added group " << options_.group
                << " to the replica layout (epoch " << layout.epoch << ")";
    }
    *read_again = true;
    return Status::OK();  // read again next time
  }
  if (static_cast<size_t>(options_.group) >= have ||
      static_cast<size_t>(options_.groups) > have) {
    // Groups join one at a time, each started for as many groups as there
    // are with it (fewer than later); more is a process of another fleet.
    return Status::FailedPrecondition(
        "layout in etcd has " + std::to_string(have) +
        " groups, this process was started for " +
        std::to_string(options_.groups) + " as group " +
        std::to_string(options_.group));
  }
  const size_t cut = members.size();
  for (const EtcdKeyValue& m : kvs) {
    Member mem;
    if (m.key.size() <= cut || m.key.compare(0, cut, members) != 0 ||
        !ParseMember(m.value, &mem))
      continue;
    st->alive[m.key.substr(cut)] = mem;
  }
  st->kv = std::move(*kv);
  return Status::OK();
}

// Who is who. A listed name stands for the process its incarnation is
// bound to (before it is bound, for the first one seen under it); any
// other process under that name lost what it held and is a spare. An
// unlisted live process is a spare.
void Membership::BindMembers(StepState* st) {
  st->grace_over = st->now - started_ >= options_.startup_grace;
  st->g = &st->layout.groups[options_.group];
  GroupLayout& g = *st->g;
  for (const auto& [n, m] : st->alive) {
    GroupLayout* gl = st->GroupOf(n);
    if (gl == nullptr) {
      seen_[n] = m.incarnation;
    } else if (gl->incarnations.count(n)) {
      seen_[n] = gl->incarnations.at(n);
    } else {
      seen_.emplace(n, m.incarnation);
    }
  }
  st->me_listed =
      ListedIn(g, name_) && (g.incarnations.count(name_) == 0 ||
                             g.incarnations.at(name_) == incarnation_);

  st->was_primary = g.primary == name_ && st->me_listed;
  if (st->me_listed && g.incarnations.count(name_) == 0) {
    g.incarnations[name_] = incarnation_;
    seen_[name_] = incarnation_;
    st->bind = true;
  }
}

void Membership::ChangeRoles(StepState* st) {
  const GroupLayout& g = *st->g;
  uint64_t suspect = 0;
  {
    MutexLock l(&mu_);
    suspect = suspect_epoch_;
  }
  const bool suspected = suspect == g.epoch && suspect > 0;
  if (st->me_listed && g.primary != name_ &&
      (st->Gone(g.primary) || suspected)) {
    TakeOverIfFirst(st);
  } else if (st->me_listed && g.primary == name_) {
    DropBrokenBackups(st);
  } else if (!st->me_listed && st->Gone(g.primary) &&
             std::none_of(
                 g.backups.begin(), g.backups.end(),
                 [st](const std::string& b) { return st->IsAlive(b); }) &&
             (g.primary.empty() || g.primary == name_)) {
    ResumeLoneGroup(st);
  }
}

// A backup whose primary is gone or silent: the first live backup takes
// over.
void Membership::TakeOverIfFirst(StepState* st) {
  GroupLayout& g = *st->g;
  std::string first;
  for (const std::string& b : g.backups) {
    if (st->IsAlive(b)) {
      first = b;
      break;
    }
  }
  if (first != name_) return;
  GroupLayout next;
  next.primary = name_;
  for (const std::string& b : g.backups)
    if (b != name_ && !st->Gone(b)) next.backups.push_back(b);
  LOG(WARNING) << "primary " << (g.primary.empty() ? "?" : g.primary)
               << " of group " << options_.group
               << (st->Gone(g.primary) ? " is gone: " : " is silent: ") << name_
               << " takes over (epoch " << st->layout.epoch + 1 << ")";
  if (!st->Gone(g.primary)) ++counters_.suspicions;
  for (const auto& [n, i] : g.incarnations) {
    if (n == next.primary || ListedIn(next, n)) {
      next.incarnations[n] = i;
    } else {
      deposed_[n] = {i,
                     st->now};  // not a spare to copy to while its key lingers
    }
  }
  g = next;
  st->change = true;
}

// The primary: drops the backups the replicator gave up on and those gone.
void Membership::DropBrokenBackups(StepState* st) {
  GroupLayout& g = *st->g;
  std::vector<std::pair<std::string, bool>>& broken = st->broken;
  std::vector<std::string> keep;
  {
    MutexLock l(&mu_);
    broken.swap(drop_backups_);
  }
  for (const std::string& b : g.backups) {
    auto it = st->alive.find(b);
    auto drop =
        it == st->alive.end()
            ? broken.end()
            : std::find_if(broken.begin(), broken.end(), [&](const auto& d) {
                return d.first == it->second.endpoint;
              });
    if (drop != broken.end()) {
      LOG(WARNING) << "backup " << b << " of group " << options_.group
                   << (drop->second ? " is silent" : " diverged")
                   << ": dropped (epoch " << st->layout.epoch + 1 << ")";
      ++st->dropped;
      if (drop->second && g.incarnations.count(b))
        deposed_[b] = {g.incarnations.at(b), st->now};
      g.incarnations.erase(b);
      st->change = true;
      continue;
    }
    if (st->Gone(b)) {
      LOG(WARNING) << "backup " << b << " of group " << options_.group
                   << " is gone: dropped (epoch " << st->layout.epoch + 1
                   << ")";
      ++st->dropped;
      if (g.incarnations.count(b))
        deposed_[b] = {g.incarnations.at(b), st->now};
      g.incarnations.erase(b);
      st->change = true;
    } else {
      keep.push_back(b);
    }
  }
  g.backups = std::move(keep);
}

// No process of the group holds its state any more (every replica was
// lost, or there was only one): the last primary, started again under
// its name, resumes from what its own store holds, as a lone restarted
// shard does (whatever was acknowledged after that store's last write
// is lost with the group, unless the shard is --durable). Any other
// spare waits for it: its store stopped at some older epoch (it was
// dropped, or never caught up), and resuming from it would lose every
// write the last primary acknowledged since.
void Membership::ResumeLoneGroup(StepState* st) {
  GroupLayout& g = *st->g;
  LOG(WARNING) << "group " << options_.group
               << " has no live replica: " << name_
               << " resumes it from its own store (epoch "
               << st->layout.epoch + 1 << ")";
  g.primary = name_;
  g.backups.clear();
  g.incarnations.clear();
  g.incarnations[name_] = incarnation_;
  seen_[name_] = incarnation_;
  st->change = true;
}

void Membership::ListAddedBackups(StepState* st) {
  GroupLayout& g = *st->g;
  if (!(g.primary == name_ && g.incarnations.count(name_) &&
        g.incarnations.at(name_) == incarnation_))
    return;
  // Spares whose state this primary copied: list them as backups.
  {
    MutexLock l(&mu_);
    st->add.swap(add_backups_);
  }
  for (const std::string& endpoint : st->add) {
    for (const auto& [n, m] : st->alive) {
      if (m.endpoint != endpoint || m.group != options_.group || n == name_ ||
          ListedIn(g, n))
        continue;
      seen_[n] = m.incarnation;
      g.incarnations[n] = m.incarnation;
      LOG(INFO) << "spare " << n << " of group " << options_.group
                << " holds the primary's state: listed as a backup (epoch "
                << st->layout.epoch + 1 << ")";
      g.backups.push_back(n);
      ++counters_.backups_added;
      st->change = true;
    }
  }
}

Status Membership::WriteLayout(StepState* st, bool* written_out) {
  *written_out = true;
  if (!st->change && !st->bind) return Status::OK();
  GroupLayout& g = *st->g;
  ReplicaLayout& layout = st->layout;
  if (st->change) g.epoch = ++layout.epoch;
  // Not written (a conflict or an etcd error): what this step took is
  // asked for again, at once.
  auto retry = [&] {
    MutexLock l(&mu_);
    add_backups_.insert(add_backups_.end(), st->add.begin(), st->add.end());
    drop_backups_.insert(drop_backups_.begin(), st->broken.begin(),
                         st->broken.end());
    wake_ = true;
  };
  StatusOr<bool> written = etcd_->CompareAndPut(st->layout_key, layout.ToJson(),
                                                st->kv.mod_revision);
  if (!written.ok()) {
    retry();
    return written.status();
  }
  if (!*written) {
    ++counters_.cas_conflicts;
    if (st->change) {
      LOG(WARNING) << "group " << options_.group << ": the layout changed "
                   << "before epoch " << layout.epoch
                   << " was written (another group's change): trying again";
    }
    retry();
    *written_out = false;
    return Status::OK();
  }
  counters_.backups_dropped += st->dropped;
  if (st->change && g.primary == name_ && !st->was_primary)
    ++counters_.promotions;
  return Status::OK();
}

void Membership::PublishView(const StepState& st) {
  const GroupLayout& g = *st.g;
  const bool me_now =
      ListedIn(g, name_) && (g.incarnations.count(name_) == 0 ||
                             g.incarnations.at(name_) == incarnation_);

  ReplicaView v;
  v.epoch = g.epoch;
  v.primary = me_now && g.primary == name_;
  v.backup = me_now && std::find(g.backups.begin(), g.backups.end(), name_) !=
                           g.backups.end();
  if (st.IsAlive(g.primary)) {
    const Member& pm = st.alive.at(g.primary);
    v.primary_endpoint = pm.endpoint;
    v.primary_name = g.primary;
    v.primary_incarnation = pm.incarnation;  // the one the layout binds
    v.primary_replica_key = pm.replica_key;
  }
  for (const auto& [n, m] : st.alive) {
    if (m.group != options_.group) continue;
    v.members.push_back(ReplicaMember{n, m.incarnation, m.endpoint,
                                      m.replica_key, m.server_key});
  }
  if (v.primary) {
    for (const std::string& b : g.backups) {
      if (st.IsAlive(b)) {
        v.backup_endpoints.push_back(st.alive.at(b).endpoint);
      } else {
        v.waiting_for_backups = true;  // listed, not seen yet, in the grace
      }
    }
    for (const auto& [n, m] : st.alive) {
      // A dropped process's key lingers until its lease ends (a dead one)
      // or stays (one that was cut off and is back: a spare to copy to).
      auto d = deposed_.find(n);
      const bool lingering =
          d != deposed_.end() && d->second.first == m.incarnation &&
          st.now - d->second.second <
              2 * options_.lease_ttl + std::chrono::seconds(1);
      if (m.group == options_.group && !ListedIn(g, n) && !lingering)
        v.spare_endpoints.push_back(m.endpoint);
    }
  }
  MutexLock l(&mu_);
  v.lease_valid_until = view_.lease_valid_until;
  if (!(v == view_)) view_changed_ = true;
  view_ = v;
  ++published_;
  published_cv_.SignalAll();
}

void Membership::Run() {
  for (;;) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    const auto now = SteadyClock::now();
    Status s = Step(now);
    if (!s.ok()) {
      ++counters_.etcd_errors;
      LOG_EVERY_N(WARNING, 20)
          << "membership of " << name_ << ": " << s.ToString();
    }
    MutexLock l(&mu_);
    const auto until = now + options_.poll;
    while (!stop_ && !wake_ && cv_.WaitUntil(&mu_, until)) {
    }
    wake_ = false;
  }
}

bool Membership::AwaitStep(std::chrono::milliseconds timeout) {
  const auto until = SteadyClock::now() + timeout;
  MutexLock l(&mu_);
  const uint64_t target = published_ + 1;
  wake_ = true;
  cv_.SignalAll();
  while (published_ < target && !stop_ &&
         published_cv_.WaitUntil(&mu_, until)) {
  }
  return published_ >= target;
}

void Membership::Wake() {
  MutexLock l(&mu_);
  wake_ = true;
  cv_.SignalAll();
}

void Membership::SuspectPrimary(uint64_t epoch) {
  MutexLock l(&mu_);
  if (epoch <= suspect_epoch_) return;  // asked every loop while it lasts
  suspect_epoch_ = epoch;
  wake_ = true;
  cv_.SignalAll();
}

void Membership::DropBackup(const std::string& endpoint, bool silent) {
  MutexLock l(&mu_);
  drop_backups_.emplace_back(endpoint, silent);
  wake_ = true;
  cv_.SignalAll();
}

void Membership::AddBackup(const std::string& endpoint) {
  MutexLock l(&mu_);
  add_backups_.push_back(endpoint);
  wake_ = true;
  cv_.SignalAll();
}

bool Membership::TakeView(ReplicaView* view) {
  MutexLock l(&mu_);
  *view = view_;
  const bool changed = view_changed_;
  view_changed_ = false;
  return changed;
}

void Membership::Stop(bool revoke) {
  {
    MutexLock l(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (revoke && etcd_ && lease_ != 0) {
    Status s = etcd_->RevokeLease(lease_);
    if (!s.ok()) LOG(WARNING) << "revoking the lease: " << s.ToString();
    lease_ = 0;
  }
}

}  // namespace asyncps::server::replication
