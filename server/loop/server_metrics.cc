#include "server/loop/server_metrics.h"

#include <algorithm>
#include <iterator>

#include "server/sparse/sparse_table.h"
#include "server/sparse/sparse_tables.h"

namespace asyncps::server {
namespace {

using metrics::Histogram;

struct FamilyDef {
  const char* name;
  const char* help;
};
// Per sparse table (label `table`); the order is PublishTables()'.
constexpr FamilyDef kTableCounterDefs[] = {
    {"asyncps_shard_table_pulled_rows_total", "Rows answered to pulls."},
    {"asyncps_shard_table_pushed_rows_total", "Rows of applied pushes."},
    {"asyncps_shard_table_cache_hits_total", "Row lookups the cache answered."},
    {"asyncps_shard_table_cache_misses_total",
     "Row lookups that went to RocksDB."},
    {"asyncps_shard_table_store_reads_total",
     "Keys looked up in RocksDB (MultiGet)."},
    {"asyncps_shard_table_store_writes_total",
     "Rows written to RocksDB (write-back, checkpoint, durable pushes)."},
    {"asyncps_shard_table_write_backs_total",
     "Dirty rows written back when evicted."},
    {"asyncps_shard_table_evictions_total", "Rows evicted from the cache."},
    {"asyncps_shard_table_admitted_rows_total", "Rows created (admitted)."},
    {"asyncps_shard_table_expired_rows_total",
     "Rows found expired by a lookup."},
};
constexpr FamilyDef kTableGaugeDefs[] = {
    {"asyncps_shard_table_cache_rows", "Rows of the table in the cache."},
    {"asyncps_shard_table_cache_bytes",
     "Bytes of the table's rows in the cache."},
    {"asyncps_shard_table_rows", "Rows of the table in RocksDB (estimate)."},
    {"asyncps_shard_table_sst_bytes",
     "Bytes of the table's RocksDB table files."},
};

constexpr char kPushBytesHelp[] =
    "Payload bytes of accepted pushes: raw = as dense fp32, wire = as "
    "received.";

constexpr char kBudgetHelp[] =
    "The shard's memory budget: capacity, bytes in use, most in use at once.";

constexpr RequestKind kKinds[] = {
    RequestKind::kRegister,   RequestKind::kPush,      RequestKind::kPull,
    RequestKind::kClock,      RequestKind::kHeartbeat, RequestKind::kStats,
    RequestKind::kCheckpoint, RequestKind::kShutdown,  RequestKind::kAttachShm,
    RequestKind::kReplicate,  RequestKind::kSnapshot,  RequestKind::kMigrate};

// Exact for small staleness, then the upper ends of the shard's own
// power-of-two buckets ([64, 128) is <= 127).
std::vector<double> StalenessBounds() {
  std::vector<double> b = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48};
  for (double v = 64; v <= 65536; v *= 2) b.push_back(v - 1);
  return b;
}

std::string PullKey(const std::string& peer, uint64_t id) {
  std::string k = peer;
  k.append(reinterpret_cast<const char*>(&id), sizeof(id));
  return k;
}

}  // namespace

