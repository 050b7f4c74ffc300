// Metrics: counters, gauges and histograms of one process, rendered in the
// Prometheus text exposition format (version 0.0.4).
//
// A Registry owns metric families. A family has a name, a help text, a type
// and a fixed list of label names; each distinct list of label values is one
// child metric (Counter, Gauge or Histogram), created on first use and alive
// as long as the registry. Callers look a child up once (WithLabels) and keep
// the reference: updating it is lock-free (relaxed atomics), so the hot paths
// (a shard's event loop, a training step) never wait for a scrape.
//
// Naming follows Prometheus' conventions, enforced at registration (a
// violation is a programmer error and CHECK-fails): names match
// [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in "_total", label names match
// [a-zA-Z_][a-zA-Z0-9_]* and never start with "__", "le" is reserved for
// histograms. Use base units (seconds, bytes) and no per-key labels: label
// values must come from small sets (request kinds, ranks, reasons).
//
// Collectors: a function registered with AddCollector() runs at the start of
// every Render(), on the rendering (scrape) thread, to refresh gauges from
// state that is cheaper to read on demand (e.g. process RSS). A collector
// must only read thread-safe state; it must never wait for an event loop.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace asyncps::metrics {

// A monotonically increasing value (events, bytes, seconds spent).
class Counter {
 public:
  // Adds `v` (>= 0; negative or NaN values are ignored).
  void Inc(double v = 1.0);
  // Publishes the value of a counter kept elsewhere (e.g. a shard's own
  // counters, copied by its event loop). Values below the current one are
  // ignored, so the exported counter never goes down.
  void Publish(double v);
  double value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // a double's bits
};

// A value that goes up and down (queue length, memory, a worker's clock).
class Gauge {
 public:
  void Set(double v);
  void Add(double v);
  double value() const;

 private:
  std::atomic<uint64_t> bits_{0};
};

// Counts observations into buckets with fixed upper bounds.
class Histogram {
 public:
  // `bounds`: finite upper bounds, strictly increasing; the +Inf bucket is
  // implicit. REQUIRES: valid bounds (CHECK).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  // Replaces the whole state with counts kept elsewhere: `per_bucket` has
  // bounds().size() + 1 entries (the last one counts values above every
  // bound), not cumulative. Use for histograms a single thread accumulates
  // in its own structure (a shard's staleness histogram).
  void Publish(const std::vector<uint64_t>& per_bucket, double sum);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Snap() const;
  const std::vector<double>& bounds() const { return bounds_; }

  // Bounds start, start*factor, ..., `count` of them. REQUIRES: start > 0,
  // factor > 1, count >= 1.
  static std::vector<double> ExponentialBounds(double start, double factor,
                                               int count);

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> sum_bits_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// A family's children by label values. Stable references.
template <typename T>
class Family {
 public:
  // The child with these label values (one per label name, in order),
  // created on first use. REQUIRES: values.size() == label count (CHECK).
  T& WithLabels(const std::vector<std::string>& values);
  // The child of a family without labels.
  T& Get() { return WithLabels({}); }

 private:
  friend class Registry;
  Family(std::string name, std::string help, MetricType type,
         std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make);

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_
      GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family. Registering a name twice with the same type and
  // labels returns the existing family; any other clash CHECK-fails.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name,
                                  const std::string& help,
                                  std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});

  // Runs `fn` at the start of every Render().
  void AddCollector(std::function<void()> fn);

  // The whole registry in the text exposition format 0.0.4, families in
  // registration order, children by label values.
  std::string Render() const;

 private:
  struct Entry;
  template <typename T>
  Family<T>& Add(const std::string& name, const std::string& help,
                 MetricType type, std::vector<std::string> label_names,
                 std::function<std::unique_ptr<T>()> make,
                 std::vector<double> bounds);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ GUARDED_BY(mu_);
};

// Formats a sample value as Prometheus does: shortest round-trip decimal,
// "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);

// Adds gauges of this process (resident memory, open file descriptors, CPU
// seconds, start time) under the standard names process_resident_memory_bytes,
// process_open_fds, process_cpu_seconds_total, process_start_time_seconds,
// refreshed by a collector from /proc at each scrape.
void AddProcessMetrics(Registry* registry);

}  // namespace asyncps::metrics
