// Chunk records (server/shard/shard_persist.cc, "2chunk/<id>") parsed and
// re-cut: the offline resharding tool (server/reshard/reshard.h) rebuilds the
// chunks of a layout for S' shards from those of the layout for S when the two
// cut the tensors differently. Not part of the server API.
//
// Everything a chunk stores per element (the weight, each component of the
// optimizer state, stored component by component: [m(0..n), v(0..n)], the
// delay compensation's mean square, the BSP accumulator) is copied element
// for element, bitwise. What a chunk stores once (version, optimizer step,
// BSP contributors) cannot be split: a new chunk takes the largest version
// and the largest step of the pieces it is made of (steps differ only when
// some pieces were pushed less often: Adam's bias correction of the lagging
// elements then uses the larger step; counted in RecutStats), and pieces in
// the middle of a BSP round with different contributor counts are refused.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/layout.h"
#include "common/status.h"

namespace asyncps::server::internal {

// A chunk record's header; the floats follow it in the value.
struct ChunkRecord {
  uint64_t n = 0;
  uint32_t state_per_elem = 0;
  uint64_t version = 0;
  uint64_t step = 0;
  uint32_t contributors = 0;
  bool has_acc = false;
  // w[n], state[n * state_per_elem], acc[n] (when has_acc), unaligned.
  const char* floats = nullptr;
};

// Parses a chunk record of a chunk of `num_elems` elements. Corruption
// saying what is wrong (the caller names the key).
Status ParseChunkRecord(std::string_view value, uint64_t num_elems,
                        ChunkRecord* out);

struct RecutStats {
  uint64_t recut_chunks = 0;     // new chunks built from pieces
  uint64_t step_mismatches = 0;  // of which had pieces of different steps
};

// Builds the record of chunk `c` of a layout that cuts the same tensors as
// `from` differently. `record(id)` gives the stored record of chunk `id` of
// `from`, or nullptr when none was written (the chunk holds its initial
// value and zero state). *has_record is false when no piece has a record
// (the new chunk then starts from its initial value too, as recovery does).
// FailedPrecondition when the pieces disagree on their state's size or on
// the BSP round in progress.
Status RecutChunk(const Layout& from, const ChunkSpec& c,
                  const std::function<const std::string*(uint32_t)>& record,
                  std::string* out, bool* has_record, RecutStats* stats);

}  // namespace asyncps::server::internal