ServerMetrics::ServerMetrics(metrics::Registry* r, int num_workers,
                             const ServerMetricsOptions& options)
    : options_(options),
      pull_wait_(r->AddHistogram("asyncps_shard_pull_wait_seconds",
                                 "Time from a pull's arrival to its reply, "
                                 "parking included.",
                                 Histogram::ExponentialBounds(1e-5, 2.5, 16))
                     .Get()),
      staleness_(r->AddHistogram("asyncps_shard_staleness",
                                 "Staleness of applied pushes: shard updates "
                                 "since the pushing worker's last pull.",
                                 StalenessBounds())
                     .Get()),
      pushes_(r->AddCounter("asyncps_shard_pushes_total",
                            "Pushes applied (BSP: accumulated).")
                  .Get()),
      duplicate_pushes_(r->AddCounter("asyncps_shard_duplicate_pushes_total",
                                      "Resent pushes acknowledged without "
                                      "being applied again.")
                            .Get()),
      pulls_(r->AddCounter("asyncps_shard_pulls_total", "Pull replies sent.")
                 .Get()),
      push_raw_(r->AddCounter("asyncps_shard_push_bytes_total", kPushBytesHelp,
                              {"kind"})
                    .WithLabels({"raw"})),
      push_wire_(r->AddCounter("asyncps_shard_push_bytes_total", kPushBytesHelp,
                               {"kind"})
                     .WithLabels({"wire"})),
      validate_decode_(
          r->AddCounter("asyncps_shard_validate_decode_seconds_total",
                        "Time validating and decoding pushes.")
              .Get()),
      checkpoints_(r->AddCounter("asyncps_shard_checkpoints_total",
                                 "Checkpoints written since start.")
                       .Get()),
      checkpoint_seconds_(
          r->AddCounter("asyncps_shard_checkpoint_seconds_total",
                        "Time writing checkpoints to the store.")
              .Get()),
      durable_writes_(r->AddCounter("asyncps_shard_durable_writes_total",
                                    "Writes of --durable mode (applied pushes, "
                                    "BSP rounds, clocks).")
                          .Get()),
      durable_write_seconds_(
          r->AddCounter("asyncps_shard_durable_write_seconds_total",
                        "Time in --durable writes.")
              .Get()),
      store_bytes_(r->AddCounter("asyncps_shard_store_written_bytes_total",
                                 "Keys and values handed to RocksDB.")
                       .Get()),
      budget_capacity_(r->AddGauge("asyncps_shard_memory_budget_bytes",
                                   kBudgetHelp, {"kind"})
                           .WithLabels({"capacity"})),
      budget_used_(r->AddGauge("asyncps_shard_memory_budget_bytes", kBudgetHelp,
                               {"kind"})
                       .WithLabels({"used"})),
      budget_peak_(r->AddGauge("asyncps_shard_memory_budget_bytes", kBudgetHelp,
                               {"kind"})
                       .WithLabels({"peak"})),
      budget_refusals_(
          r->AddCounter("asyncps_shard_memory_budget_refusals_total",
                        "Reservations the memory budget refused.")
              .Get()),
      unsent_(r->AddGauge("asyncps_shard_unsent_reply_bytes",
                          "Bytes of replies ZeroMQ has not released yet.")
                  .Get()),
      degraded_(r->AddGauge("asyncps_shard_degraded",
                            "1 while pushes are refused after a failed "
                            "durable write, until a checkpoint succeeds.")
                    .Get()),
      version_(
          r->AddGauge("asyncps_shard_version", "Updates applied by the shard.")
              .Get()),
      parked_(r->AddGauge("asyncps_shard_parked_pulls",
                          "Pulls waiting for the clock bound.")
                  .Get()),
      live_(r->AddGauge("asyncps_shard_live_workers",
                        "Workers in the clock minimum.")
                .Get()),
      min_clock_(r->AddGauge("asyncps_shard_min_clock",
                             "Minimum clock of live workers.")
                     .Get()),
      bsp_round_(
          r->AddGauge("asyncps_shard_bsp_round", "Current BSP round.").Get()),
      chunk_bytes_(r->AddGauge("asyncps_shard_chunk_bytes",
                               "Bytes of weights the shard holds.")
                       .Get()),
      cache_budget_(r->AddGauge("asyncps_shard_row_cache_budget_bytes",
                                "Budget of the sparse tables' row cache.")
                        .Get()),
      cache_used_(r->AddGauge("asyncps_shard_row_cache_bytes",
                              "Bytes of rows in the sparse tables' cache.")
                      .Get()) {
  auto store_counter = [&](const char* name, const char* help) {
    return &r->AddCounter(name, help).Get();
  };
  auto store_gauge = [&](const char* name, const char* help) {
    return &r->AddGauge(name, help).Get();
  };
  store_.bytes_written = store_counter(
      "asyncps_shard_rocksdb_written_bytes_total",
      "Bytes of keys and values written to RocksDB (its BYTES_WRITTEN).");
  store_.keys_written =
      store_counter("asyncps_shard_rocksdb_written_keys_total",
                    "Records written to RocksDB.");
  store_.wal_bytes =
      store_counter("asyncps_shard_rocksdb_wal_bytes_total",
                    "Bytes RocksDB wrote to its write-ahead log.");
  store_.flush_bytes = store_counter("asyncps_shard_rocksdb_flush_bytes_total",
                                     "Bytes RocksDB wrote flushing memtables.");
  store_.compaction_read_bytes =
      store_counter("asyncps_shard_rocksdb_compaction_read_bytes_total",
                    "Bytes RocksDB read in compactions.");
  store_.compaction_write_bytes =
      store_counter("asyncps_shard_rocksdb_compaction_write_bytes_total",
                    "Bytes RocksDB wrote in compactions.");
  store_.stall_seconds =
      store_counter("asyncps_shard_rocksdb_stall_seconds_total",
                    "Time RocksDB stalled writes (memtables or L0 full).");
  store_.block_cache_hits =
      store_counter("asyncps_shard_rocksdb_block_cache_hits_total",
                    "RocksDB block cache hits.");
  store_.block_cache_misses =
      store_counter("asyncps_shard_rocksdb_block_cache_misses_total",
                    "RocksDB block cache misses.");
  store_.disk_bytes = store_gauge("asyncps_shard_rocksdb_sst_bytes",
                                  "Bytes of RocksDB's live table files.");
  store_.memtable_bytes = store_gauge("asyncps_shard_rocksdb_memtable_bytes",
                                      "Bytes of RocksDB's memtables.");
  store_.block_cache_bytes = store_gauge(
      "asyncps_shard_rocksdb_block_cache_bytes", "RocksDB block cache in use.");
  store_.running_compactions =
      store_gauge("asyncps_shard_rocksdb_running_compactions",
                  "RocksDB compactions running now.");
  store_.pending_compaction_bytes =
      store_gauge("asyncps_shard_rocksdb_pending_compaction_bytes",
                  "Bytes RocksDB estimates its compactions still have to do.");
  const std::vector<std::string> table = {"table"};
  for (size_t i = 0; i < kTableCounters; ++i) {
    table_counters_[i] = &r->AddCounter(kTableCounterDefs[i].name,
                                        kTableCounterDefs[i].help, table);
  }
  for (size_t i = 0; i < kTableGauges; ++i) {
    table_gauges_[i] =
        &r->AddGauge(kTableGaugeDefs[i].name, kTableGaugeDefs[i].help, table);
  }
  auto& requests = r->AddCounter("asyncps_shard_requests_total",
                                 "Requests received, by kind.", {"kind"});
  auto& request_bytes = r->AddCounter(
      "asyncps_shard_request_bytes_total",
      "Bytes received in requests (all frames), by kind.", {"kind"});
  auto& reply_bytes =
      r->AddCounter("asyncps_shard_reply_bytes_total",
                    "Bytes sent in replies (all frames), by kind.", {"kind"});
  auto& seconds =
      r->AddHistogram("asyncps_shard_request_seconds",
                      "Time the event loop spent handling a request, by kind.",
                      Histogram::ExponentialBounds(1e-6, 3, 14), {"kind"});
  for (RequestKind k : kKinds) {
    const std::string name = RequestKindName(k);
    kinds_.push_back(
        {&requests.WithLabels({name}), &request_bytes.WithLabels({name}),
         &reply_bytes.WithLabels({name}), &seconds.WithLabels({name})});
  }
  auto& rejected = r->AddCounter("asyncps_shard_rejected_total",
                                 "Requests rejected, by reason.", {"reason"});
  for (size_t i = 0; i < kNumRejectReasons; ++i) {
    rejected_.push_back(
        &rejected.WithLabels({RejectReasonName(static_cast<RejectReason>(i))}));
  }
  auto& clock =
      r->AddGauge("asyncps_shard_worker_clock",
                  "Clock of each worker as this shard knows it.", {"rank"});
  auto& live =
      r->AddGauge("asyncps_shard_worker_live",
                  "1 if the worker is in the clock minimum.", {"rank"});
  const int ranks = std::min(num_workers, options_.max_rank_series);
  for (int rank = 0; rank < ranks; ++rank) {
    clock_.push_back(&clock.WithLabels({std::to_string(rank)}));
    rank_live_.push_back(&live.WithLabels({std::to_string(rank)}));
  }
}

