// Persistence of a shard's state: a small key/value interface (the test
// seam) with a RocksDB implementation (one DB per shard) and an in-memory
// one for tests.
//
// The shard decides what the keys and values are
// (server/shard/shard_persist.cc, server/sparse/row_format.h); a Store only
// guarantees that one Write() is atomic: after a crash either every entry of a
// Write is visible or none is.
//
// A value is written as `head` followed by `parts` (pointers into the
// caller's memory, e.g. chunk weights), so a checkpoint copies the tensor
// bytes once, into the store's own batch.
//
// Key spaces. Besides the default space (Write/Scan: layout, state, dense
// chunks), a store holds named spaces (RocksDB: one column family each,
// tuned for point lookups of fixed-size records: bloom filters, no
// compression) for records that are read by key and never scanned at
// start-up, such as the rows of a sparse table. Space records are written
// through a StoreBatch (the same atomic Write as the default space's
// entries) and read with MultiGet.
//
// Consistent cuts. A shard's checkpoint, and each durable push, leaves the
// store holding exactly the shard's state at one instant: Write(...,
// WriteKind::kCut). Between checkpoints a shard may also write records that
// are newer than the last cut (dirty sparse rows evicted from its cache):
// WriteKind::kPartial. Before the first partial write after a cut the store
// preserves the cut (RocksDB: a checkpoint of hard links in `<path>.cut`)
// and marks itself, in the same batch as that write; opening a marked store
// rolls it back to the preserved cut, so recovery always starts from a
// consistent cut. The next kCut write clears the mark and drops the copy.
//
// Thread safety: a Store is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace asyncps::server {

struct StorePart {
  const void* data = nullptr;
  size_t size = 0;
};

// One key and its value = head + parts[0] + parts[1] + ...
struct StoreEntry {
  std::string key;
  std::string head;
  std::vector<StorePart> parts;
};

// Bytes of keys and values of `entries` (what a Write hands the store).
inline uint64_t StoreEntriesBytes(const std::vector<StoreEntry>& entries) {
  uint64_t bytes = 0;
  for (const StoreEntry& e : entries) {
    bytes += e.key.size() + e.head.size();
    for (const StorePart& p : e.parts) bytes += p.size;
  }
  return bytes;
}

enum class SyncMode : uint8_t {
  kNoSync = 0,  // through the write-ahead log, no fsync: survives kill -9
  kSync = 1,    // fsync before returning: survives power loss
};

// Identifies a named key space of a Store; 0 is the default space.
using SpaceId = uint32_t;
inline constexpr SpaceId kDefaultSpace = 0;

enum class WriteKind : uint8_t {
  kCut = 0,      // the store then holds one consistent state of the shard
  kPartial = 1,  // newer records than the last cut (see the header comment)
};

// A batch of writes to key spaces, applied atomically by Store::Write.
// Created by Store::NewBatch(); reusable after Clear().
class StoreBatch {
 public:
  virtual ~StoreBatch() = default;
  // Puts key -> head + body into `space` (replacing an existing record).
  virtual void Put(SpaceId space, std::string_view key, std::string_view head,
                   std::string_view body) = 0;
  virtual void Delete(SpaceId space, std::string_view key) = 0;
  // Deletes every record of `space` whose key k has begin <= k < end
  // (bytewise), whatever the range holds: O(1) in the batch (RocksDB: a
  // range tombstone). Clearing a sparse table.
  virtual void DeleteRange(SpaceId space, std::string_view begin,
                           std::string_view end) = 0;
  // Records in the batch, and its approximate size in bytes.
  virtual size_t count() const = 0;
  virtual size_t bytes() const = 0;
  virtual void Clear() = 0;
};

// What a store knows about one key space.
struct SpaceStats {
  uint64_t disk_bytes = 0;      // bytes of its table files on disk
  uint64_t memtable_bytes = 0;  // bytes in memory not yet in table files
  uint64_t estimated_keys = 0;  // records (estimate)
};

