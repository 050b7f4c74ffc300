// Structure-aware fuzzing of ps_server: well-formed requests (valid Cap'n
// Proto of every kind, so they pass the decoder) whose fields take extreme
// and random values: ids, ranks, incarnations, clocks, tensor counts and
// shapes, chunk sizes, chunk ids, frame indexes, codec ids and specs, list
// lengths and frame counts; with sparse tables also row refs (tables, key
// counts, keys and rows frames, codecs, repeated and foreign keys, row
// sizes, NaN rows) in pushes and pulls, and hostile table definitions.
// Where a request would be a legal update it carries a zero gradient, so it
// cannot change what a real worker trains (with SGD without momentum or
// weight decay, for chunks and rows alike).
//
// HostileGenerator makes the messages; HostileDriver sends them to one shard
// over a DEALER socket, many in flight, and checks that every one is answered
// within a deadline, tallying reply codes and message shapes.
//
// Thread safety: one thread per object.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"

namespace asyncps::fuzz {

struct HostileMessage {
  RequestHeader header;
  std::vector<std::vector<uint8_t>> frames;  // data frames 1..n
  std::string shape;                         // e.g. "push/bad_ref"
};

class HostileGenerator {
 public:
  // `layout`: the model the target shard holds (its chunks give valid ids
  // and sizes), `shard`: the target's index, `tensors` the specs the real
  // workers registered. `admin` decides whether checkpoint and shutdown are
  // generated (only against a shard that must refuse them). `tables`: the
  // sparse tables the workers registered (none: no row refs are made).
  HostileGenerator(const Layout& layout, std::vector<TensorSpec> tensors,
                   int shard, int num_workers, bool admin, uint64_t seed,
                   std::vector<TableSpec> tables = {});

  void Next(HostileMessage* m);

  // Replica traffic (replicate, snapshot) from then on `percent` of the
  // messages, made as a member of the replica group would make it but
  // without its key or secret: senders named like the group's replicas
  // (`names`) or anything, any incarnation and session, tags of random
  // bytes (or none, or of other sizes); replicates that are pings,
  // liveness records (clocks and ranks of any value), round records
  // (header counts and rounds of any value, random frames) or that wrap a
  // request (a push with a non-zero gradient, a clock, every elastic step,
  // a register, an upload, a replicate or snapshot, garbage); snapshot
  // pieces naming any file. Every one must be refused and change nothing.
  void set_replica_traffic(int percent, std::vector<std::string> names) {
    replica_percent_ = percent;
    replica_names_ = std::move(names);
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi);
  bool OneIn(int n) { return Uniform(0, n - 1) == 0; }
  int64_t Clock();
  int32_t Rank();
  uint64_t Id();
  uint64_t Count();  // sizes and element counts
  uint32_t ChunkId();
  std::string PullCodec();

  void Push(HostileMessage* m);
  void Pull(HostileMessage* m);
  void Register(HostileMessage* m);
  // Row refs (tests/fuzz/hostile_rows.cc): a legal part first (1-2 tables,
  // distinct keys this shard owns, zero rows), then one mutation.
  void PushRows(HostileMessage* m);
  void PullRows(HostileMessage* m);
  void ScanRows(HostileMessage* m);
  void HostileTables(HostileMessage* m);
  // `n` distinct keys of `table` that the target shard owns.
  std::vector<uint64_t> OwnedKeys(uint32_t table, size_t n);
  // A key of `table` that another shard owns (any key with one shard).
  uint64_t ForeignKey(uint32_t table);
  // Appends a legal row ref of `table` with `n` keys (and, for pushes, zero
  // rows in fp32, fp16 or bf16) to `m`; returns its index in header.rows.
  size_t AddRows(HostileMessage* m, uint32_t table, size_t n, bool push);
  // A raw or codec payload of zeros for chunk `id` (a legal, empty update).
  std::vector<uint8_t> ZeroPayload(uint32_t id, uint8_t* codec);
  // One message of replica traffic (set_replica_traffic).
  void ReplicaTraffic(HostileMessage* m);
  // Random bytes, up to `max` of them.
  std::vector<uint8_t> Bytes(size_t max);

  const Layout& layout_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint32_t> mine_;  // the target shard's chunk ids
  std::vector<TableSpec> tables_;
  int shard_;
  int num_shards_;
  int num_workers_;
  bool admin_;
  std::mt19937_64 rng_;
  uint64_t next_id_ = 1;
  std::vector<uint64_t> incarnations_;
  int replica_percent_ = 0;
  std::vector<std::string> replica_names_;
};

struct DriverOptions {
  std::string endpoint;
  TransportOptions transport;
  // Requests in flight at once. Default: 64.
  int window = 64;
  // A request not answered this long counts as unanswered. Default: 10 s.
  std::chrono::milliseconds deadline{10000};
};

struct DriverReport {
  int64_t sent = 0;
  int64_t answered = 0;
  int64_t unanswered = 0;  // no reply within the deadline
  int64_t unexpected = 0;  // replies to nothing in flight
  double max_latency_ms = 0;
  std::map<std::string, int64_t> codes;   // reply status code name -> count
  std::map<std::string, int64_t> shapes;  // message shape -> count
  std::string ToJson() const;
};

class HostileDriver {
 public:
  static StatusOr<std::unique_ptr<HostileDriver>> Create(
      const DriverOptions& options);

  // Sends `messages` messages from `gen` (or until `keep_going` says stop,
  // checked every 1000), then waits for the replies still due.
  Status Run(HostileGenerator& gen, int64_t messages,
             const std::function<bool()>& keep_going);
  const DriverReport& report() const { return report_; }

 private:
  explicit HostileDriver(const DriverOptions& o) : options_(o) {}
  // Reads replies for up to `wait`; expires requests past the deadline.
  Status Drain(std::chrono::milliseconds wait);

  DriverOptions options_;
  std::unique_ptr<ClientSocket> socket_;
  std::multimap<uint64_t, std::chrono::steady_clock::time_point> in_flight_;
  DriverReport report_;
};

}  // namespace asyncps::fuzz
