// The replica layout of a fleet (which process is the primary of each
// replica group and which are its backups, under an epoch) and the view one
// process takes of it.
//
// The layout is a JSON document kept in etcd under <prefix>/layout and
// changed only by compare-and-swap on its revision (Membership), so every
// change is decided once, by etcd:
//
//   {"epoch": 7, "groups": [{"primary": "g0r1", "backups": ["g0r0"],
//                            "incarnations": {"g0r0": 81, "g0r1": 23}}, ...]}
//
// Processes are named by replica name ("g<group>r<replica>"); each one's
// endpoint is in its member key, <prefix>/members/<name>, which lives as
// long as the process's etcd lease.
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps::server::replication {

struct GroupLayout {
  // The layout epoch of this group's last change: what its replicas stamp
  // and check (a change in another group does not touch it).
  uint64_t epoch = 0;
  std::string primary;               // replica name; "" = none alive
  std::vector<std::string> backups;  // replica names, in promotion order
  // The process each listed name stands for: its incarnation (random per
  // process start), bound by the process itself when it first finds its
  // name listed unbound, or by the primary when it lists a spare. A process
  // whose name is bound to another incarnation is a spare: it came back
  // after losing what it held.
  std::map<std::string, uint64_t> incarnations;
};

struct ReplicaLayout {
  uint64_t epoch = 0;
  std::vector<GroupLayout> groups;  // index = shard index

  // The layout of a new fleet: group g's primary is replica 0, its backups
  // replicas 1..replicas-1. Epoch 1.
  static ReplicaLayout Initial(int groups, int replicas);
  std::string ToJson() const;
  // InvalidArgument / Corruption for a document that is not a layout.
  static StatusOr<ReplicaLayout> FromJson(const std::string& json);
};

// "g<group>r<replica>".
std::string ReplicaName(int group, int replica);

// A live process of a group as its etcd member record says: who it is and
// the keys it is known by.
struct ReplicaMember {
  std::string name;  // "g<group>r<replica>"
  uint64_t incarnation = 0;
  std::string endpoint;
  // With CurveZMQ: its replica key (the client key of its connections to
  // other replicas) and its server key, Z85; "" without.
  std::string replica_key;
  std::string server_key;
  bool operator==(const ReplicaMember& o) const {
    return name == o.name && incarnation == o.incarnation &&
           endpoint == o.endpoint && replica_key == o.replica_key &&
           server_key == o.server_key;
  }
};

// What one process serves under the layout it last read.
struct ReplicaView {
  using TimePoint = std::chrono::steady_clock::time_point;
  // The epoch of this process's group (GroupLayout::epoch); 0 = none read.
  uint64_t epoch = 0;
  // This process is its group's primary.
  bool primary = false;
  // Listed as a backup of its group (neither: a spare, serving nothing).
  bool backup = false;
  // Primary only: a listed backup has not been seen alive yet (the fleet is
  // starting): writes wait for it.
  bool waiting_for_backups = false;
  // The primary's endpoint ("" = unknown): where refused workers are sent.
  std::string primary_endpoint;
  // The primary as the layout binds it (name, incarnation) and its replica
  // key: the only process whose replica traffic this one applies at `epoch`
  // (server/replication/replica_auth.h). Empty/0 when none is alive.
  std::string primary_name;
  uint64_t primary_incarnation = 0;
  std::string primary_replica_key;
  // The live members of this group (this process included), in name
  // order: a request of a newer epoch than this view's is taken only from
  // one of them, and a primary connects to its backups with their server
  // keys.
  std::vector<ReplicaMember> members;
  // Primary only: its backups' endpoints (only those with a live member key).
  std::vector<std::string> backup_endpoints;
  // Primary only: live processes of its group the layout does not list
  // (replacements): the primary copies its state to them and asks
  // Membership to list them as backups.
  std::vector<std::string> spare_endpoints;
  // This process's etcd lease is confirmed alive until this time (the last
  // keep-alive that succeeded plus the lease's TTL, measured from when it
  // was sent). A primary without backups acknowledges writes only before it.
  TimePoint lease_valid_until{};

  // The live member of this group at `endpoint` / with replica key `key`
  // / named `name` with `incarnation`, or nullptr.
  const ReplicaMember* MemberAt(const std::string& endpoint) const;
  const ReplicaMember* MemberWithKey(const std::string& key) const;
  const ReplicaMember* Member(const std::string& name,
                              uint64_t incarnation) const;

  bool operator==(const ReplicaView& o) const {
    return epoch == o.epoch && primary == o.primary && backup == o.backup &&
           waiting_for_backups == o.waiting_for_backups &&
           primary_endpoint == o.primary_endpoint &&
           primary_name == o.primary_name &&
           primary_incarnation == o.primary_incarnation &&
           primary_replica_key == o.primary_replica_key &&
           members == o.members && backup_endpoints == o.backup_endpoints &&
           spare_endpoints == o.spare_endpoints;
  }
};

}  // namespace asyncps::server::replication
