// SparseTables: the sparse tables of one shard (server/sparse/
// sparse_table.h) and what they share: the cache budget, request checks, the
// BSP accumulators, checkpoints and durable writes of rows, the expiry clock,
// persistence of their definitions and counters, and their stats.
//
// Requests. A pull or push names, per table, a list of keys (and, for a
// push, one gradient row per key). Check() validates one table's part
// completely (known table, key count within the limit, no key twice, every
// key owned by this shard, every row finite) before the caller applies
// anything; Read() and Apply() then cannot fail on input (only on storage).
// They cut the keys into slices of SparseTable::kSliceKeys and, after each
// slice, evict from the cache until it is back within its budget: dirty
// entries evicted go to the store in one batch (WriteKind::kPartial) before
// the next lookup, so the store always has what the cache dropped.
//
// Cache budget: options.cache_bytes covers every table's cached rows,
// admission counters and cache indexes (RowCache::bytes()). Past it, entries
// are evicted (CLOCK order within a table) from the table holding the most
// bytes, down to 31/32 of the budget. Without a store nothing can be
// evicted: Check() refuses (ResourceExhausted) a push whose new rows would
// take the cache past its budget. It may be exceeded by one slice of
// rows, and by the rows of the push in progress (held from their read to
// their update, and in durable mode pinned until their write), at most
// max_keys_per_request rows, or of the BSP round being applied.
//
// A push is held (Hold(): every key it names read from the store into the
// cache, and kept there) for all its tables before any of them is applied:
// a failed store read leaves the push, and every other table of it, not
// applied at all.
//
// Checkpoints and durability (see server/store/store.h on cuts): a checkpoint
// puts every dirty entry into batches (full ones written as kPartial,
// the last one returned to the caller, who adds the dense state and writes
// it as the kCut), then CommitCheckpoint() marks the cache clean. A durable
// push pins the rows it touches; AddDurable() puts exactly those into the
// push's batch and CommitDurable() releases them.
//
// Consistency: BSP pushes are summed per key (Accumulate) and applied once
// per round (ApplyRound), averaged over the pushes of the round that carried
// the table; the accumulators are persisted with every cut.
//
// Ownership: borrows the Store. Thread safety: none (the shard's thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/flat_index.h"
#include "common/sparse_table.h"
#include "common/status.h"
#include "server/sparse/sparse_table.h"
#include "server/store/store.h"

namespace asyncps::server::sparse {

struct SparseOptions {
  // This shard and the number of shards (key ownership). Default: 0 of 1.
  int shard_id = 0;
  int num_shards = 1;
  // Memory for cached rows, admission counters and cache indexes of all
  // tables, bytes (ps_server --embedding_cache_bytes). Default: 256 MiB.
  uint64_t cache_bytes = uint64_t{256} << 20;
  // Most keys one request may name on this shard, over all its tables
  // (a larger request is InvalidArgument, nothing applied). Default: 256 Ki.
  size_t max_keys_per_request = size_t{1} << 18;
  // Most bytes of fp32 rows one pull may ask for on this shard, over all its
  // tables (the reply's size before any codec). Default: 256 MiB.
  uint64_t max_reply_bytes = uint64_t{256} << 20;
  // Size of the write batches a checkpoint flushes dirty rows in, bytes.
  // Default: 16 MiB.
  size_t checkpoint_batch_bytes = size_t{16} << 20;
};

// Why SparseTables::Check refused a request.
enum class CheckFailure : uint8_t {
  kNone = 0,
  kUnknownTable,
  kTooLarge,  // more keys, or a bigger reply, than the limits allow
  kDuplicateKey,
  kWrongShard,
  kNonFinite,
};

class SparseTables {
 public:
  // Opens a key space per table in `store` (null: no store; the cache is
  // then unbounded, for tests and benchmarks).
  static StatusOr<std::unique_ptr<SparseTables>> Create(
      const SparseOptions& options, const std::vector<TableSpec>& specs,
      Store* store);
  ~SparseTables();

  const std::vector<TableSpec>& specs() const { return specs_; }
  size_t num_tables() const { return tables_.size(); }
  SparseTable& table(size_t i) { return *tables_[i]; }
  const SparseTable& table(size_t i) const { return *tables_[i]; }
  const SparseOptions& options() const { return options_; }

