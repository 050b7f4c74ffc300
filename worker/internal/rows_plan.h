// RowsPlan: how the client sends the rows of sparse tables: each shard gets
// only the unique keys it owns (one message part per table), and the plan
// keeps the inverse mapping from every position of the caller's key list to
// (shard, index in that shard's part), so pulled rows are scattered back to
// every position, and pushed gradients of repeated keys are summed (in
// position order) before they leave. Private to worker/.
//
// Thread safety: none; a plan belongs to one request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/buffer.h"
#include "common/sparse_table.h"
#include "common/status.h"

namespace asyncps::worker::internal {

// One table's keys (and, for pushes, gradients) of a request.
struct RowsInput {
  uint32_t table = 0;
  const uint64_t* keys = nullptr;
  size_t n = 0;
  const float* grads = nullptr;  // pushes: n x dim
  float* out = nullptr;          // pulls: n x dim
};

class RowsPlan {
 public:
  // What one shard receives for one table.
  struct Part {
    uint32_t table = 0;
    size_t input = 0;  // index into the inputs
    BufferPtr keys;    // unique keys, uint64 each
    BufferPtr grads;   // pushes: merged gradients, fp32 rows
    size_t n = 0;      // keys in this part
  };

  // Builds the plan for `inputs` over `num_shards` shards, each key routed
  // by `ranges` (an elastic fleet's adopted key ranges; every owner below
  // num_shards) or, when null, by ShardOfKeyHashed. InvalidArgument for an
  // unknown table, a table named twice, null buffers, or a count above
  // kMaxKeys.
  static constexpr size_t kMaxKeys = size_t{1} << 30;
  Status Build(const std::vector<TableSpec>& tables, int num_shards,
               const std::vector<RowsInput>& inputs, bool push,
               const KeyRanges* ranges = nullptr);

  // Parts per shard.
  const std::vector<Part>& parts(int shard) const { return parts_[shard]; }
  bool empty() const { return inputs_.empty(); }

  // Pulls: writes rows (part.n x dim fp32) of shard `shard`'s part `p` to
  // every position of its input that maps there.
  void Scatter(int shard, size_t p, const float* rows);
  // Pulls re-routed to another shard (elastic shards): rows (subset.size()
  // x dim) are those of entries subset[j] of shard `shard`'s part `p`
  // (each index below the part's n).
  void ScatterSubset(int shard, size_t p, const std::vector<uint32_t>& subset,
                     const float* rows);

 private:
  struct Inverse {
    std::vector<uint32_t> shard;  // per position
    std::vector<uint32_t> index;  // per position: index in the shard's part
    std::vector<int32_t> part_of_shard;  // per shard: part index, -1 none
  };
  std::vector<TableSpec> tables_;
  std::vector<RowsInput> inputs_;
  std::vector<Inverse> inverse_;          // per input
  std::vector<std::vector<Part>> parts_;  // per shard
};

}  // namespace asyncps::worker::internal
