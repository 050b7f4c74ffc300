// Keys and magic numbers of a shard's default-space store records, shared by
// the shard (server/shard_persist.cc, which documents the formats) and the
// offline resharding tool (server/reshard.cc). Not part of the server API.
#pragma once

#include <cstdint>
#include <string_view>

namespace asyncps::server::internal {

inline constexpr uint32_t kLayoutMagic = 0x3159414c;   // "LAY1"
inline constexpr uint32_t kStateMagicV1 = 0x31415453;  // "STA1"
inline constexpr uint32_t kStateMagic = 0x32415453;    // "STA2"
inline constexpr uint32_t kChunkMagic = 0x314b4843;    // "CHK1"
inline constexpr std::string_view kLayoutKey = "0layout";
inline constexpr std::string_view kStateKey = "1state";
inline constexpr std::string_view kChunkPrefix = "2chunk/";

}  // namespace asyncps::server::internal
