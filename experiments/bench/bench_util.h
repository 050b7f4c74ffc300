// Shared helpers of the compiled benchmarks: repeats, their median and
// spread, CPU time, and one JSON object per output line (nlohmann-json).
//
// Every figure a benchmark prints is the median of `repeats` measurements,
// each taken right next to its same-run baseline (interleaved: a burst of
// load on this shared machine hits both alike), with the spread of the
// repeats (min, max, and the interquartile range) and the median of the
// per-repeat ratios.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace asyncps::bench {

using Json = nlohmann::ordered_json;

// Median and spread of a set of repeats.
struct Spread {
  double median = 0, min = 0, max = 0, p25 = 0, p75 = 0;
  int n = 0;
};

// Quantile q in [0, 1] of sorted values, linearly interpolated.
inline double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] +
         (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

inline Spread SpreadOf(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = static_cast<int>(v.size());
  s.median = Quantile(v, 0.5);
  s.min = v.front();
  s.max = v.back();
  s.p25 = Quantile(v, 0.25);
  s.p75 = Quantile(v, 0.75);
  return s;
}

inline double Round(double v, int digits) {
  double f = 1;
  for (int i = 0; i < digits; ++i) f *= 10;
  return static_cast<double>(
             static_cast<long long>(v * f + (v >= 0 ? 0.5 : -0.5))) /
         f;
}

// {"median":..,"min":..,"max":..,"p25":..,"p75":..,"n":..}
inline Json ToJson(const Spread& s, int digits = 3) {
  Json j;
  j["median"] = Round(s.median, digits);
  j["min"] = Round(s.min, digits);
  j["max"] = Round(s.max, digits);
  j["p25"] = Round(s.p25, digits);
  j["p75"] = Round(s.p75, digits);
  j["n"] = s.n;
  return j;
}

// Per-repeat ratios a[i] / b[i].
inline std::vector<double> Ratios(const std::vector<double>& a,
                                  const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    r.push_back(b[i] > 0 ? a[i] / b[i] : 0);
  }
  return r;
}

// Prints one JSON object on its own line and flushes.
inline void Emit(const Json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// CPU seconds (user + system) this process has used.
inline double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds (user + system) another process has used, from
// /proc/<pid>/stat; 0 if it cannot be read.
inline double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) in parentheses.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields;
  std::string cur;
  for (size_t i = close + 2; i < text.size(); ++i) {
    if (text[i] == ' ') {
      fields.push_back(cur);
      cur.clear();
    } else {
      cur += text[i];
    }
  }
  // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
  if (fields.size() < 13) return 0;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

}  // namespace asyncps::bench
