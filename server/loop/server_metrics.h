// ServerMetrics: the Prometheus metrics of one ps_server shard.
//
// The server's event loop feeds it: OnRequest() for every message received
// (kind, bytes, time spent handling it in the loop), OnReply() for every
// reply sent (kind, bytes, and for pulls the time since the request arrived,
// which includes any time parked; for applied pushes the staleness the shard
// recorded), and Publish() with the shard's own counters at most every
// `publish_every` (cheap: a copy of a few counters and the clock vector).
// HTTP threads read the registry's atomics, so a scrape never waits for the
// loop and the loop never waits for a scrape.
//
// Families (prefix asyncps_shard_, base units, no per-key labels):
//   requests_total{kind}, request_bytes_total{kind}, reply_bytes_total{kind}
//   request_seconds{kind}        histogram, handling time in the event loop
//   pull_wait_seconds            histogram, pull arrival to reply (parking)
//   staleness                    histogram of applied pushes' staleness
//   pushes_total, duplicate_pushes_total, pulls_total
//   push_bytes_total{kind=raw|wire}   accepted pushes, dense fp32 vs wire
//   validate_decode_seconds_total
//   rejected_total{reason}
//   checkpoints_total, checkpoint_seconds_total   checkpoints and time in them
//   durable_writes_total, durable_write_seconds_total   --durable writes
//   store_written_bytes_total    keys and values handed to RocksDB
//   memory_budget_bytes{kind=capacity|used|peak}, memory_budget_refusals_total
//   unsent_reply_bytes           pull replies not yet released by ZeroMQ
//   degraded                     1 while pushes are refused after a failed
//                                durable write
//   version, parked_pulls, live_workers, min_clock, bsp_round    gauges
//   worker_clock{rank}, worker_live{rank}   gauges (first max_rank_series
//                                           ranks; ranks are few)
//   chunk_bytes                  gauge, weights held (optimizer state apart)
//
// Thread safety: OnRequest/OnReply/Publish from the event loop thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/metrics.h"
#include "common/wire.h"
#include "server/shard/shard.h"

namespace asyncps::server {

struct ServerMetricsOptions {
  // Shortest time between two Publish() calls that do work. Default: 200 ms.
  std::chrono::milliseconds publish_every{200};
  // Ranks that get their own worker_clock / worker_live series. Default: 256.
  int max_rank_series = 256;
  // Sparse tables that get their own series (label `table`), in
  // registration order. Default: 64.
  size_t max_table_series = 64;
  // Pull arrivals remembered for pull_wait_seconds; past it, new pulls are
  // not timed (the map is sized by peers' requests). Default: 65536.
  size_t max_timed_pulls = 65536;
};

class ServerMetrics {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Registers the families in `registry`, which must outlive this object.
  ServerMetrics(metrics::Registry* registry, int num_workers,
                const ServerMetricsOptions& options = {});

  // A request of `kind` from `peer` with id `id`, `bytes` in all frames,
  // arrived at `arrived` and was handled in `handle_s` seconds. Malformed
  // requests count under the kind their header claimed (heartbeat if none).
  void OnRequest(RequestKind kind, const std::string& peer, uint64_t id,
                 uint64_t bytes, TimePoint arrived, double handle_s);
  // A reply to `peer`: `bytes` of data frames plus header.
  void OnReply(const std::string& peer, const ReplyHeader& reply,
               uint64_t bytes, TimePoint now);
  // Copies the shard's counters and clocks, at most every publish_every.
  void Publish(const Shard& shard, TimePoint now);

 private:
  struct PerKind {
    metrics::Counter* requests;
    metrics::Counter* request_bytes;
    metrics::Counter* reply_bytes;
    metrics::Histogram* seconds;
  };
  PerKind& Kind(RequestKind k);

  const ServerMetricsOptions options_;
  std::vector<PerKind> kinds_;  // by RequestKind value
  metrics::Histogram& pull_wait_;
  metrics::Histogram& staleness_;
  metrics::Counter& pushes_;
  metrics::Counter& duplicate_pushes_;
  metrics::Counter& pulls_;
  metrics::Counter& push_raw_;
  metrics::Counter& push_wire_;
  metrics::Counter& validate_decode_;
  metrics::Counter& checkpoints_;
  metrics::Counter& checkpoint_seconds_;
  metrics::Counter& durable_writes_;
  metrics::Counter& durable_write_seconds_;
  metrics::Counter& store_bytes_;
  metrics::Gauge& budget_capacity_;
  metrics::Gauge& budget_used_;
  metrics::Gauge& budget_peak_;
  metrics::Counter& budget_refusals_;
  metrics::Gauge& unsent_;
  metrics::Gauge& degraded_;
  std::vector<metrics::Counter*> rejected_;  // by RejectReason
  metrics::Gauge& version_;
  metrics::Gauge& parked_;
  metrics::Gauge& live_;
  metrics::Gauge& min_clock_;
  metrics::Gauge& bsp_round_;
  metrics::Gauge& chunk_bytes_;
  std::vector<metrics::Gauge*> clock_;  // by rank, first max_rank_series
  std::vector<metrics::Gauge*> rank_live_;
  // The store (RocksDB) as a whole.
  struct StoreFamilies {
    metrics::Counter* bytes_written;
    metrics::Counter* keys_written;
    metrics::Counter* wal_bytes;
    metrics::Counter* flush_bytes;
    metrics::Counter* compaction_read_bytes;
    metrics::Counter* compaction_write_bytes;
    metrics::Counter* stall_seconds;
    metrics::Counter* block_cache_hits;
    metrics::Counter* block_cache_misses;
    metrics::Gauge* disk_bytes;
    metrics::Gauge* memtable_bytes;
    metrics::Gauge* block_cache_bytes;
    metrics::Gauge* running_compactions;
    metrics::Gauge* pending_compaction_bytes;
  };
  StoreFamilies store_;
  // Sparse tables: one child per table and family (kTableCounters
  // counters, then kTableGauges gauges; see server_metrics.cc), made the
  // first time a table is seen.
  static constexpr size_t kTableCounters = 10;
  static constexpr size_t kTableGauges = 4;
  struct TableSeries {
    std::array<metrics::Counter*, kTableCounters> counters;
    std::array<metrics::Gauge*, kTableGauges> gauges;
  };
  void PublishStore(const Shard& shard);
  void PublishTables(const Shard& shard);
  std::array<metrics::Family<metrics::Counter>*, kTableCounters>
      table_counters_;
  std::array<metrics::Family<metrics::Gauge>*, kTableGauges> table_gauges_;
  metrics::Gauge& cache_budget_;
  metrics::Gauge& cache_used_;
  std::vector<TableSeries> tables_;
  // (peer, id) of pulls not yet answered -> arrival.
  std::unordered_map<std::string, TimePoint> pull_arrivals_;
  TimePoint last_publish_{};
};

}  // namespace asyncps::server
