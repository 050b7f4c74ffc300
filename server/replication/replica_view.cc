#include "server/replication/replica_view.h"

#include <nlohmann/json.hpp>

namespace asyncps::server::replication {

std::string ReplicaName(int group, int replica) {
  return "g" + std::to_string(group) + "r" + std::to_string(replica);
}

ReplicaLayout ReplicaLayout::Initial(int groups, int replicas) {
  ReplicaLayout l;
  l.epoch = 1;
  l.groups.resize(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    l.groups[g].epoch = 1;
    l.groups[g].primary = ReplicaName(g, 0);
    for (int r = 1; r < replicas; ++r)
      l.groups[g].backups.push_back(ReplicaName(g, r));
  }
  return l;
}

std::string ReplicaLayout::ToJson() const {
  nlohmann::json j;
  j["epoch"] = epoch;
  j["groups"] = nlohmann::json::array();
  for (const GroupLayout& g : groups) {
    nlohmann::json inc = nlohmann::json::object();
    for (const auto& [n, i] : g.incarnations) inc[n] = i;
    j["groups"].push_back({{"epoch", g.epoch},
                           {"primary", g.primary},
                           {"backups", g.backups},
                           {"incarnations", inc}});
  }
  return j.dump();
}

StatusOr<ReplicaLayout> ReplicaLayout::FromJson(const std::string& json) {
  // Bounded: a layout names at most this many groups and replicas each.
  constexpr size_t kMaxGroups = 65536, kMaxReplicas = 64;
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption("replica layout is not a JSON object");
  ReplicaLayout l;
  try {
    // Epochs and incarnations are unsigned and leave room to count on (a
    // negative number would read as a huge one: the next epoch would wrap).
    auto count = [](const nlohmann::json& v) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() > (uint64_t{1} << 62))
        throw nlohmann::json::type_error::create(302, "not a count", &v);
      return v.get<uint64_t>();
    };
    l.epoch = count(j.at("epoch"));
    const auto& groups = j.at("groups");
    if (!groups.is_array() || groups.size() > kMaxGroups)
      return Status::Corruption("replica layout: bad groups list");
    for (const auto& g : groups) {
      GroupLayout gl;
      gl.epoch = g.contains("epoch") ? count(g.at("epoch")) : l.epoch;
      if (gl.epoch > l.epoch)
        return Status::Corruption("replica layout: a group is ahead of it");
      gl.primary = g.at("primary").get<std::string>();
      const auto& b = g.at("backups");
      if (!b.is_array() || b.size() > kMaxReplicas)
        return Status::Corruption("replica layout: bad backups list");
      for (const auto& n : b) gl.backups.push_back(n.get<std::string>());
      if (g.contains("incarnations")) {
        const auto& inc = g.at("incarnations");
        if (!inc.is_object() || inc.size() > kMaxReplicas)
          return Status::Corruption("replica layout: bad incarnations");
        for (const auto& [n, i] : inc.items()) {
          if (!i.is_number_unsigned())
            return Status::Corruption("replica layout: bad incarnation");
          gl.incarnations[n] = i.get<uint64_t>();
        }
      }
      l.groups.push_back(std::move(gl));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(std::string("replica layout: ") + e.what());
  }
  return l;
}

const ReplicaMember* ReplicaView::MemberAt(const std::string& endpoint) const {
  for (const ReplicaMember& m : members)
    if (m.endpoint == endpoint) return &m;
  return nullptr;
}

const ReplicaMember* ReplicaView::MemberWithKey(const std::string& key) const {
  if (key.empty()) return nullptr;
  for (const ReplicaMember& m : members)
    if (m.replica_key == key) return &m;
  return nullptr;
}

const ReplicaMember* ReplicaView::Member(const std::string& name,
                                         uint64_t incarnation) const {
  for (const ReplicaMember& m : members)
    if (m.name == name && m.incarnation == incarnation) return &m;
  return nullptr;
}

}  // namespace asyncps::server::replication
