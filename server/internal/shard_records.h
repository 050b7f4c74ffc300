// Keys and magic numbers of a shard's default-space store records, shared by
// the shard (server/shard/shard_persist.cc, which documents the formats) and
// the offline resharding tool (server/reshard/reshard.cc). Not part of the
// server API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace asyncps::server::internal {

inline constexpr uint32_t kLayoutMagic = 0x3159414c;  // "LAY1"
inline constexpr uint32_t kLayoutMagicV2 =
    0x3259414c;  // "LAY2" (layout_record.h)
inline constexpr uint32_t kStateMagicV1 = 0x31415453;  // "STA1"
inline constexpr uint32_t kStateMagic = 0x32415453;    // "STA2"
inline constexpr uint32_t kChunkMagic = 0x314b4843;    // "CHK1"
inline constexpr std::string_view kLayoutKey = "0layout";
inline constexpr std::string_view kElasticKey = "0elastic";  // sorts first
inline constexpr std::string_view kStateKey = "1state";
inline constexpr std::string_view kChunkPrefix = "2chunk/";

// The key of chunk `id`: kChunkPrefix + u32 big-endian id (keys sort by id).
inline std::string ChunkKey(uint32_t id) {
  std::string k(kChunkPrefix);
  for (int shift = 24; shift >= 0; shift -= 8)
    k.push_back(static_cast<char>((id >> shift) & 0xff));
  return k;
}

}  // namespace asyncps::server::internal
