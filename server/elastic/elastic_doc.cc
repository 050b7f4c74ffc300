#include "server/elastic/elastic_doc.h"

#include <algorithm>
#include <map>

namespace asyncps::server::elastic {

namespace {

std::map<int, uint64_t> Loads(const std::vector<uint64_t>& sizes,
                              const std::vector<int>& owners,
                              const std::vector<int>& active) {
  std::map<int, uint64_t> load;
  for (int a : active) load[a] = 0;
  for (size_t i = 0; i < owners.size(); ++i) {
    auto it = load.find(owners[i]);
    if (it != load.end()) it->second += sizes[i];
  }
  return load;
}

int Lightest(const std::map<int, uint64_t>& load) {
  return std::min_element(
             load.begin(), load.end(),
             [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

int Heaviest(const std::map<int, uint64_t>& load) {
  return std::max_element(
             load.begin(), load.end(),
             [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

}  // namespace

std::vector<int> Rebalance(const std::vector<uint64_t>& sizes,
                           const std::vector<int>& owners,
                           const std::vector<int>& active) {
  std::vector<int> out = owners;
  std::map<int, uint64_t> load = Loads(sizes, out, active);
  // Chunks of shards that leave, largest first, to the least loaded.
  std::vector<uint32_t> homeless;
  for (uint32_t i = 0; i < out.size(); ++i)
    if (load.count(out[i]) == 0) homeless.push_back(i);
  std::stable_sort(homeless.begin(), homeless.end(),
                   [&](uint32_t a, uint32_t b) { return sizes[a] > sizes[b]; });
  for (uint32_t i : homeless) {
    const int to = Lightest(load);
    out[i] = to;
    load[to] += sizes[i];
  }
  // Then narrow the gap between the heaviest and the lightest shard, one
  // chunk at a time, moving the largest that fits half of it (so each move
  // lowers the heaviest and keeps the lightest below it). Each move lowers
  // the sum of squared loads, so this ends; the bound is a guard.
  for (size_t moves = 0; moves < out.size() * 4 + 16; ++moves) {
    const int heavy = Heaviest(load), light = Lightest(load);
    const uint64_t gap = load[heavy] - load[light];
    int64_t best = -1;
    for (uint32_t i = 0; i < out.size(); ++i) {
      if (out[i] != heavy || sizes[i] == 0 || sizes[i] * 2 > gap) continue;
      if (best < 0 || sizes[i] > sizes[best]) best = i;
    }
    if (best < 0) break;
    out[best] = light;
    load[heavy] -= sizes[best];
    load[light] += sizes[best];
  }
  return out;
}

std::vector<int> RebalanceBuckets(const std::vector<int>& owners,
                                  const std::vector<int>& active) {
  std::map<int, uint64_t> held;
  for (int a : active) held[a] = 0;
  for (int o : owners) {
    auto it = held.find(o);
    if (it != held.end()) ++it->second;
  }
  // Shares: B / A each; the remainder to the largest holders (ties: lower
  // index first), who then keep one more.
  const uint64_t base = owners.size() / active.size();
  uint64_t extra = owners.size() % active.size();
  std::vector<int> order = active;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return held[a] > held[b]; });
  std::map<int, uint64_t> share;
  for (int a : order) share[a] = base + (extra > 0 ? (--extra, 1) : 0);
  std::vector<int> out = owners;
  std::map<int, uint64_t> kept;
  std::vector<uint32_t> free;
  for (uint32_t b = 0; b < out.size(); ++b) {
    auto it = share.find(out[b]);
    if (it != share.end() && kept[out[b]] < it->second) {
      ++kept[out[b]];
    } else {
      free.push_back(b);
    }
  }
  size_t next = 0;
  for (int a : active) {
    while (kept[a] < share[a] && next < free.size()) {
      out[free[next++]] = a;
      ++kept[a];
    }
  }
  return out;
}

double Imbalance(const std::vector<uint64_t>& sizes,
                 const std::vector<int>& owners,
                 const std::vector<int>& active) {
  std::map<int, uint64_t> load = Loads(sizes, owners, active);
  uint64_t total = 0, most = 0;
  for (const auto& [s, b] : load) {
    total += b;
    most = std::max(most, b);
  }
  if (total == 0 || load.empty()) return 1.0;
  return static_cast<double>(most) * static_cast<double>(load.size()) /
         static_cast<double>(total);
}

}  // namespace asyncps::server::elastic
