// Membership: one replica's part in the fleet's layout, kept in etcd.
//
// On Create() the process takes an etcd lease (TTL lease_ttl), writes its
// member key <prefix>/members/<name> = {"endpoint", "group", "replica",
// "incarnation", and with CURVE "replica_key", "server_key"} under that
// lease, reads (or creates, create-only) the group's replica secret
// <prefix>/secrets/g<group> when asked to (group_secret_in_etcd), and creates
// the layout key <prefix>/layout with the initial layout if no one has
// (create-only; every replica computes the same one). A thread then, every
// `poll` (at once when the event loop reports a suspected primary or a backup
// to drop or add):
//   - keeps the lease alive (every `keepalive_every`); a keep-alive that
//     succeeds confirms the lease
//     until its send time plus the TTL (ReplicaView::lease_valid_until); a
//     lease etcd no longer has is replaced by a new one and the member key
//     written again (the layout no longer lists a process that was dropped,
//     so it comes back as a spare, never as the primary it was);
//   - reads the layout and the member keys (one range request: they sit
//     next to each other under the prefix), and changes the layout of its
//     own group, always by compare-and-swap on the layout's revision:
//       * a backup whose primary's member key is gone (lease expired:
//         process killed, host lost, partitioned) promotes itself when it is
//         the first live backup in the list: new epoch, itself primary, the
//         other live backups behind it;
//       * a primary drops backups whose member keys are gone (new epoch), so
//         the replies that waited for them are released;
//       * when no listed process of the group is alive, the last primary,
//         started again under its name, resumes the group from its own
//         store; any other spare waits for it (its store is behind);
//     a member is judged gone only once it has been seen alive, or once
//     `startup_grace` has passed since this process started (a fleet that
//     is still starting is not reshuffled);
//   - publishes the view of this process (TakeView()).
// Without etcd (unreachable) the layout does not change: the current view
// stays, the lease is no longer confirmed, and a primary with backups goes
// on (see Replicator).
//
// Ownership: owns its etcd client and thread. Thread safety: TakeView() may
// be called from any thread; the rest runs on the private thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd_security.h"
#include "common/mutex.h"
#include "common/status.h"
#include "server/replication/replica_view.h"

namespace asyncps {
class EtcdClient;
}