// What a store knows about itself as a whole (all spaces), for metrics.
// Counters are cumulative since the store was opened; a store that does not
// know a figure leaves it 0.
struct StoreStats {
  uint64_t bytes_written = 0;           // user bytes written (keys + values)
  uint64_t keys_written = 0;            // records written
  uint64_t wal_bytes = 0;               // bytes written to the write-ahead log
  uint64_t flush_bytes = 0;             // bytes written by memtable flushes
  uint64_t compaction_read_bytes = 0;   // bytes read by compactions
  uint64_t compaction_write_bytes = 0;  // bytes written by compactions
  uint64_t stall_micros = 0;            // time writers were stalled
  uint64_t block_cache_hits = 0;
  uint64_t block_cache_misses = 0;
  // Gauges.
  uint64_t disk_bytes = 0;         // live table files, all spaces
  uint64_t memtable_bytes = 0;     // memtables, all spaces
  uint64_t block_cache_bytes = 0;  // block cache in use
  uint64_t running_compactions = 0;
  uint64_t pending_compaction_bytes = 0;  // estimate
};

// A point-in-time view of a store (Store::NewSnapshot): reads through it
// see every space as it was when it was taken, whatever is written later.
// It must be destroyed before its store. Same threading as the store.
class StoreSnapshot {
 public:
  virtual ~StoreSnapshot() = default;
  // As Store::ScanSpaceFrom, over the space as it was at the snapshot.
  [[nodiscard]] virtual Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view key, std::string_view value)>&
          fn) const = 0;
};

class Store {
 public:
  virtual ~Store() = default;

  // Writes all entries in one atomic batch (replacing existing keys).
  // Equivalent to Write(entries, nullptr, sync, WriteKind::kCut).
  [[nodiscard]] Status Write(const std::vector<StoreEntry>& entries,
                             SyncMode sync) {
    return Write(entries, nullptr, sync, WriteKind::kCut);
  }

  // Writes `entries` (default space) and `batch` (may be null) in one
  // atomic batch. See the header comment for `kind`.
  [[nodiscard]] virtual Status Write(const std::vector<StoreEntry>& entries,
                                     StoreBatch* batch, SyncMode sync,
                                     WriteKind kind) = 0;

  // Calls fn(key, value) for every key of the default space in key order;
  // stops at the first non-OK status fn returns and returns it.
  [[nodiscard]] virtual Status Scan(
      const std::function<Status(std::string_view key, std::string_view value)>&
          fn) = 0;

  // Opens the key space `name` (1-200 bytes), creating it if missing.
  // The same name gives the same id for the life of the Store.
  [[nodiscard]] virtual StatusOr<SpaceId> OpenSpace(
      const std::string& name) = 0;

  // A new, empty batch for Write().
  virtual std::unique_ptr<StoreBatch> NewBatch() = 0;

  // Looks up keys[0..n) in `space`; calls found(i, value) for every key
  // present (value valid during the call only), in no particular order.
  [[nodiscard]] virtual Status MultiGet(
      SpaceId space, const std::string_view* keys, size_t n,
      const std::function<void(size_t i, std::string_view value)>& found) = 0;

  // Calls fn(key, value) for every record of `space` in key order (offline
  // tools: resharding); stops at the first non-OK status fn returns and
  // returns it. fn must not write to the store. Default: Unimplemented.
  [[nodiscard]] virtual Status ScanSpace(
      SpaceId space,
      const std::function<Status(std::string_view key, std::string_view value)>&
          fn) {
    (void)fn;
    return Status::Unimplemented("this store cannot scan key space " +
                                 std::to_string(space));
  }

