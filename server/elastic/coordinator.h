// Coordinator: adds a shard to, or removes one from, a fleet that is
// training, by moving chunks between live shards (ps_ctl add-shard /
// remove-shard). The fleet's elastic document (elastic_doc.h) lives in etcd
// under <prefix>/elastic; a fleet that never changed has none and is the
// static epoch-0 layout of the endpoints it was started with.
//
// One change, from epoch E to E+1, over the kMigrate requests of
// common/protocol.capnp (rank -1):
//   1. describe every shard of the document that owns chunks, and the one
//      that joins (its --shard_id must be its index in the document:
//      servers.size() for a new endpoint);
//   2. new owners by Rebalance() over the shards that stay or join;
//   3. freeze every one of them toward E+1 at clock F (BSP: one past the
//      highest worker clock, so the round under way completes; ASP/SSP: -1,
//      every push refused at once); a shard already past F makes every
//      shard abort and the freeze is tried again with a later F;
//   4. wait until every shard is drained, then copy every chunk that moves:
//      export from its owner, import into its new owner (requests of at most
//      max_request_bytes, one source and destination each); a model with
//      sparse tables also moves the rows of the key-range buckets that
//      change owner (RebalanceBuckets), in batches of buckets sized by the
//      source's rows per bucket (halved while an export is too large);
//   5. commit: compare-and-swap of <prefix>/elastic from what was read to the
//      document of epoch E+1 (etcd decides the flip once);
//   6. adopt: the shards that receive chunks first, then the others (the
//      shard that leaves gives its chunks up and keeps answering clients
//      with the new document until it is stopped).
// Any failure before the commit aborts every frozen shard (they keep E);
// after the commit, adopts are retried and a shard that still fails is
// reported (it aborts by itself after the freeze deadline: restart it).
//
// Thread safety: a Coordinator is used by one thread at a time. Two
// coordinators racing on one fleet cannot both commit (the compare-and-swap
// lets one through; a frozen shard refuses a second freeze).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/etcd_security.h"
#include "common/status.h"
#include "common/transport.h"

namespace asyncps::server::elastic {

struct CoordinatorOptions {
  // etcd client URLs (http://host:port). Required.
  std::vector<std::string> etcd_endpoints;
  // Key prefix of the fleet in etcd: the document is <prefix>/elastic.
  // Default: "/asyncps/default" (ps_server's --etcd_prefix default).
  std::string etcd_prefix = "/asyncps/default";
  // etcd's TLS files and credentials. Default: none.
  EtcdSecurity etcd_security;
  // The shard endpoints in shard order, for a fleet without a document in
  // etcd yet (its static epoch-0 layout). Ignored once a document exists.
  // Default: empty.
  std::vector<std::string> servers;
  // Transport for the shard connections (a shared context, CurveZMQ keys).
  TransportOptions transport;
  // Longest wait for one shard's reply. Default: 5000 ms.
  std::chrono::milliseconds request_timeout{5000};
  // Longest wait for every frozen shard to drain. Default: 5000 ms.
  std::chrono::milliseconds drain_timeout{5000};
  // Time between describes while waiting for the drain. Default: 2 ms.
  std::chrono::milliseconds drain_poll{2};
  // A frozen shard aborts by itself when neither adopt nor abort came
  // within this long. Default: 10000 ms.
  uint32_t freeze_deadline_ms = 10000;
  // Freezes tried (a worker past the freeze clock makes one fail).
  // Default: 4.
  int freeze_attempts = 4;
  // Largest export/import request, bytes (chunks counted at 16 bytes per
  // element: weights and up to three optimizer slots). Default: 32 MiB.
  uint64_t max_request_bytes = uint64_t{32} << 20;
};

// What one change did (ToJson: one JSON object).
struct ChangeReport {
  std::string command;   // "add-shard" | "remove-shard"
  std::string endpoint;  // the shard added or removed
  int shard = -1;        // its index in the document
  uint64_t epoch_before = 0;
  uint64_t epoch_after = 0;
  std::vector<int> active_before, active_after;  // shard indexes
  std::string consistency;
  int64_t freeze_clock = -1;  // F
  int freeze_tries = 0;
  size_t moved_chunks = 0;
  uint64_t moved_bytes = 0;  // chunk records copied (exported bytes)
  // Sparse tables: key-range buckets that changed owner, and the rows
  // (and admission counters) copied with them, with their bytes.
  size_t moved_buckets = 0;
  uint64_t moved_rows = 0;
  uint64_t moved_row_bytes = 0;
  double frozen_ms = 0;  // first freeze to the last adopt
  double drain_ms = 0;   // first freeze to every shard drained
  double copy_ms = 0;    // exports and imports
  double imbalance_before = 1.0, imbalance_after = 1.0;
  std::vector<std::string> adopt_failures;  // after the commit: shard: why
  std::string ToJson() const;
};

class Coordinator {
 public:
  // InvalidArgument for options that cannot work (no etcd endpoint, a
  // prefix not starting with '/'). Contacts nothing yet.
  static StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorOptions& options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Moves chunks onto the shard at `endpoint`, a running ps_server started
  // with --shard_id=N --num_shards=N+1 where N is the fleet's shard count
  // (servers in the document). Errors: InvalidArgument (already in the
  // fleet, a wrong shard id: the message says how to start it), Unavailable
  // (etcd or a shard unreachable), FailedPrecondition (no model registered
  // yet, a shard frozen by another change, the document changed in etcd
  // meanwhile), TimedOut (shards not drained in time); every shard is then
  // back on the old layout.
  StatusOr<ChangeReport> AddShard(const std::string& endpoint);
  // Moves every chunk off the shard at `endpoint` onto the others. The
  // shard keeps running (it redirects clients) until it is stopped.
  // Errors as AddShard; InvalidArgument for an endpoint not in the fleet,
  // one that holds no chunk, or the last shard holding chunks.
  StatusOr<ChangeReport> RemoveShard(const std::string& endpoint);

 private:
  struct Impl;
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncps::server::elastic