namespace asyncps::server::replication {

struct MembershipOptions {
  // etcd endpoints ("http://127.0.0.1:2379"). Required.
  std::vector<std::string> etcd_endpoints;
  // Key prefix of this fleet in etcd (one prefix per job). Default:
  // "/asyncps/default".
  std::string prefix = "/asyncps/default";
  // Replica groups (shards) and replicas per group, >= 1. Default: 1, 1.
  int groups = 1;
  int replicas = 1;
  // This process: its group (shard index) and replica index in the group.
  int group = 0;
  int replica = 0;
  // The endpoint workers and other replicas reach this process at.
  // Required.
  std::string endpoint;
  // TTL of the lease; etcd counts whole seconds, so it is rounded up.
  // Default: 1 s.
  std::chrono::milliseconds lease_ttl{1000};
  // Period of layout reads. Default: 100 ms.
  std::chrono::milliseconds poll{100};
  // Period of keep-alives (at most every poll); 0: lease_ttl / 4. Each
  // request costs etcd about a millisecond of CPU through its JSON gateway
  // (a 2-group, R=2 fleet kept etcd at ~17% of a core with one read of the
  // layout, one of the members and a keep-alive per poll). Default: 0.
  std::chrono::milliseconds keepalive_every{0};
  // Members not yet seen alive are not judged gone before this long after
  // start. Default: 15 s.
  std::chrono::milliseconds startup_grace{15000};
  // Per-request timeout towards etcd. Default: 500 ms.
  std::chrono::milliseconds request_timeout{500};
  // This process's incarnation (in its member record; the layout binds a
  // listed name to one); 0: a random one. Default: 0.
  uint64_t incarnation = 0;
  // With CurveZMQ: this process's replica public key and server public key
  // (Z85), published in its member record (server/replication/
  // replica_auth.h). Default: "" (no CURVE).
  std::string replica_key;
  std::string server_key;
  // Read the group's replica secret from etcd (<prefix>/secrets/g<group>),
  // creating it (32 random bytes, create-only) when the group has none yet:
  // group_secret(). Default: false.
  bool group_secret_in_etcd = false;
  // etcd's TLS and credentials (common/etcd_client.h). Default: none.
  EtcdSecurity etcd_security;
};

struct MembershipCounters {
  std::atomic<uint64_t> keepalive_failures{0};
  std::atomic<uint64_t> lease_renewals{0};   // a lost lease replaced
  std::atomic<uint64_t> promotions{0};       // this process became primary
  std::atomic<uint64_t> suspicions{0};       // promotions on a silent primary
  std::atomic<uint64_t> backups_dropped{0};  // by this process as primary
  std::atomic<uint64_t> backups_added{0};    // spares listed, as primary
  std::atomic<uint64_t> cas_conflicts{0};    // layout changed under it
  std::atomic<uint64_t> etcd_errors{0};
};

class Membership {
 public:
  // Takes the lease, writes the member key and the initial layout, reads
  // the first view and starts the thread. Unavailable when etcd cannot be
  // reached within a few request timeouts.
  static StatusOr<std::unique_ptr<Membership>> Create(
      const MembershipOptions& options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The latest view; true when it differs from the one the previous call
  // returned (lease_valid_until is always the latest).
  bool TakeView(ReplicaView* view);

  // Has the thread read etcd now, and waits up to `timeout` until it has
  // published a view from that read: true when it did. For a replica whose
  // view may be behind a request it got (a new primary, a member it has
  // not seen yet).
  bool AwaitStep(std::chrono::milliseconds timeout);
  // Has the thread read etcd now (without waiting for it).
  void Wake();

  // Backup: its primary at `epoch` has been silent (Replicator): it counts
  // as gone at the next step, as if its lease had ended.
  void SuspectPrimary(uint64_t epoch);

  // Primary: the backup at `endpoint` answered an update with an error (it
  // diverged), or answered nothing for a while (`silent`: gone or cut off):
  // drop it from the layout, so it is never promoted with what it lacks. A
  // diverged one is copied to again as a spare at once, a silent one once
  // its member key has outlived its lease (it is alive after all).
  void DropBackup(const std::string& endpoint, bool silent);

  // Primary: asks for the spare at `endpoint` (whose state it copied) to be
  // listed as a backup of its group; done by the thread's next step.
  void AddBackup(const std::string& endpoint);

  const std::string& name() const { return name_; }
  uint64_t incarnation() const { return incarnation_; }
  // With group_secret_in_etcd: the group's secret (kReplicaSecretBytes).
  const std::string& group_secret() const { return group_secret_; }
  const MembershipCounters& counters() const { return counters_; }

  // Stops the thread and revokes the lease (the member key goes at once, so
  // a clean shutdown fails over without waiting for the TTL).
  void Stop(bool revoke);

 private:
  explicit Membership(const MembershipOptions& options);
  Status Join();
  // Reads (or creates) the group's secret in etcd into group_secret_.
  Status FetchGroupSecret();
  Status Step(std::chrono::steady_clock::time_point now);
  // The parts of Step, in order; each reads and fills `st`.
  struct StepState;
  // Reads the layout and the live members; `read_again` when this step
  // ends here (it added this group to the layout).
  Status ReadLayout(StepState* st, bool* read_again);
  void BindMembers(StepState* st);
  void ChangeRoles(StepState* st);
  void TakeOverIfFirst(StepState* st);
  void DropBrokenBackups(StepState* st);
  void ResumeLoneGroup(StepState* st);
  void ListAddedBackups(StepState* st);
  // Writes the layout when roles changed or incarnations were bound;
  // `written` false when another write won (the step ends, asked again).
  Status WriteLayout(StepState* st, bool* written);
  void PublishView(const StepState& st);
  Status KeepAlive(std::chrono::steady_clock::time_point now);
  void Run();

  MembershipOptions options_;
  std::string name_;
  std::string member_value_;
  uint64_t incarnation_ = 0;  // in the member key
  std::string group_secret_;
  std::unique_ptr<EtcdClient> etcd_;  // private thread only (after Create)
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point started_;
  // Member name -> the incarnation it was first seen alive with.
  std::map<std::string, uint64_t> seen_;
  // Member name -> the incarnation this process dropped from the layout
  // (dead or deposed) and when: not taken for a spare while its member key
  // may still be the dead process's (its lease has not ended).
  std::map<std::string,
           std::pair<uint64_t, std::chrono::steady_clock::time_point>>
      deposed_;
  MembershipCounters counters_;

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  ReplicaView view_ GUARDED_BY(mu_);
  bool view_changed_ GUARDED_BY(mu_) = false;
  uint64_t published_ GUARDED_BY(mu_) = 0;  // steps that published a view
  CondVar published_cv_;
  std::vector<std::string> add_backups_ GUARDED_BY(mu_);  // endpoints
  uint64_t suspect_epoch_ GUARDED_BY(mu_) = 0;
  bool wake_ GUARDED_BY(mu_) = false;  // step now, not after `poll`
  std::chrono::steady_clock::time_point next_keepalive_{};  // private thread
  // Endpoints to drop, and whether each was silent.
  std::vector<std::pair<std::string, bool>> drop_backups_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace asyncps::server::replication
