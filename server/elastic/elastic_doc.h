// Elastic shards: the layout document (common/elastic_doc.h) and how chunks
// are spread again when shards join or leave.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/elastic_doc.h"
#include "common/status.h"

namespace asyncps::server::elastic {

using ElasticDoc = ::asyncps::ElasticDoc;

// New owners for chunks of `sizes` (elements, by chunk id) now owned as
// `owners`, spread over `active` shard indexes (the others give their chunks
// away): a chunk of a shard that leaves goes to the least loaded active
// shard (largest first); then, while it narrows the gap, the largest chunk
// of the most loaded shard that fits half the gap moves to the least loaded.
// Chunks that need not move stay where they are. REQUIRES: active non-empty,
// sizes.size() == owners.size().
std::vector<int> Rebalance(const std::vector<uint64_t>& sizes,
                           const std::vector<int>& owners,
                           const std::vector<int>& active);

// New owners of the key-range buckets of sparse tables (common/
// sparse_table.h, KeyRanges) now owned as `owners`, spread over `active`:
// every active shard ends with B / A buckets or one more (the extra ones to
// the shards that already hold the most, so fewer move); the buckets of
// shards that leave and the excess of shards over their share move, in
// bucket order, to the shards under theirs. Buckets are equal in rows (the
// hash is uniform), so equal counts are equal rows. REQUIRES: active
// non-empty.
std::vector<int> RebalanceBuckets(const std::vector<int>& owners,
                                  const std::vector<int>& active);

// Largest shard's bytes over the mean of the active shards'.
double Imbalance(const std::vector<uint64_t>& sizes,
                 const std::vector<int>& owners,
                 const std::vector<int>& active);

}  // namespace asyncps::server::elastic
