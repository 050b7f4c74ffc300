// Who may send what to a shard: the one place where a request is judged by
// its sender (the trust model of experiments/results/RELIABILITY.md).
//
// Three circles:
//  - the operator: etcd's credentials, the admin keys (ps_server
//    --curve_admin_clients; without CURVE, loopback peers) and the groups'
//    replica secrets. Admin requests: checkpoint, shutdown, and the steps of
//    an elastic change (migrate);
//  - the members of a replica group: only the current primary of an epoch
//    sends replica traffic (replicate, snapshot), authenticated by its key
//    (server/replication/replica_auth.h), never by what it says of itself;
//  - workers, and anyone else who can connect: register, push, pull, clock,
//    heartbeat, stats, attach_shm and uploads (assign); each checked by the
//    shard for what it carries, never trusted for who it is.
// A request carried inside another (a replicate's inner request, a round
// record's headers) is judged as if it came alone, with the relaying
// primary as its sender: the primary hands on only what it applied, so the
// inner request must be one a primary hands on (a write a worker or an
// admin may make: RelayedRequestOk), never replica traffic itself.
//
// Thread safety: plain functions.
#pragma once

#include "common/status.h"
#include "common/wire.h"

namespace asyncps::server {

enum class Role {
  kAnyone,   // workers and tools
  kAdmin,    // the operator's admin key (or loopback without CURVE)
  kPrimary,  // the primary of this process's replica group
};

// The role a request of `req`'s kind needs when it comes alone.
Role RequiredRole(const RequestHeader& req);

// OK when `inner`, carried in a replica request that the group's primary
// sent, may be applied: a write the primary hands on (register, push,
// clock, upload, and the elastic steps that change the shard), never a
// replicate or snapshot. InvalidArgument naming the kind otherwise.
Status RelayedRequestOk(const RequestHeader& inner);

}  // namespace asyncps::server
