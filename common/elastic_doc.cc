#include "common/elastic_doc.h"

#include <nlohmann/json.hpp>

#include "common/sparse_table.h"

namespace asyncps {

using json = nlohmann::json;

std::string ElasticDoc::ToJson() const {
  json j;
  j["epoch"] = epoch;
  j["servers"] = servers;
  j["owners"] = owners;
  if (num_buckets > 0) {
    j["buckets"] = num_buckets;
    json runs = json::array();
    for (size_t b = 0; b < bucket_owners.size();) {
      size_t e = b;
      while (e < bucket_owners.size() && bucket_owners[e] == bucket_owners[b])
        ++e;
      runs.push_back(json::array({bucket_owners[b], e - b}));
      b = e;
    }
    j["bucket_owners"] = std::move(runs);
  }
  return j.dump();
}

namespace {

// "buckets" and "bucket_owners" (see the header). Sizes are checked before
// anything is allocated, so a hostile document costs at most kMaxBuckets.
Status ParseBuckets(const json& j, ElasticDoc* d) {
  const bool has_count = j.contains("buckets"),
             has_runs = j.contains("bucket_owners");
  if (!has_count && !has_runs) return Status::OK();
  if (has_count != has_runs)
    return Status::InvalidArgument(
        "elastic layout: buckets and bucket_owners go together");
  const json& count = j.at("buckets");
  if (!count.is_number_unsigned() || count.get<uint64_t>() < 1 ||
      count.get<uint64_t>() > kMaxBuckets)
    return Status::InvalidArgument("elastic layout: buckets must be in [1, " +
                                   std::to_string(kMaxBuckets) + "]");
  d->num_buckets = count.get<uint32_t>();
  const json& runs = j.at("bucket_owners");
  if (!runs.is_array() || runs.size() > d->num_buckets)
    return Status::InvalidArgument(
        "elastic layout: bucket_owners must list at most one run per bucket");
  d->bucket_owners.reserve(d->num_buckets);
  for (const json& run : runs) {
    if (!run.is_array() || run.size() != 2 || !run[0].is_number_integer() ||
        !run[1].is_number_unsigned())
      return Status::InvalidArgument(
          "elastic layout: a bucket run must be [owner, count]");
    const int64_t owner = run[0].get<int64_t>();
    const uint64_t n = run[1].get<uint64_t>();
    const uint64_t left = d->num_buckets - d->bucket_owners.size();
    if (owner < 0 || owner >= static_cast<int64_t>(d->servers.size()))
      return Status::InvalidArgument(
          "elastic layout: buckets from " +
          std::to_string(d->bucket_owners.size()) + " owned by shard " +
          std::to_string(owner) + " of " + std::to_string(d->servers.size()));
    if (n < 1 || n > left)
      return Status::InvalidArgument(
          "elastic layout: a bucket run of " + std::to_string(n) + " where " +
          std::to_string(left) +
          " buckets are left (runs must add up to buckets)");
    d->bucket_owners.insert(d->bucket_owners.end(), n, static_cast<int>(owner));
  }
  if (d->bucket_owners.size() != d->num_buckets)
    return Status::InvalidArgument("elastic layout: bucket runs cover " +
                                   std::to_string(d->bucket_owners.size()) +
                                   " of " + std::to_string(d->num_buckets) +
                                   " buckets");
  return Status::OK();
}

}  // namespace

StatusOr<ElasticDoc> ElasticDoc::FromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument("elastic layout: not a JSON object");
  ElasticDoc d;
  try {
    if (!j.at("epoch").is_number_unsigned())
      return Status::InvalidArgument(
          "elastic layout: epoch must be an unsigned integer");
    d.epoch = j.at("epoch").get<uint64_t>();
    const json& servers = j.at("servers");
    const json& owners = j.at("owners");
    if (!servers.is_array() || servers.empty() || servers.size() > 4096)
      return Status::InvalidArgument(
          "elastic layout: servers must list 1-4096 endpoints");
    if (!owners.is_array() || owners.size() > kMaxElasticChunks)
      return Status::InvalidArgument(
          "elastic layout: owners must list at most 2^24 chunks");
    for (const json& s : servers) d.servers.push_back(s.get<std::string>());
    d.owners.reserve(owners.size());
    for (const json& o : owners) {
      const int64_t v = o.get<int64_t>();
      if (v < 0 || v >= static_cast<int64_t>(d.servers.size())) {
        return Status::InvalidArgument(
            "elastic layout: chunk " + std::to_string(d.owners.size()) +
            " owned by shard " + std::to_string(v) + " of " +
            std::to_string(d.servers.size()));
      }
      d.owners.push_back(static_cast<int>(v));
    }
    RETURN_IF_ERROR(ParseBuckets(j, &d));
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("elastic layout: ") + e.what());
  }
  return d;
}

std::vector<int> ElasticDoc::Active() const {
  std::vector<bool> has(servers.size(), false);
  for (int o : owners) has[o] = true;
  for (int o : bucket_owners) has[o] = true;
  std::vector<int> a;
  for (size_t i = 0; i < has.size(); ++i)
    if (has[i]) a.push_back(static_cast<int>(i));
  return a;
}

}  // namespace asyncps