  // --- Requests ---
  // Starts a request: resets duplicate detection and the key count.
  void BeginRequest();
  // Checks one table's part of the request started last (see the header
  // comment); `rows` is null for pulls, whose reply size is also checked.
  // InvalidArgument / NotFound / ResourceExhausted naming the table and the
  // first bad key or row.
  [[nodiscard]] Status Check(uint32_t table, const uint64_t* keys, size_t n,
                             const float* rows, CheckFailure* why = nullptr);
  // Current values of keys (checked) into out (n x dim).
  [[nodiscard]] Status Read(uint32_t table, const uint64_t* keys, size_t n,
                            float* out);
  // Reads every key (checked) of one table's part of a push into the cache
  // and holds the entries there (not evictable) until ReleaseHeld(), so
  // that Apply() of that table reads nothing from the store. Fails only on
  // a failed store read; the caller then releases and applies nothing.
  // Call it for every table of a push before applying any. Each key's
  // cache entry is kept, so an Apply() of the same keys array (the same
  // pointer and count, as the shard passes) looks nothing up again.
  [[nodiscard]] Status Hold(uint32_t table, const uint64_t* keys, size_t n);
  // BSP: Hold() for every table's round sums.
  [[nodiscard]] Status HoldRound();
  // Ends the holds of the request (after its Apply()s, or after a failed
  // Hold()).
  void ReleaseHeld();
  // Applies gradients (checked) pushed at worker clock `clock` (ASP, SSP);
  // durable: pins the touched entries for AddDurable(). A failed write-back
  // of evicted rows does not stop it (the victims stay cached, dirty): every
  // key is applied, then that error is returned. On a held table (Hold())
  // nothing else can fail; otherwise a failed store read stops it at the
  // slice that needed it (tests and benchmarks only).
  [[nodiscard]] Status Apply(uint32_t table, const uint64_t* keys,
                             const float* grads, size_t n, int64_t clock,
                             float lr_scale, bool durable);
  // Sets rows (checked) to `values` with zero optimizer state (an upload:
  // server/upload/upload_handler.cc), at worker clock `clock`; pins them when
  // `durable`. With `state` (n x the table's state_floats(), checked:
  // common/sparse_table.h CheckRowState) and `steps` (n), the rows get
  // those as their optimizer
  // state and steps. A failed store read stops it at the slice that needed
  // it; a failed write-back of evicted rows is returned after every row is
  // set.
  [[nodiscard]] Status Assign(uint32_t table, const uint64_t* keys,
                              const float* values, size_t n, int64_t clock,
                              bool durable, const float* state = nullptr,
                              const uint64_t* steps = nullptr,
                              const uint32_t* kinds = nullptr,
                              const int64_t* clocks = nullptr);
  // A page of a scan of table `table` (SparseTable::ScanPage, the keys this
  // shard owns, at its expiry clock): keys to keys[0..*n), saved records
  // to out (max x table(table).saved_record_bytes()).
  // With `snapshot` (a point-in-time scan: the store's snapshot taken right
  // after a checkpoint wrote every dirty entry), the page is read from it,
  // entries expired at `clock` (the expiry clock when it was taken) left out.
  [[nodiscard]] Status Scan(uint32_t table, uint64_t from, size_t max,
                            uint64_t* keys, uint8_t* out, size_t* n,
                            const StoreSnapshot* snapshot = nullptr,
                            int64_t clock = 0);
  // Expiry holds for point-in-time scans: while `clock` is set, the store
  // may delete (compaction) only records that were already expired at
  // `clock`, so a snapshot taken at that expiry clock loses nothing.
  void HoldExpiry(std::optional<int64_t> clock) { expiry_hold_ = clock; }
  // Drops every entry (rows and admission counters, cached -- dirty ones
  // too -- or stored) of each table of `tables` (indices < num_tables()):
  // one store write holding a range delete of each table's key space
  // (kPartial: the next cut makes it part of one; bounded work whatever
  // the table holds), then their cache entries. A failed write changes
  // nothing. FailedPrecondition while a key-range move has records staged
  // for one of them (retry after the move). BSP sums of the round in
  // progress are kept: they are pushes, applied at the round's end.
  [[nodiscard]] Status ClearTables(const std::vector<uint32_t>& tables);
  // Row records (SparseTable::ReadRecordSlice) of keys (checked) into out
  // (n x table(table).record_bytes()).
  [[nodiscard]] Status ReadRecords(uint32_t table, const uint64_t* keys,
                                   size_t n, uint8_t* out);
  // BSP: adds gradients (checked) of worker `rank` to this round's sums.
  // The round's average counts each rank once per table (rank -1: every
  // call counts), so the pieces of one push that a client re-routed to
  // this shard separately (elastic shards) count as the one push they are.
  void Accumulate(uint32_t table, const uint64_t* keys, const float* grads,
                  size_t n, int rank = -1);
  // BSP: whether `rank` pushed any of keys[0..n) of `table` this round (a
  // second push of them is not counted; pieces with other keys are).
  bool PushedInRound(int rank, uint32_t table, const uint64_t* keys,
                     size_t n) const;
  // BSP: applies every table's averaged sums at clock `round` and clears
  // them (after HoldRound(); then only write-backs can fail, and every sum
  // is applied anyway). Nothing to do: OK.
  [[nodiscard]] Status ApplyRound(int64_t round, float lr_scale, bool durable);
  bool HasRoundSums() const;

