// The shard's layout record ("0layout", the model a shard holds), shared by
// the shard (recovery, elastic imports, which carry it) and the offline
// resharding tool. Format (little-endian, fixed width; binary_io.h):
//   u32 'LAY1', u32 num_shards (the cut's), u64 chunk_elems,
//   u64 min_chunk_elems, u32 num_tensors, then per tensor: u32 name_len,
//   name, u32 ndims (<= 8), i64 dims[ndims], u8 init, f32 init_param, u64 seed
//   'LAY2': the same with u8 placement (common/layout.h) after
//   min_chunk_elems; written only for a placement other than kBalanced, so
//   a balanced model's record reads as it always did.
// Not part of the server API.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/layout.h"
#include "common/status.h"

namespace asyncps::server::internal {

// The record of `layout`: its tensors and the options its chunks were cut by
// (options().num_shards, the first layout's shard count).
std::string EncodeLayoutRecord(const Layout& layout);

// Parses a record; Corruption ("layout record is damaged: <part>") for a
// wrong magic, a count out of range (more than 2^24 tensors, a shard count
// outside [1, 4096]), an unknown initialiser or placement, truncation or
// trailing bytes. Sizes are checked against the bytes left before anything
// is allocated. The specs themselves are checked by Layout::Create.
Status ParseLayoutRecord(std::string_view value,
                         std::vector<TensorSpec>* tensors,
                         LayoutOptions* options);

}  // namespace asyncps::server::internal
