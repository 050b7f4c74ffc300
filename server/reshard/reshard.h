// Reshard: restores the checkpoints of S shards onto S' shards, offline
// (ps_reshard, server/reshard/reshard_main.cc).
//
// Input: the stores of shards 0..S-1 of one model, in shard order, each
// holding a consistent cut (a RocksDB store rolls back to its preserved cut
// when opened). Output: S' empty stores, each left holding exactly what
// shard j of S' would have checkpointed, so Shard::Create recovers it:
//   - the layout record, for S' shards (the tensors, chunk_elems and
//     min_chunk_elems unchanged);
//   - every chunk the layout for S' gives shard j: its record (weights,
//     optimizer state, version, step, BSP accumulator) copied byte for byte
//     from the source shard that held it. Layout cuts tensors into pieces
//     of about total / (8 S) floats within [min_chunk_elems, chunk_elems],
//     so the chunks of a model above 8 S min_chunk_elems floats change with
//     the shard count: then every new chunk is re-cut from the old chunks it
//     overlaps, element by element (server/internal/chunk_recut.h: weights
//     and optimizer state still bitwise; a chunk's version and Adam step
//     are the largest of its pieces'; a checkpoint taken in the middle of a
//     BSP round whose pieces summed different pushes is refused);
//   - the sparse tables' definitions, and every stored row and admission
//     counter, re-routed by ShardOfKey(spec, key, S'), byte for byte; a
//     record already expired at its source (by that source's expiry clock)
//     reads as absent there and is dropped;
//   - a merged state record (see "Merge rules" below).
//
// Merge rules (state of S sources into each of S' destinations):
//   clocks       per worker, the minimum over the sources: every source had
//                at least that clock (its pushes of earlier steps applied),
//                so a pull or a BSP round never waits for less than it did;
//                the sparse expiry clock likewise (the minimum keeps every
//                row that was live at its source live);
//   version      shard_version: the maximum (the learning-rate schedule and
//                staleness continue from the most advanced shard); a
//                worker's last read version: the maximum, at most that;
//   BSP          round and per-worker pushed round: the minimum; chunk
//                accumulators travel with their chunks; a sparse table's
//                round sums travel with their keys, its round push count is
//                the maximum over the sources;
//   push table   per (rank, incarnation): the floor is the minimum of the
//                sources' floors and the applied ids the union of theirs at
//                or above it. Push ids are numbered per client over all
//                shards, so an id applied by any source was that push's
//                part for the source; a resend of it after the restore is a
//                duplicate on every destination (acknowledged, not applied
//                again). An id below some source's floor but above the
//                minimum was declared done by the client to that source and
//                is never resent. The minimum floor keeps pushes still owed
//                to another source new. At most PushDedup's cap of ids and
//                incarnations per rank are kept (the oldest go first, as
//                the shard itself does);
//   counters     (pushes, pulls, bytes, rejections, the staleness
//                histogram, the sparse tables' counters): destination j
//                receives the sum of sources i with i mod S' == j, so the
//                fleet's totals are unchanged (S' > S: the extra shards
//                start at 0); the histogram's max is the maximum.
//
// Refusals (nothing written to any destination): S' < 1; no source; a
// source with no model or whose layout, table definitions, worker count,
// shard id or shard count disagree with the others (source i must be shard
// i of S); a destination that holds any record; re-cut chunks that cannot
// be merged (above). A damaged record is Corruption naming the store and
// the key. The sources are read completely (validated) before anything is
// written, and each destination's default-space records go in one final
// cut, after its rows (written as partial writes: a destination
// interrupted mid-way rolls back to empty when opened).
//
// Thread safety: none; the stores are used by the calling thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "server/store/store.h"

namespace asyncps::server {

struct ReshardOptions {
  // Size of the batches sparse rows are written in, bytes. Default: 16 MiB.
  size_t batch_bytes = size_t{16} << 20;
  // Validate the sources and destinations and compute the new layout, but
  // write nothing. Default: false.
  bool dry_run = false;
};

// What Reshard did.
struct ReshardReport {
  int from_shards = 0;
  int to_shards = 0;
  uint64_t chunks = 0;           // chunks of the model
  uint64_t chunk_records = 0;    // chunk records copied
  uint64_t rows = 0;             // sparse rows and admission counters copied
  uint64_t expired_rows = 0;     // dropped: expired at their source
  uint64_t unknown_keys = 0;     // default-space keys not understood, skipped
  bool recut = false;            // the chunking differs: chunks re-cut
  uint64_t recut_chunks = 0;     // chunk records built from pieces
  uint64_t step_mismatches = 0;  // of which had pieces of different steps
  std::vector<uint64_t> chunks_per_shard;  // per destination
  std::vector<uint64_t> rows_per_shard;    // per destination
  std::vector<uint64_t> bytes_per_shard;   // fp32 weight bytes per destination
};

// Restores the checkpoints in `from` (shards 0..S-1 of one model, in shard
// order) onto `to` (S' empty stores), as the header comment says. The
// stores are borrowed; `report` may be null.
[[nodiscard]] Status Reshard(const std::vector<Store*>& from,
                             const std::vector<Store*>& to,
                             const ReshardOptions& options,
                             ReshardReport* report);

}  // namespace asyncps::server
