// JSON renderings of the shard statistics (nlohmann-json), shared by
// stats.cc and shard_stats.cc. Not part of the server API: public headers
// expose no third-party types.
#pragma once

#include <nlohmann/json.hpp>

#include "server/shard/stats.h"

namespace asyncps::server::internal {

// Keys keep insertion order, so documents read like the code that built them
// and stay byte-compatible with earlier hand-written ones.
using Json = nlohmann::ordered_json;

// {"count":..,"p50":..,"p99":..,"max":..,"buckets":[[low,count],...]}
Json StalenessJson(const StalenessHistogram& h);

}  // namespace asyncps::server::internal