  // Calls fn(key, value) for the records of `space` whose key is >= `start`,
  // in key order, until fn returns false or the space ends (a paged scan:
  // saving sparse tables). fn must not write to the store. Default: through
  // ScanSpace(), skipping the keys before `start`.
  [[nodiscard]] virtual Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view key, std::string_view value)>&
          fn) {
    bool more = true;
    return ScanSpace(space, [&](std::string_view k, std::string_view v) {
      if (more && k >= start) more = fn(k, v);
      return Status::OK();
    });
  }

  // A point-in-time view of the store as it is now (RocksDB: a snapshot,
  // which costs nothing until later writes overwrite what it sees; the
  // versions it holds are kept until it is destroyed). Default:
  // Unimplemented.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<StoreSnapshot>> NewSnapshot() {
    return Status::Unimplemented("this store cannot take snapshots");
  }

  // Size of a space (estimates, for stats).
  virtual SpaceStats GetSpaceStats(SpaceId space) = 0;

  // Figures of the whole store (RocksDB: its statistics tickers and
  // properties). Cheap enough to call a few times per second. Default: all 0.
  // Copies the store's current contents, a consistent state, into the new
  // directory `dir` (RocksDB: a checkpoint, hard links where it can): what
  // another process opens as its own store (re-replication). The caller
  // writes a cut first. Default: Unimplemented.
  [[nodiscard]] virtual Status ExportCheckpoint(const std::string& dir) {
    return Status::Unimplemented("this store cannot export a checkpoint (" +
                                 dir + ")");
  }
  virtual StoreStats GetStoreStats() { return {}; }

  // Expiry: from now on, compaction may delete records of `space` whose
  // little-endian int64 at byte `clock_offset` is < keep_from (their reader
  // already treats them as absent). No-op by default. Default: nothing
  // expires.
  virtual void SetSpaceExpiry(SpaceId space, size_t clock_offset,
                              int64_t keep_from) {}
  // Compacts a space now (RocksDB: CompactRange over the whole space), so
  // expired records go and stats are exact. No-op by default.
  [[nodiscard]] virtual Status CompactSpace(SpaceId space) {
    return Status::OK();
  }
};

struct RocksDbStoreOptions {
  // Directory of the database; created if missing. The store may also
  // create `<path>.cut` and `<path>.cut.tmp` beside it (preserved cuts).
  // Required.
  std::string path;
  // RocksDB write buffer size of each space, bytes. Default: 64 MiB.
  size_t write_buffer_bytes = size_t{64} << 20;
  // RocksDB block cache of the key spaces (data, index and filter blocks:
  // the bloom filters of a large table live here, bounded), bytes.
  // Default: 64 MiB.
  size_t block_cache_bytes = size_t{64} << 20;
  // Bloom filter bits per key of the key spaces (about 1% false positives
  // at 10). Default: 10.
  int bloom_bits_per_key = 10;
};

// Opens (or creates) a RocksDB database at options.path, with every key
// space it holds, rolling it back to its preserved cut if it is marked (see
// the header comment). RocksDB errors are converted to Status here (IOError
// -> Unavailable, Corruption -> Corruption, others -> Internal).
StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(
    const RocksDbStoreOptions& options);

// A Store in memory. Tests keep the object to "restart" a shard on the same
// contents; Reopen() does what opening a RocksDB store after a crash does
// (roll back to the preserved cut when marked). Writes after
// FailWrites(true) fail with Unavailable, and so does every MultiGet after
// the first `n` of FailReadsAfter(n), once it has delivered half its
// records (fault injection).
class MemStore final : public Store {
 public:
  using Store::Write;
  Status Write(const std::vector<StoreEntry>& entries, StoreBatch* batch,
               SyncMode sync, WriteKind kind) override;
  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override;
  StatusOr<SpaceId> OpenSpace(const std::string& name) override;
  std::unique_ptr<StoreBatch> NewBatch() override;
  Status MultiGet(
      SpaceId space, const std::string_view* keys, size_t n,
      const std::function<void(size_t, std::string_view)>& found) override;
  Status ScanSpace(SpaceId space,
                   const std::function<Status(std::string_view,
                                              std::string_view)>& fn) override;
  Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view, std::string_view)>& fn)
      override;
  // A copy of the store's contents (a test store: small).
  StatusOr<std::unique_ptr<StoreSnapshot>> NewSnapshot() override;
  SpaceStats GetSpaceStats(SpaceId space) override;

  // Rolls back to the preserved cut if a partial write happened since the
  // last cut (what a restart after kill -9 sees).
  void Reopen();
  void FailWrites(bool fail) { fail_writes_ = fail; }
  // n < 0: reads never fail (the default).
  void FailReadsAfter(int64_t n) { reads_left_ = n; }
  size_t writes() const { return writes_; }

 private:
  using Map = std::map<std::pair<std::string, std::string>, std::string>;
  Map kv_;  // (space name, key) -> value; "" is the default space
  std::optional<Map> preserved_;  // the last cut, while marked
  std::vector<std::string> spaces_{""};
  bool fail_writes_ = false;
  int64_t reads_left_ = -1;
  size_t writes_ = 0;
};

}  // namespace asyncps::server