  // --- Persistence ---
  // Durable push / BSP step: puts the pinned entries into `batch`; after the
  // caller's write, CommitDurable(ok) unpins them (clean when ok).
  void AddDurable(StoreBatch* batch);
  void CommitDurable(bool ok);
  // Checkpoint: writes dirty entries in full batches (kPartial) and leaves
  // the rest in `batch` for the caller's kCut write; then CommitCheckpoint().
  [[nodiscard]] Status FlushForCheckpoint(StoreBatch* batch);
  void CommitCheckpoint();
  // Default-space records: table definitions ("0tables") and state
  // ("1sparse": expiry clock, counters, BSP sums), written with every cut.
  static constexpr std::string_view kTablesKey = "0tables";
  static constexpr std::string_view kStateKey = "1sparse";
  void AddSpecsEntry(std::vector<StoreEntry>* entries) const;
  void AddStateEntry(std::vector<StoreEntry>* entries) const;
  static StatusOr<std::vector<TableSpec>> ParseSpecs(std::string_view value);
  // Name of the key space holding the rows of table `index` (its place in
  // the model's table list) defined by `spec`.
  static std::string SpaceName(size_t index, const TableSpec& spec);
  [[nodiscard]] Status RestoreState(std::string_view value);

  // --- Moving key ranges (elastic shards; sparse_move.cc) ---
  // Ownership by key ranges (common/sparse_table.h) instead of
  // ShardOfKey(.., num_shards): from now on Check() accepts exactly the keys
  // whose bucket `ranges` gives this shard (owner -1: nobody here).
  void SetKeyRanges(std::shared_ptr<const KeyRanges> ranges);
  const KeyRanges* key_ranges() const { return ranges_.get(); }
  // Appends to (*out)[t] the move records (row_format.h) of every row and
  // admission counter of table t whose bucket of num_buckets `chosen` marks
  // (chosen.size() == num_buckets): cached ones as cached, stored ones as
  // stored (a scan of the table's key space), expired ones not at all;
  // *rows counts them. ResourceExhausted when they come to more than
  // max_bytes (ask for fewer buckets); FailedPrecondition while BSP sums
  // are pending (the shard is not drained).
  [[nodiscard]] Status ExportBuckets(uint32_t num_buckets,
                                     const std::vector<uint8_t>& chosen,
                                     uint64_t max_bytes,
                                     std::vector<std::string>* out,
                                     uint64_t* rows);
  // Checks the move records of one import (frames[t]: table t's; each must
  // parse as a record of the table, name a key of a chosen bucket and not
  // repeat one of this import or one staged of another bucket) and keeps
  // them until InstallStaged() or DropStaged(). The records staged of a
  // chosen bucket before (a resent import) are replaced. InvalidArgument
  // naming the table and the record; nothing changes then.
  [[nodiscard]] Status StageImport(uint32_t num_buckets,
                                   const std::vector<uint8_t>& chosen,
                                   const std::vector<std::string_view>& frames,
                                   uint64_t* rows);
  uint64_t staged_bytes() const;
  // Bytes the move records of every row and counter would take (store
  // estimates, or the cached entries when more): sizes export batches.
  uint64_t MoveBytesEstimate() const;
  void DropStaged();
  // Adopt of a layout that gives this shard the staged buckets: their
  // records become the tables' (with a store: written as partial writes,
  // the caller's next checkpoint makes them part of a cut; without one:
  // cached, dirty).
  [[nodiscard]] Status InstallStaged();
  // Adopt of a layout that takes buckets away: every row and counter whose
  // bucket `gone` marks leaves the cache and (deletes in partial writes)
  // the store, so a bucket that comes back later holds only what it brings.
  [[nodiscard]] Status DropBuckets(uint32_t num_buckets,
                                   const std::vector<uint8_t>& gone,
                                   uint64_t* rows);

