#include "worker/worker_metrics.h"

namespace asyncps::worker {
namespace {

using metrics::Histogram;

constexpr char kPushedHelp[] =
    "Gradient bytes pushed: raw = as dense fp32, wire = after compression.";

// Staleness in updates: 0, 1, 2, 4, ... 4096.
std::vector<double> StalenessBounds() {
  std::vector<double> b = {0};
  for (double v = 1; v <= 4096; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

WorkerMetrics::WorkerMetrics(metrics::Registry* r,
                             std::function<uint64_t()> resends)
    : resends_(std::move(resends)),
      steps_(r->AddCounter("asyncps_worker_steps_total",
                           "Training steps completed.")
                 .Get()),
      samples_(r->AddCounter("asyncps_worker_samples_total",
                             "Training examples processed.")
                   .Get()),
      samples_per_s_(r->AddGauge("asyncps_worker_samples_per_second",
                                 "Training examples per second over the "
                                 "last second or more.")
                         .Get()),
      train_loss_(r->AddGauge("asyncps_worker_train_loss",
                              "Minibatch loss of the last step.")
                      .Get()),
      test_accuracy_(r->AddGauge("asyncps_worker_test_accuracy",
                                 "Test-set accuracy of the last evaluation.")
                         .Get()),
      test_loss_(r->AddGauge("asyncps_worker_test_loss",
                             "Test-set loss of the last evaluation.")
                     .Get()),
      compute_(r->AddHistogram("asyncps_worker_step_compute_seconds",
                               "Forward and backward time per step.",
                               Histogram::ExponentialBounds(1e-4, 2, 16))
                   .Get()),
      pull_wait_(r->AddHistogram("asyncps_worker_pull_wait_seconds",
                                 "Time blocked in pull per step.",
                                 Histogram::ExponentialBounds(1e-5, 2, 20))
                     .Get()),
      pull_wait_total_(r->AddCounter("asyncps_worker_pull_wait_seconds_total",
                                     "Time blocked in pulls.")
                           .Get()),
      encode_total_(r->AddCounter("asyncps_worker_encode_seconds_total",
                                  "Time compressing gradients.")
                        .Get()),
      pushed_raw_(r->AddCounter("asyncps_worker_pushed_bytes_total",
                                kPushedHelp, {"kind"})
                      .WithLabels({"raw"})),
      pushed_wire_(r->AddCounter("asyncps_worker_pushed_bytes_total",
                                 kPushedHelp, {"kind"})
                       .WithLabels({"wire"})),
      pulled_(r->AddCounter("asyncps_worker_pulled_bytes_total",
                            "Weight bytes received.")
                  .Get()),
      ratio_(r->AddGauge("asyncps_worker_compression_ratio",
                         "Pushed bytes as dense fp32 over bytes on the wire.")
                 .Get()),
      staleness_(r->AddHistogram("asyncps_worker_staleness",
                                 "Staleness (shard updates) the shards "
                                 "recorded for this worker's pushes.",
                                 StalenessBounds())
                     .Get()),
      resends_total_(r->AddCounter("asyncps_worker_resends_total",
                                   "Requests resent to a shard.")
                         .Get()) {
  test_accuracy_.Set(-1);
  test_loss_.Set(-1);
}

void WorkerMetrics::OnStep(double loss, int64_t samples, double compute_s,
                           const TrafficStats& t) {
  steps_.Inc();
  samples_.Inc(static_cast<double>(samples));
  train_loss_.Set(loss);
  compute_.Observe(compute_s);
  const int64_t wait_ns = t.pull_wait_ns - last_.pull_wait_ns;
  pull_wait_.Observe(static_cast<double>(wait_ns) * 1e-9);
  pull_wait_total_.Publish(static_cast<double>(t.pull_wait_ns) * 1e-9);
  encode_total_.Publish(static_cast<double>(t.encode_ns) * 1e-9);
  pushed_raw_.Publish(static_cast<double>(t.bytes_pushed_raw));
  pushed_wire_.Publish(static_cast<double>(t.bytes_pushed_wire));
  pulled_.Publish(static_cast<double>(t.bytes_pulled));
  if (t.bytes_pushed_wire > 0) {
    ratio_.Set(static_cast<double>(t.bytes_pushed_raw) /
               static_cast<double>(t.bytes_pushed_wire));
  }
  if (t.last_staleness >= 0) {
    staleness_.Observe(static_cast<double>(t.last_staleness));
  }
  if (resends_) resends_total_.Publish(static_cast<double>(resends_()));
  last_ = t;
  rate_samples_ += samples;
  const auto now = SteadyClock::now();
  const double dt = std::chrono::duration<double>(now - rate_start_).count();
  if (dt >= 1.0) {
    samples_per_s_.Set(static_cast<double>(rate_samples_) / dt);
    rate_samples_ = 0;
    rate_start_ = now;
  }
}

void WorkerMetrics::OnEval(double accuracy, double loss) {
  test_accuracy_.Set(accuracy);
  test_loss_.Set(loss);
}

}  // namespace asyncps::worker
