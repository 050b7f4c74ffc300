// PushDedup: applies each push of a client exactly once, whatever order its
// copies arrive in.
//
// A client process is (rank, incarnation); it numbers its requests. A push
// may reach the shard several times (resent after a lost reply, a timeout or
// a reconnect) and pushes of one client may overtake each other (after a
// reconnect the socket's queued messages go out before the resends). For
// each client the table keeps a floor F and the set A of applied push ids at
// or above F:
//   id <  F   the client has finished with it (answered or given up): a
//             late copy, never applied (again);
//   id in A   applied already: a duplicate, acknowledged again;
//   else      new: the caller applies it and calls Record().
// The client raises F with every push (RequestHeader::done_below: each of
// its pushes to this shard with a lower id has been answered or abandoned
// and will not be sent again), and ids below F leave A. A holds at most
// `max_applied` ids: a client that never raises F (done_below 0, an older
// client) moves its oldest id into F, as the earlier high-water mark did.
// Each rank keeps the tables of its last `incarnations_per_rank` client
// processes (least recently used out), so a restarted worker and a late copy
// from its predecessor do not wipe each other's table.
//
// The table is persisted in the shard's state record (Encode/Decode) in the
// same atomic write as the weights it describes.
//
// Thread safety: none (the shard's event loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/internal/binary_io.h"

namespace asyncps::server::internal {

class PushDedup {
 public:
  struct Options {
    int num_workers = 1;
    // Most applied ids kept above the floor per client. Default: 512.
    size_t max_applied = 512;
    // Client processes remembered per rank. Default: 4.
    size_t incarnations_per_rank = 4;
  };
  enum class Verdict { kNew, kDuplicate, kLate };

  explicit PushDedup(const Options& options);

  // Raises the floor of (rank, incarnation) to `done_below` (no-op when
  // lower or 0).
  void RaiseFloor(int rank, uint64_t incarnation, uint64_t done_below);
  Verdict Check(int rank, uint64_t incarnation, uint64_t id) const;
  // Marks push `id` of (rank, incarnation) applied.
  void Record(int rank, uint64_t incarnation, uint64_t id);

  // Appends the table: u32 entries, then per entry i32 rank, u64
  // incarnation, u64 floor, u32 n, u64 ids[n] (per rank oldest first).
  void Encode(std::string* out) const;
  // Reads what Encode wrote; false if damaged. Ranks >= num_workers are
  // dropped.
  bool Decode(Reader* r);
  // Restores a version-1 state record's entry: everything up to and
  // including `last_id` is done.
  void RestoreHighWaterMark(int rank, uint64_t incarnation, uint64_t last_id);

  // Calls fn(rank, incarnation, floor, applied ids) for every client, per
  // rank least recently used first (stats).
  void ForEach(
      const std::function<void(int, uint64_t, uint64_t,
                               const std::vector<uint64_t>&)>& fn) const;

  // Upper bound of the table's memory, bytes (for the shard's budget).
  size_t MaxBytes() const;
  // Applied ids held above the floors, all clients.
  size_t applied_ids() const;

 private:
  struct Entry {
    uint64_t incarnation = 0;
    uint64_t floor = 0;
    std::vector<uint64_t> applied;  // sorted, all >= floor
  };
  // The entry of (rank, incarnation), made most recent; created if missing.
  Entry& Touch(int rank, uint64_t incarnation);
  const Entry* Find(int rank, uint64_t incarnation) const;

  Options options_;
  std::vector<std::vector<Entry>> ranks_;  // per rank, most recent last
};

}  // namespace asyncps::server::internal