ServerMetrics::PerKind& ServerMetrics::Kind(RequestKind k) {
  const size_t i = static_cast<size_t>(k);
  return kinds_[i < kinds_.size()
                    ? i
                    : static_cast<size_t>(RequestKind::kHeartbeat)];
}

void ServerMetrics::OnRequest(RequestKind kind, const std::string& peer,
                              uint64_t id, uint64_t bytes, TimePoint arrived,
                              double handle_s) {
  PerKind& k = Kind(kind);
  k.requests->Inc();
  k.request_bytes->Inc(static_cast<double>(bytes));
  k.seconds->Observe(handle_s);
  if (kind == RequestKind::kPull &&
      pull_arrivals_.size() < options_.max_timed_pulls) {
    // A resent pull keeps its first arrival.
    pull_arrivals_.emplace(PullKey(peer, id), arrived);
  }
}

void ServerMetrics::OnReply(const std::string& peer, const ReplyHeader& reply,
                            uint64_t bytes, TimePoint now) {
  Kind(reply.kind).reply_bytes->Inc(static_cast<double>(bytes));
  if (reply.kind == RequestKind::kPull) {
    auto it = pull_arrivals_.find(PullKey(peer, reply.id));
    if (it != pull_arrivals_.end()) {
      pull_wait_.Observe(
          std::chrono::duration<double>(now - it->second).count());
      pull_arrivals_.erase(it);
    }
  } else if (reply.kind == RequestKind::kPush && reply.status.ok() &&
             reply.staleness >= 0) {
    staleness_.Observe(static_cast<double>(reply.staleness));
  }
}

