// The elastic layout of a fleet whose shards join and leave while it trains:
// which endpoint is shard i, and which shard owns each chunk, under an epoch.
//
// The document lives in etcd under <prefix>/elastic and is changed only by
// compare-and-swap (ps_ctl add-shard / remove-shard, server/elastic/), so
// each flip is decided once; shards hold the copy they adopted and hand it
// to a client whose request names an older epoch (common/wire.h:
// ReplyHeader::layout_doc), which routes by it from then on:
//
//   {"epoch": 3, "servers": ["tcp://127.0.0.1:5000", ...],
//    "owners": [0, 1, 2, 0, ...]}
//
// Shard indexes are stable: a shard that leaves keeps its index (it owns no
// chunk), a shard that joins is appended. Epoch 0 is the static fleet (the
// pure layout function of common/layout.h; no document).
//
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps {

struct ElasticDoc {
  uint64_t epoch = 0;
  std::vector<std::string> servers;  // index = shard index
  std::vector<int> owners;           // index = chunk id

  std::string ToJson() const;
  // InvalidArgument for a document that is not one (bad JSON, an owner out
  // of range, more than kMaxElasticChunks chunks or 4096 servers).
  static StatusOr<ElasticDoc> FromJson(const std::string& json);
  // Shards that own at least one chunk, in index order.
  std::vector<int> Active() const;
};

inline constexpr size_t kMaxElasticChunks = size_t{1} << 24;

}  // namespace asyncps
