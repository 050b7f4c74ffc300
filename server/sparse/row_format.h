// The stored form of sparse rows: one record per key in the table's key
// space (server/store/store.h), little-endian.
//
//   key     u64 big-endian row key (records sort by key)
//   value   u32 magic   'ROW1' a row, 'ADM1' an admission counter
//           u32 dim     the table's row dimension
//           u64 count   row: optimizer steps applied (Adam's bias
//                       correction); counter: pushes counted so far
//           i64 clock   clock of the last push (expiry; byte offset 16)
//           row only:   f32 weights[dim], f32 state[dim * state_per_elem]
//
// A record of another size, magic or dimension is Corruption.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/status.h"

namespace asyncps::server::sparse {

inline constexpr uint32_t kRowMagic = 0x31574f52;      // "ROW1"
inline constexpr uint32_t kCounterMagic = 0x314d4441;  // "ADM1"
inline constexpr size_t kRecordHeaderBytes = 24;
// Byte offset of the little-endian i64 clock in a record (expiry filter).
inline constexpr size_t kRecordClockOffset = 16;

struct EncodedKey {
  char bytes[8];
  std::string_view view() const { return std::string_view(bytes, 8); }
};

inline EncodedKey EncodeKey(uint64_t key) {
  EncodedKey k;
  for (int i = 0; i < 8; ++i)
    k.bytes[i] = static_cast<char>((key >> (56 - 8 * i)) & 0xff);
  return k;
}

struct RecordHeader {
  uint32_t magic = kRowMagic;
  uint32_t dim = 0;
  uint64_t count = 0;
  int64_t clock = 0;
};
static_assert(sizeof(RecordHeader) == kRecordHeaderBytes);

inline std::string_view HeaderBytes(const RecordHeader& h) {
  return std::string_view(reinterpret_cast<const char*>(&h), sizeof(h));
}

// A decoded record; `floats` points into the value (may be unaligned: copy
// with memcpy).
struct RecordView {
  RecordHeader header;
  const char* floats = nullptr;  // row: (1 + state_per_elem) * dim floats
  bool is_row() const { return header.magic == kRowMagic; }
};

// Parses a record of a table with row dimension `dim` whose rows hold
// `floats_per_row` floats.
inline Status ParseRecord(std::string_view value, uint32_t dim,
                          size_t floats_per_row, RecordView* out) {
  if (value.size() < kRecordHeaderBytes)
    return Status::Corruption("sparse record shorter than its header");
  std::memcpy(&out->header, value.data(), kRecordHeaderBytes);
  const RecordHeader& h = out->header;
  if (h.dim != dim)
    return Status::Corruption("sparse record of dim " + std::to_string(h.dim) +
                              " in a table of dim " + std::to_string(dim));
  if (h.magic == kRowMagic) {
    if (value.size() != kRecordHeaderBytes + floats_per_row * sizeof(float))
      return Status::Corruption("sparse row record of " +
                                std::to_string(value.size()) + " bytes");
    out->floats = value.data() + kRecordHeaderBytes;
    return Status::OK();
  }
  if (h.magic == kCounterMagic && value.size() == kRecordHeaderBytes) {
    out->floats = nullptr;
    return Status::OK();
  }
  return Status::Corruption("sparse record with a bad magic or size");
}

// A record on the move between shards (elastic shards: server/sparse/
// sparse_move.cc): the store's record as above, byte for byte (as
// server/reshard/ copies them), framed in a run of records:
//   u8 key[8]   the store key (EncodeKey: big-endian)
//   u32 size    of the value
//   value       the store record
inline constexpr size_t kMoveRecordHeadBytes = 12;

inline void AppendMoveRecord(std::string* out, std::string_view key8,
                             std::string_view head, std::string_view body) {
  const uint32_t size = static_cast<uint32_t>(head.size() + body.size());
  out->append(key8.data(), key8.size());
  out->append(reinterpret_cast<const char*>(&size), sizeof(size));
  out->append(head.data(), head.size());
  out->append(body.data(), body.size());
}

}  // namespace asyncps::server::sparse