void ServerMetrics::Publish(const Shard& shard, TimePoint now) {
  if (now - last_publish_ < options_.publish_every) return;
  last_publish_ = now;
  const ShardCounters& c = shard.counters();
  pushes_.Publish(static_cast<double>(c.pushes));
  duplicate_pushes_.Publish(static_cast<double>(c.duplicate_pushes));
  pulls_.Publish(static_cast<double>(c.pulls));
  push_raw_.Publish(static_cast<double>(c.bytes_in_raw));
  push_wire_.Publish(static_cast<double>(c.bytes_in));
  validate_decode_.Publish(static_cast<double>(c.validate_decode_ns) * 1e-9);
  checkpoints_.Publish(static_cast<double>(c.checkpoints));
  checkpoint_seconds_.Publish(static_cast<double>(c.checkpoint_ns) * 1e-9);
  durable_writes_.Publish(static_cast<double>(c.durable_writes));
  durable_write_seconds_.Publish(static_cast<double>(c.durable_write_ns) *
                                 1e-9);
  store_bytes_.Publish(static_cast<double>(c.store_bytes_written));
  const MemoryBudget& budget = shard.budget();
  budget_capacity_.Set(static_cast<double>(budget.capacity()));
  budget_used_.Set(static_cast<double>(budget.used()));
  budget_peak_.Set(static_cast<double>(budget.peak()));
  budget_refusals_.Publish(static_cast<double>(budget.refusals()));
  unsent_.Set(static_cast<double>(shard.unsent_reply_bytes()));
  degraded_.Set(shard.degraded() ? 1 : 0);
  for (size_t i = 0; i < rejected_.size(); ++i) {
    rejected_[i]->Publish(static_cast<double>(c.rejected[i]));
  }
  version_.Set(static_cast<double>(shard.shard_version()));
  parked_.Set(static_cast<double>(shard.num_parked()));
  const WorkerClocks& clocks = shard.clocks();
  live_.Set(clocks.num_live());
  min_clock_.Set(static_cast<double>(clocks.MinLiveClock()));
  bsp_round_.Set(static_cast<double>(shard.bsp_round()));
  for (size_t r = 0; r < clock_.size(); ++r) {
    clock_[r]->Set(static_cast<double>(clocks.clock(static_cast<int>(r))));
    rank_live_[r]->Set(clocks.live(static_cast<int>(r)) ? 1 : 0);
  }
  uint64_t bytes = 0;
  if (const Layout* l = shard.layout()) {
    bytes = l->ShardBytes()[shard.options().shard_id];
  }
  chunk_bytes_.Set(static_cast<double>(bytes));
  PublishStore(shard);
  PublishTables(shard);
  // Pulls that never got a reply (peer gone, shard answered elsewhere):
  // keep the map from growing with them.
  if (pull_arrivals_.size() >= options_.max_timed_pulls / 2) {
    for (auto it = pull_arrivals_.begin(); it != pull_arrivals_.end();) {
      it = now - it->second > std::chrono::minutes(10)
               ? pull_arrivals_.erase(it)
               : std::next(it);
    }
  }
}