  // --- Clocks ---
  // The expiry clock follows the shard's minimum live clock (never back).
  void AdvanceClock(int64_t min_live_clock);
  int64_t clock() const { return clock_; }

  // --- Budget and stats ---
  // Evicts until the cache is within budget; writes dirty victims.
  [[nodiscard]] Status Enforce();
  uint64_t cache_bytes() const;
  // {"cache_budget_bytes":..,"cache_bytes":..,"tables":[{...}, ...]}
  std::string StatsJson() const;

 private:
  SparseTables(const SparseOptions& options, std::vector<TableSpec> specs,
               Store* store);
  // BSP sums of one table.
  struct RoundSums {
    FlatIndex index;
    std::vector<uint64_t> keys;
    std::vector<float> sums;  // keys.size() x dim
    uint64_t pushes = 0;      // pushes of the round that carried the table
    // Keys each rank pushed this round (not persisted: after a restart a
    // rank's second push of a round counts again).
    std::map<int, FlatIndex> rank_keys;
  };

  const SparseOptions options_;
  const std::vector<TableSpec> specs_;
  Store* const store_;  // may be null
  std::vector<std::unique_ptr<SparseTable>> tables_;
  std::vector<RoundSums> round_;        // per table
  int64_t clock_ = 0;                   // expiry clock
  int64_t persisted_clock_ = 0;         // expiry clock of the last cut written
  std::optional<int64_t> expiry_hold_;  // HoldExpiry
  std::unique_ptr<StoreBatch> writeback_;
  // The request in progress.
  KeySet seen_;  // duplicate detection, per table: key ^ table salt
  size_t request_keys_ = 0;
  uint64_t request_reply_bytes_ = 0;
  uint64_t request_grow_bytes_ = 0;  // no store: new rows of the request
  // Durable pushes: pinned entries, per table.
  std::vector<std::vector<uint32_t>> touched_;
  std::vector<std::vector<uint32_t>> touched_counters_;
  // Held entries of the push or round in progress, per table; and whether
  // the table was held (Apply reads nothing from the store then).
  std::vector<std::vector<uint32_t>> held_;
  std::vector<std::vector<uint32_t>> held_counters_;
  std::vector<uint8_t> holding_;
  // Per table: the keys array of the last Hold() and each key's entries
  // found then (RowCache::kNone: none), for Apply() of the same keys.
  std::vector<const uint64_t*> hold_keys_;
  std::vector<size_t> hold_n_;
  std::vector<std::vector<uint32_t>> hold_rows_;
  std::vector<std::vector<uint32_t>> hold_counters_;
  std::vector<uint32_t> sorted_;
  uint64_t write_errors_ = 0;
  // The shard that owns `key` of the table of `name_hash` (key ranges, or
  // ShardOfKey over num_shards; -1: none of this fleet).
  int OwnerOf(uint64_t name_hash, uint64_t key) const;
  // Elastic shards: key ranges (null: ShardOfKey over num_shards), and the
  // move records staged per table (sparse_move.cc).
  std::shared_ptr<const KeyRanges> ranges_;
  std::vector<std::string> staged_;
  FlatIndex staged_keys_;  // per import: key ^ table salt, for repeats
};

}  // namespace asyncps::server::sparse
