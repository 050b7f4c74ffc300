#include "server/server_metrics.h"

#include <algorithm>

namespace asyncps::server {
namespace {

using metrics::Histogram;

constexpr char kPushBytesHelp[] =
    "Payload bytes of accepted pushes: raw = as dense fp32, wire = as "
    "received.";

constexpr char kBudgetHelp[] =
    "The shard's memory budget: capacity, bytes in use, most in use at once.";

constexpr RequestKind kKinds[] = {
    RequestKind::kRegister,   RequestKind::kPush,      RequestKind::kPull,
    RequestKind::kClock,      RequestKind::kHeartbeat, RequestKind::kStats,
    RequestKind::kCheckpoint, RequestKind::kShutdown};

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
                       .Get()) {
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

}  // namespace asyncps::server