void ServerMetrics::PublishStore(const Shard& shard) {
  const StoreStats s = shard.store_stats();
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  store_.bytes_written->Publish(d(s.bytes_written));
  store_.keys_written->Publish(d(s.keys_written));
  store_.wal_bytes->Publish(d(s.wal_bytes));
  store_.flush_bytes->Publish(d(s.flush_bytes));
  store_.compaction_read_bytes->Publish(d(s.compaction_read_bytes));
  store_.compaction_write_bytes->Publish(d(s.compaction_write_bytes));
  store_.stall_seconds->Publish(d(s.stall_micros) * 1e-6);
  store_.block_cache_hits->Publish(d(s.block_cache_hits));
  store_.block_cache_misses->Publish(d(s.block_cache_misses));
  store_.disk_bytes->Set(d(s.disk_bytes));
  store_.memtable_bytes->Set(d(s.memtable_bytes));
  store_.block_cache_bytes->Set(d(s.block_cache_bytes));
  store_.running_compactions->Set(d(s.running_compactions));
  store_.pending_compaction_bytes->Set(d(s.pending_compaction_bytes));
}

void ServerMetrics::PublishTables(const Shard& shard) {
  const sparse::SparseTables* st = shard.sparse_tables();
  if (st == nullptr) return;
  cache_budget_.Set(static_cast<double>(st->options().cache_bytes));
  cache_used_.Set(static_cast<double>(st->cache_bytes()));
  static_assert(std::size(kTableCounterDefs) == kTableCounters);
  static_assert(std::size(kTableGaugeDefs) == kTableGauges);
  const size_t n = std::min(st->num_tables(), options_.max_table_series);
  while (tables_.size() < n) {
    const std::vector<std::string> l = {st->table(tables_.size()).spec().name};
    TableSeries t;
    for (size_t i = 0; i < kTableCounters; ++i)
      t.counters[i] = &table_counters_[i]->WithLabels(l);
    for (size_t i = 0; i < kTableGauges; ++i)
      t.gauges[i] = &table_gauges_[i]->WithLabels(l);
    tables_.push_back(t);
  }
  for (size_t i = 0; i < n; ++i) {
    const sparse::SparseTable& t = st->table(i);
    const sparse::TableCounters& c = t.counters();
    const SpaceStats ss = shard.space_stats(t.space());
    // In the order of kTableCounterDefs and kTableGaugeDefs.
    const uint64_t counters[kTableCounters] = {
        c.rows_read,    c.rows_pushed, c.hits,      c.misses,   c.store_reads,
        c.store_writes, c.write_backs, c.evictions, c.admitted, c.expired};
    const uint64_t gauges[kTableGauges] = {t.cache_rows(), t.cache_bytes(),
                                           ss.estimated_keys, ss.disk_bytes};
    for (size_t j = 0; j < kTableCounters; ++j)
      tables_[i].counters[j]->Publish(static_cast<double>(counters[j]));
    for (size_t j = 0; j < kTableGauges; ++j)
      tables_[i].gauges[j]->Set(static_cast<double>(gauges[j]));
  }
}

}  // namespace asyncps::server
