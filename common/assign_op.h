// AssignOp: the operations of a kAssign request, shared by the client
// (worker/upload.h) and the shard (its kAssign handler) without the
// rest of the wire model (common/wire.h).
#pragma once

#include <cstdint>

namespace asyncps {

// kAssign operations (common/protocol.capnp Assign.phase): uploads of values
// and optimizer state, reads and scans.
// Travels on the wire: never renumber. A decoded request may carry a value
// past kClear (the shard refuses it).
enum class AssignOp : uint8_t {
  kBegin = 0,   // take the upload claim
  kValues = 1,  // whole chunks and rows of sparse tables
  kCommit = 2,  // make the upload final
  kRead = 3,    // the optimizer state of every chunk, or named rows' records
  kState = 4,   // the optimizer state and steps of whole chunks
  kRows = 5,    // rows with their saved optimizer state
  kScan = 6,    // a page of a scan of one table's entries
  kSaved = 7,   // saved entries (rows and admission counters) set back
  kClear = 8,   // every entry of the named tables dropped
};
inline constexpr AssignOp kLastAssignOp = AssignOp::kClear;

}  // namespace asyncps
