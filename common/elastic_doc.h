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
//    "owners": [0, 1, 2, 0, ...],
//    "buckets": 128, "bucket_owners": [[0, 64], [2, 20], [1, 44]]}
//
// A model with sparse tables also has key ranges (common/sparse_table.h,
// KeyRanges): "buckets" B cuts every table's key hash space, and
// "bucket_owners" names the owner of each bucket in order as runs of
// [owner, count] (the counts sum to B; a change moves buckets one by one,
// yet runs stay few because Rebalance moves few). A dense-only model has
// neither field.
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
  // Key ranges of sparse tables: 0 buckets (and no owners) for none.
  uint32_t num_buckets = 0;
  std::vector<int> bucket_owners;  // index = bucket, expanded from the runs

  std::string ToJson() const;
  // InvalidArgument for a document that is not one (bad JSON, an owner out
  // of range, more than kMaxElasticChunks chunks or 4096 servers; buckets
  // not in [1, kMaxBuckets], runs that are not [owner, count >= 1] pairs or
  // do not add up to the bucket count, one of the two bucket fields alone).
  static StatusOr<ElasticDoc> FromJson(const std::string& json);
  // Shards that own at least one chunk or bucket, in index order.
  std::vector<int> Active() const;
};

inline constexpr size_t kMaxElasticChunks = size_t{1} << 24;

}  // namespace asyncps
