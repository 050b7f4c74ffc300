// Shard: the stats document (ps_ctl stats), built with nlohmann-json.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/internal/push_dedup.h"
#include "server/shard/shard.h"
#include "server/shard/shard_types.h"
#include "server/shard/stats_json.h"

namespace asyncps::server {

using internal::Json;

std::string Shard::StatsJson() const {
  uint64_t bytes = 0;
  for (const auto& c : chunks_) bytes += c->n * sizeof(float);
  Json clocks = Json::array(), live = Json::array();
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    clocks.push_back(clocks_.clock(r));
    live.push_back(clocks_.live(r));
  }
  Json rejected = Json::object();
  uint64_t rejected_total = 0;
  for (size_t i = 0; i < kNumRejectReasons; ++i) {
    rejected_total += counters_.rejected[i];
    if (counters_.rejected[i] == 0) continue;
    rejected[RejectReasonName(static_cast<RejectReason>(i))] =
        counters_.rejected[i];
  }
  // Key names are read by launch/pslaunch and experiments/: append only.
  Json j;
  j["shard"] = options_.shard_id;
  j["num_shards"] = options_.num_shards;
  j["registered"] = registered();
  j["tensors"] = layout_ ? layout_->tensors().size() : 0;
  j["chunks"] = chunks_.size();
  j["bytes"] = bytes;
  j["version"] = shard_version_;
  j["consistency"] = ConsistencyName(options_.consistency);
  j["staleness_bound"] = options_.staleness;
  j["optimizer"] = OptimizerKindName(options_.optimizer.kind);
  j["lr"] = options_.optimizer.lr;
  j["weight_decay"] = options_.optimizer.weight_decay;
  j["max_lr"] = options_.max_lr;
  j["worker_lr"] = worker_lr_;  // 0: none set (shard_push.cc)
  j["sparse_async"] = options_.sparse_async;
  j["num_workers"] = options_.num_workers;
  j["worker_clocks"] = std::move(clocks);
  j["worker_live"] = std::move(live);
  j["min_clock"] = clocks_.MinLiveClock();
  j["bsp_round"] = bsp_round_;
  j["parked_pulls"] = parked_.size();
  j["pushes"] = counters_.pushes;
  j["duplicate_pushes"] = counters_.duplicate_pushes;
  j["pulls"] = counters_.pulls;
  j["bytes_in"] = counters_.bytes_in;
  j["bytes_in_raw"] = counters_.bytes_in_raw;
  j["validate_decode_ms"] = counters_.validate_decode_ns / 1000000;
  j["bytes_out"] = counters_.bytes_out;
  j["shm_bytes_out"] = counters_.shm_bytes_out;
  j["shm_segments"] = shm_.size();
  j["checkpoints"] = counters_.checkpoints;
  j["checkpoint_ms"] = counters_.checkpoint_ns / 1000000;
  j["durable_writes"] = counters_.durable_writes;
  j["durable_write_ms"] = counters_.durable_write_ns / 1000000;
  j["store_bytes_written"] = counters_.store_bytes_written;
  j["rejected_total"] = rejected_total;
  j["rejected"] = std::move(rejected);
  j["staleness"] = internal::StalenessJson(staleness_);
  j["skipped_pushes"] = counters_.skipped_pushes;
  j["degraded"] = degraded_;
  j["memory_budget"] = {{"capacity", budget_->capacity()},
                        {"used", budget_->used()},
                        {"peak", budget_->peak()},
                        {"refusals", budget_->refusals()}};
  j["unsent_reply_bytes"] = unsent_reply_bytes();
  j["dedup_applied_ids"] = dedup_->applied_ids();
  // The de-duplication table, for exact accounting of acknowledged pushes
  // (experiments/chaos/soak.py): per client its floor and applied ids above
  // it. At most 256 clients and 16 ids each are listed.
  Json table = Json::array();
  dedup_->ForEach([&table](int rank, uint64_t incarnation, uint64_t floor,
                           const std::vector<uint64_t>& applied) {
    if (table.size() >= 256) return;
    Json ids = Json::array();
    for (size_t i = 0; i < applied.size() && i < 16; ++i)
      ids.push_back(applied[i]);
    table.push_back({{"rank", rank},
                     {"incarnation", incarnation},
                     {"floor", floor},
                     {"applied", std::move(ids)},
                     {"applied_total", applied.size()}});
  });
  j["push_table"] = std::move(table);
  if (sparse_) j["sparse"] = Json::parse(sparse_->StatsJson());
  j["lr_schedule"] = options_.lr_schedule().ToString();
  j["lr_scale"] = ScheduleScale();
  j["staleness_lr"] = StalenessLrName(options_.staleness_lr);
  // Delay compensation: pushes corrected or not, and the distinct read
  // snapshots its tables hold now (bytes also counted in memory_budget.used).
  uint64_t dc_buffers = 0, dc_bytes = 0;
  {
    std::vector<const ChargedBuffer*> seen;
    for (const DcReads& r : dc_reads_) {
      for (const DcReads::Slot& s : r.slots) {
        for (const auto& b : s.chunks) {
          if (b) seen.push_back(b.get());
        }
      }
    }
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    dc_buffers = seen.size();
    for (const ChargedBuffer* b : seen) dc_bytes += b->buffer->size();
  }
  j["delay_compensation"] = {{"rule", options_.delay_compensation.ToString()},
                             {"compensated", counters_.dc_compensated},
                             {"uncompensated", counters_.dc_uncompensated},
                             {"read_snapshots", dc_buffers},
                             {"read_snapshot_bytes", dc_bytes}};
  return j.dump();
}

}  // namespace asyncps::server
