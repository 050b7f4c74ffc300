#include "common/elastic_doc.h"

#include <nlohmann/json.hpp>

namespace asyncps {

using json = nlohmann::json;

std::string ElasticDoc::ToJson() const {
  json j;
  j["epoch"] = epoch;
  j["servers"] = servers;
  j["owners"] = owners;
  return j.dump();
}

StatusOr<ElasticDoc> ElasticDoc::FromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument("elastic layout: not a JSON object");
  ElasticDoc d;
  try {
    if (!j.at("epoch").is_number_unsigned())
      return Status::InvalidArgument("elastic layout: epoch must be an unsigned integer");
    d.epoch = j.at("epoch").get<uint64_t>();
    const json& servers = j.at("servers");
    const json& owners = j.at("owners");
    if (!servers.is_array() || servers.empty() || servers.size() > 4096)
      return Status::InvalidArgument("elastic layout: servers must list 1-4096 endpoints");
    if (!owners.is_array() || owners.size() > kMaxElasticChunks)
      return Status::InvalidArgument("elastic layout: owners must list at most 2^24 chunks");
    for (const json& s : servers) d.servers.push_back(s.get<std::string>());
    d.owners.reserve(owners.size());
    for (const json& o : owners) {
      const int64_t v = o.get<int64_t>();
      if (v < 0 || v >= static_cast<int64_t>(d.servers.size())) {
        return Status::InvalidArgument("elastic layout: chunk " +
                                       std::to_string(d.owners.size()) + " owned by shard " +
                                       std::to_string(v) + " of " +
                                       std::to_string(d.servers.size()));
      }
      d.owners.push_back(static_cast<int>(v));
    }
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("elastic layout: ") + e.what());
  }
  return d;
}

std::vector<int> ElasticDoc::Active() const {
  std::vector<bool> has(servers.size(), false);
  for (int o : owners) has[o] = true;
  std::vector<int> a;
  for (size_t i = 0; i < has.size(); ++i)
    if (has[i]) a.push_back(static_cast<int>(i));
  return a;
}

}  // namespace asyncps
