#include "server/ctl/ctl_top.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

namespace asyncps::server {
namespace {

using nlohmann::json;

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// 1234567 -> "1.2M"; rates and sizes in a narrow column.
std::string Human(double v) {
  const char* units[] = {"", "k", "M", "G", "T"};
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  return Fmt(u == 0 ? "%.0f" : "%.1f", v) + units[u];
}

double Num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

// "0:12 1:12 2:9*" or, past max_listed, "n=64 min 9 med 12 max 13 (3 out)".
std::string Clocks(const json& stats, int max_listed) {
  const json clocks = stats.value("worker_clocks", json::array());
  const json live = stats.value("worker_live", json::array());
  if (!clocks.is_array() || clocks.empty()) return "-";
  std::vector<int64_t> values;
  int out = 0;
  std::string list;
  for (size_t r = 0; r < clocks.size(); ++r) {
    const int64_t c = clocks[r].is_number() ? clocks[r].get<int64_t>() : 0;
    const bool is_live =
        r < live.size() && live[r].is_boolean() && live[r].get<bool>();
    values.push_back(c);
    out += !is_live;
    list += (list.empty() ? "" : " ") + std::to_string(r) + ":" +
            std::to_string(c) + (is_live ? "" : "*");
  }
  if (static_cast<int>(values.size()) <= max_listed) return list;
  std::sort(values.begin(), values.end());
  return "n=" + std::to_string(values.size()) + " min " +
         std::to_string(values.front()) + " med " +
         std::to_string(values[values.size() / 2]) + " max " +
         std::to_string(values.back()) + " (" + std::to_string(out) + " out)";
}

}  // namespace

std::string RenderTopFrame(const std::vector<TopSample>& previous,
                           const std::vector<TopSample>& current,
                           const TopOptions& options) {
  std::string out =
      "shard  version   upd/s  push/s  pull/s   in B/s  out B/s  stale p50 "
      "p99  parked  rejected  consistency  clocks (rank:clock, * = evicted)\n";
  for (size_t i = 0; i < current.size(); ++i) {
    const TopSample& cur = current[i];
    const std::string name = Pad(std::to_string(i), 5);
    if (!cur.status.ok()) {
      out += name + "  " + cur.endpoint + ": " + cur.status.ToString() + "\n";
      continue;
    }
    json now = json::parse(cur.stats, nullptr, /*allow_exceptions=*/false);
    if (!now.is_object()) {
      out += name + "  " + cur.endpoint + ": unparsable stats\n";
      continue;
    }
    // Rates need an earlier good sample of the same shard.
    json before;
    double dt = 0;
    if (i < previous.size() && previous[i].status.ok()) {
      before = json::parse(previous[i].stats, nullptr, false);
      dt = std::chrono::duration<double>(cur.at - previous[i].at).count();
    }
    auto rate = [&](const char* key) -> std::string {
      if (!before.is_object() || dt <= 0) return "-";
      return Human(std::max(0.0, Num(now, key) - Num(before, key)) / dt);
    };
    const json stale = now.value("staleness", json::object());
    const std::string consistency =
        now.value("consistency", std::string("?")) +
        (now.value("consistency", std::string()) == "ssp"
             ? " s=" + std::to_string(now.value("staleness_bound", 0))
             : "");
    out += name + Pad(Human(Num(now, "version")), 9) + Pad(rate("version"), 8) +
           Pad(rate("pushes"), 8) + Pad(rate("pulls"), 8) +
           Pad(rate("bytes_in"), 9) + Pad(rate("bytes_out"), 9) +
           Pad(Human(stale.is_object() ? Num(stale, "p50") : 0), 11) +
           Pad(Human(stale.is_object() ? Num(stale, "p99") : 0), 5) +
           Pad(Human(Num(now, "parked_pulls")), 8) +
           Pad(Human(Num(now, "rejected_total")), 10) + "  " + consistency +
           Pad("", consistency.size() < 11 ? 11 - consistency.size() : 0) +
           "  " + Clocks(now, options.max_workers_listed) + "\n";
  }
  return out;
}

Status RunTop(const std::vector<std::string>& endpoints,
              const std::function<StatusOr<std::string>(size_t)>& fetch,
              const std::function<bool()>& stop, const TopOptions& options) {
  std::vector<TopSample> previous, current;
  Status last;
  for (int frame = 0; options.iterations == 0 || frame < options.iterations;
       ++frame) {
    current.clear();
    size_t failed = 0;
    for (size_t i = 0; i < endpoints.size(); ++i) {
      TopSample s;
      s.endpoint = endpoints[i];
      StatusOr<std::string> got = fetch(i);
      s.at = std::chrono::steady_clock::now();
      if (got.ok()) {
        s.stats = std::move(got).value();
      } else {
        s.status = got.status();
        last = got.status();
        ++failed;
      }
      current.push_back(std::move(s));
    }
    const std::string text = RenderTopFrame(previous, current, options);
    if (options.clear_screen) {
      std::fputs("\x1b[H\x1b[2J", stdout);
    } else if (frame > 0) {
      std::fputs("\n", stdout);
    }
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    previous = current;
    if (options.iterations != 0 && frame + 1 >= options.iterations) {
      return failed == endpoints.size() ? last : Status::OK();
    }
    const auto wake = std::chrono::steady_clock::now() + options.interval;
    while (std::chrono::steady_clock::now() < wake) {
      if (stop()) return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return Status::OK();
}

}  // namespace asyncps::server
