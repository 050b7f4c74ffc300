#include "common/metrics.h"

#include <dirent.h>
#include <glog/logging.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace asyncps::metrics {
namespace {

uint64_t ToBits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

double FromBits(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

// Adds `v` to the double stored in `bits` (compare-and-swap loop; the
// writers of one metric are few, so it rarely retries).
void AtomicAdd(std::atomic<uint64_t>* bits, double v) {
  uint64_t old = bits->load(std::memory_order_relaxed);
  while (!bits->compare_exchange_weak(old, ToBits(FromBits(old) + v),
                                      std::memory_order_relaxed)) {
  }
}

bool ValidName(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       c == '_' || (allow_colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Escapes backslash and newline (HELP text) and, for label values, the
// double quote.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || (quote && c == '"')) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} plus an optional extra label (histogram "le"); "" if none.
std::string LabelSet(const std::vector<std::string>& names,
                     const std::vector<std::string>& values,
                     const std::string& extra_name = "",
                     const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += out.empty() ? "{" : ",";
    out += names[i] + "=\"" + Escape(values[i], /*quote=*/true) + "\"";
  }
  if (!extra_name.empty()) {
    out += out.empty() ? "{" : ",";
    out += extra_name + "=\"" + extra_value + "\"";
  }
  if (!out.empty()) out += "}";
  return out;
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// --- Counter, Gauge, Histogram ------------------------------------------

void Counter::Inc(double v) {
  if (!(v >= 0)) return;
  AtomicAdd(&bits_, v);
}

void Counter::Publish(double v) {
  uint64_t old = bits_.load(std::memory_order_relaxed);
  while (v > FromBits(old) && !bits_.compare_exchange_weak(
                                  old, ToBits(v), std::memory_order_relaxed)) {
  }
}

double Counter::value() const {
  return FromBits(bits_.load(std::memory_order_relaxed));
}

void Gauge::Set(double v) { bits_.store(ToBits(v), std::memory_order_relaxed); }
void Gauge::Add(double v) { AtomicAdd(&bits_, v); }
double Gauge::value() const {
  return FromBits(bits_.load(std::memory_order_relaxed));
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bounds must be finite";
    CHECK(i == 0 || bounds_[i] > bounds_[i - 1])
        << "histogram bounds must increase strictly";
  }
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // Bounds are few (tens): a linear scan beats a binary search here.
  size_t b = 0;
  while (b < bounds_.size() && v > bounds_[b]) ++b;
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_bits_, v);
}

void Histogram::Publish(const std::vector<uint64_t>& per_bucket, double sum) {
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    buckets_[i].store(i < per_bucket.size() ? per_bucket[i] : 0,
                      std::memory_order_relaxed);
  }
  sum_bits_.store(ToBits(sum), std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = FromBits(sum_bits_.load(std::memory_order_relaxed));
  return s;
}

std::vector<double> Histogram::ExponentialBounds(double start, double factor,
                                                 int count) {
  CHECK(start > 0 && factor > 1 && count >= 1);
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// --- Family ---------------------------------------------------------------

template <typename T>
Family<T>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names,
                  std::function<std::unique_ptr<T>()> make)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      make_(std::move(make)) {}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  CHECK_EQ(values.size(), label_names_.size())
      << "metric " << name_ << ": wrong number of label values";
  MutexLock l(&mu_);
  std::unique_ptr<T>& child = children_[values];
  if (!child) child = make_();
  return *child;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// --- Registry -------------------------------------------------------------

struct Registry::Entry {
  MetricType type;
  std::string name;
  std::vector<std::string> label_names;
  std::vector<double> bounds;
  std::unique_ptr<Family<Counter>> counters;
  std::unique_ptr<Family<Gauge>> gauges;
  std::unique_ptr<Family<Histogram>> histograms;

  void Render(std::string* out) const;
};

Registry::Registry() = default;
Registry::~Registry() = default;

template <typename T>
Family<T>& Registry::Add(const std::string& name, const std::string& help,
                         MetricType type, std::vector<std::string> label_names,
                         std::function<std::unique_ptr<T>()> make,
                         std::vector<double> bounds) {
  CHECK(ValidName(name, /*allow_colon=*/true)) << "bad metric name " << name;
  if (type == MetricType::kCounter) {
    CHECK(EndsWith(name, "_total")) << "counter " << name << " needs _total";
  }
  for (const std::string& l : label_names) {
    CHECK(ValidName(l, /*allow_colon=*/false) && l.rfind("__", 0) != 0 &&
          l != "le")
        << "bad label name " << l << " on " << name;
  }
  MutexLock lock(&mu_);
  for (auto& e : entries_) {
    if (e->name != name) continue;
    CHECK(e->type == type && e->label_names == label_names &&
          e->bounds == bounds)
        << "metric " << name << " registered twice with different shapes";
    if constexpr (std::is_same_v<T, Counter>) return *e->counters;
    if constexpr (std::is_same_v<T, Gauge>) return *e->gauges;
    if constexpr (std::is_same_v<T, Histogram>) return *e->histograms;
  }
  auto e = std::make_unique<Entry>();
  e->type = type;
  e->name = name;
  e->label_names = label_names;
  e->bounds = bounds;
  auto* family =
      new Family<T>(name, help, type, std::move(label_names), std::move(make));
  Family<T>& ref = *family;
  if constexpr (std::is_same_v<T, Counter>) e->counters.reset(family);
  if constexpr (std::is_same_v<T, Gauge>) e->gauges.reset(family);
  if constexpr (std::is_same_v<T, Histogram>) e->histograms.reset(family);
  entries_.push_back(std::move(e));
  return ref;
}

Family<Counter>& Registry::AddCounter(const std::string& name,
                                      const std::string& help,
                                      std::vector<std::string> label_names) {
  return Add<Counter>(name, help, MetricType::kCounter, std::move(label_names),
                      [] { return std::make_unique<Counter>(); }, {});
}

Family<Gauge>& Registry::AddGauge(const std::string& name,
                                  const std::string& help,
                                  std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, MetricType::kGauge, std::move(label_names),
                    [] { return std::make_unique<Gauge>(); }, {});
}

Family<Histogram>& Registry::AddHistogram(
    const std::string& name, const std::string& help,
    std::vector<double> bounds, std::vector<std::string> label_names) {
  // Validate the bounds here, where the caller is, not at first use.
  Histogram check(bounds);
  return Add<Histogram>(
      name, help, MetricType::kHistogram, std::move(label_names),
      [bounds] { return std::make_unique<Histogram>(bounds); }, bounds);
}

void Registry::AddCollector(std::function<void()> fn) {
  MutexLock l(&mu_);
  collectors_.push_back(std::move(fn));
}

void Registry::Entry::Render(std::string* out) const {
  const char* type_name = TypeName(type);
  auto header = [&](const std::string& help) {
    *out += "# HELP " + name + " " + Escape(help, /*quote=*/false) + "\n";
    *out += "# TYPE " + name + " " + type_name + "\n";
  };
  auto scalars = [&](const auto& family) {
    header(family.help_);
    MutexLock l(&family.mu_);
    for (const auto& [values, child] : family.children_) {
      *out += name + LabelSet(label_names, values) + " " +
              FormatValue(child->value()) + "\n";
    }
  };
  switch (type) {
    case MetricType::kCounter:
      scalars(*counters);
      break;
    case MetricType::kGauge:
      scalars(*gauges);
      break;
    case MetricType::kHistogram: {
      header(histograms->help_);
      MutexLock l(&histograms->mu_);
      for (const auto& [values, child] : histograms->children_) {
        const Histogram::Snapshot s = child->Snap();
        for (size_t i = 0; i <= bounds.size(); ++i) {
          const std::string le =
              i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
          *out += name + "_bucket" + LabelSet(label_names, values, "le", le) +
                  " " + std::to_string(s.cumulative[i]) + "\n";
        }
        const std::string labels = LabelSet(label_names, values);
        *out += name + "_sum" + labels + " " + FormatValue(s.sum) + "\n";
        *out += name + "_count" + labels + " " + std::to_string(s.count) + "\n";
      }
      break;
    }
  }
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> collectors;
  {
    MutexLock l(&mu_);
    collectors = collectors_;
  }
  for (const auto& fn : collectors) fn();
  std::string out;
  MutexLock l(&mu_);
  for (const auto& e : entries_) e->Render(&out);
  return out;
}

// --- Process metrics --------------------------------------------------------

namespace {

// Fields 14 (utime), 15 (stime) of /proc/self/stat, in clock ticks.
double ProcessCpuSeconds() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  // The command name (field 2) may hold spaces: fields restart after ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return static_cast<double>(resident) *
         static_cast<double>(sysconf(_SC_PAGESIZE));
}

double OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  double n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the descriptor of this listing
}

}  // namespace

void AddProcessMetrics(Registry* registry) {
  Gauge& rss = registry
                   ->AddGauge("process_resident_memory_bytes",
                              "Resident memory size in bytes.")
                   .Get();
  Gauge& fds =
      registry->AddGauge("process_open_fds", "Number of open file descriptors.")
          .Get();
  Counter& cpu = registry
                     ->AddCounter("process_cpu_seconds_total",
                                  "Total user and system CPU time spent in "
                                  "seconds.")
                     .Get();
  Gauge& start = registry
                     ->AddGauge("process_start_time_seconds",
                                "Start time of the process since unix epoch "
                                "in seconds.")
                     .Get();
  start.Set(std::chrono::duration<double>(
                std::chrono::system_clock::now().time_since_epoch())
                .count());
  registry->AddCollector([&rss, &fds, &cpu] {
    rss.Set(ResidentBytes());
    fds.Set(OpenFds());
    cpu.Publish(ProcessCpuSeconds());
  });
}

}  // namespace asyncps::metrics
