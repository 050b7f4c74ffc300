// WorkerMetrics: the Prometheus metrics of one training worker.
//
// Fed by the Trainer (or any training loop, e.g. the Python package's) from
// its own thread after each step and evaluation; read by the metrics HTTP
// server's threads through the registry's atomics, so a scrape never waits
// for a step. Families (all prefixed asyncps_worker_; no rank label: the
// scrape target identifies the worker, psrun adds rank as a target label):
//   steps_total, samples_total                 counters
//   samples_per_second                         gauge, over the last >= 1 s
//   train_loss                                 gauge, last step's loss
//   test_accuracy, test_loss                   gauges, last evaluation
//   step_compute_seconds, pull_wait_seconds    histograms per step
//   pull_wait_seconds_total, encode_seconds_total   counters
//   pushed_bytes_total{kind=raw|wire}, pulled_bytes_total   counters
//   compression_ratio                          gauge, raw / wire pushed bytes
//   staleness                                  histogram of the staleness the
//                                              shards reported per step
//   resends_total                              counter (client resends)
//
// Thread safety: OnStep/OnEval from one thread; the registry from any.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/metrics.h"
#include "worker/parameter_store.h"

namespace asyncps::worker {

class WorkerMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  // `resends` (may be empty) returns the client's resend count; it is called
  // from OnStep's thread only.
  WorkerMetrics(metrics::Registry* registry,
                std::function<uint64_t()> resends = nullptr);

  // After each step: its loss, examples, compute time, and the store's
  // cumulative traffic counters (TrafficStats are cumulative: the deltas
  // since the previous call are exported).
  void OnStep(double loss, int64_t samples, double compute_s,
              const TrafficStats& traffic);
  // After an evaluation on the test set.
  void OnEval(double accuracy, double loss);

 private:
  using SteadyClock = std::chrono::steady_clock;

  std::function<uint64_t()> resends_;
  metrics::Counter& steps_;
  metrics::Counter& samples_;
  metrics::Gauge& samples_per_s_;
  metrics::Gauge& train_loss_;
  metrics::Gauge& test_accuracy_;
  metrics::Gauge& test_loss_;
  metrics::Histogram& compute_;
  metrics::Histogram& pull_wait_;
  metrics::Counter& pull_wait_total_;
  metrics::Counter& encode_total_;
  metrics::Counter& pushed_raw_;
  metrics::Counter& pushed_wire_;
  metrics::Counter& pulled_;
  metrics::Gauge& ratio_;
  metrics::Histogram& staleness_;
  metrics::Counter& resends_total_;
  TrafficStats last_;
  int64_t rate_samples_ = 0;
  SteadyClock::time_point rate_start_ = SteadyClock::now();
};

}  // namespace asyncps::worker
