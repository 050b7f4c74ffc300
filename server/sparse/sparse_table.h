// SparseTable: one sparse table's rows on one shard: a RowCache in memory in
// front of the table's key space in the Store (the primary copy of every
// stored row), the per-row optimizer, admission counters and expiry.
//
// A key is in exactly one of three states:
//   - absent: never admitted, or expired. Reads as InitializeRow(spec, key)
//     and takes no space anywhere;
//   - counted (admission, spec.admit_after_pushes = N > 1): pushed fewer
//     than N times; an 'ADM1' record holds the count. Reads as absent; the
//     gradients of these pushes are dropped;
//   - a row: weights, optimizer state (beside the row) and step count.
// An entry not pushed for more than spec.expire_after_clocks clocks reads
// as absent (checked on every lookup, so the answer does not depend on what
// is cached) and is dropped from the cache; the store's copy is deleted by
// compaction (Store::SetSpaceExpiry), never by a lookup.
//
// Requests arrive in slices (the owner, server/sparse/sparse_tables.h,
// cuts them and keeps the shared cache budget between slices): a slice of
// unique keys is looked up in the cache; the misses go to the store in one
// MultiGet; found records enter the cache clean. A push is held first
// (HoldSlice: every key read, the found entries marked held, so nothing
// evicts them), then applied (ApplySlice with `held`: the store is not read
// again, a key not cached is absent), so a failed read leaves nothing
// applied. A push slice applies the optimizer to each row (creating rows
// from their initial value, or counting them for admission) and marks them
// dirty, and pinned when `pin` (durable pushes: the owner writes them
// before the acknowledgement).
// Dirty entries reach the store when evicted (EvictOne), at a checkpoint
// (AddDirty) or in a durable push's batch (AddRecord).
//
// Ownership: borrows the Store (outlives the table). Thread safety: none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/flat_index.h"
#include "common/sparse_table.h"
#include "common/status.h"
#include "server/optimizer/optimizer.h"
#include "server/sparse/row_cache.h"
#include "server/sparse/row_format.h"
#include "server/store/store.h"

namespace asyncps::server::sparse {

// Counters of one table (cumulative since the table was registered; persisted
// in checkpoints).
struct TableCounters {
  uint64_t rows_read = 0;     // keys answered to pulls
  uint64_t rows_pushed = 0;   // keys of applied pushes
  uint64_t hits = 0;          // lookups answered by the cache
  uint64_t misses = 0;        // lookups that went to the store
  uint64_t store_reads = 0;   // keys looked up in the store (MultiGet)
  uint64_t store_found = 0;   // of which had a record
  uint64_t store_writes = 0;  // records written (write-back, checkpoint,
                              // durable pushes)
  uint64_t write_backs = 0;   // dirty entries written when evicted
  uint64_t evictions = 0;     // entries evicted from the cache
  uint64_t admitted = 0;      // rows created
  uint64_t counted = 0;       // pushes counted for admission (dropped)
  uint64_t expired = 0;       // entries found expired by a lookup
};

class SparseTable {
 public:
  // Most keys per slice (the cache may exceed its budget by one slice).
  static constexpr size_t kSliceKeys = 4096;

  // `space` is the table's key space in `store` (may be null: no store,
  // every row lives in the cache, for tests and benchmarks).
  static StatusOr<std::unique_ptr<SparseTable>> Create(const TableSpec& spec,
                                                       Store* store,
                                                       SpaceId space);
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const TableSpec& spec() const { return spec_; }
  uint64_t name_hash() const { return name_hash_; }
  // Floats of a row: weights + optimizer state.
  size_t floats_per_row() const { return rows_.floats_per_entry(); }

  // Writes the current value of keys[0..n) (unique, n <= kSliceKeys) to
  // out (n x dim floats). `now` is the expiry clock. `keep_misses`: rows
  // read from the store enter the cache (clean); otherwise their records
  // are copied straight into `out` and the cache is left as it was (for a
  // cache too small to keep them: inserting would only evict them again).
  [[nodiscard]] Status ReadSlice(const uint64_t* keys, size_t n, int64_t now,
                                 float* out, bool keep_misses = true);

  // Reads keys[0..n) (unique, n <= kSliceKeys) into the cache and marks
  // the entries found held (not evictable, not expired) until Unhold();
  // their slots are appended to *held (rows) and *held_counters (once per
  // entry), and key i's row and counter slots (RowCache::kNone: none) are
  // written to rows[i] and counters[i]. Fails only when the store does
  // (nothing is applied).
  [[nodiscard]] Status HoldSlice(const uint64_t* keys, size_t n, int64_t now,
                                 std::vector<uint32_t>* held,
                                 std::vector<uint32_t>* held_counters,
                                 uint32_t* rows, uint32_t* counters);
  // Clears the held flag of an entry (no-op on a slot no longer in use).
  void Unhold(bool counter, uint32_t slot);

  // Applies gradients grads (n x dim) to keys[0..n) (unique, n <=
  // kSliceKeys), pushed at worker clock `clock`, learning rate scaled by
  // lr_scale. `held`: HoldSlice() read these keys, so the store is not read
  // (a key not cached is absent) and this cannot fail; otherwise a failed
  // read fails the slice before anything of it is applied. `held_rows` /
  // `held_counters` (or nullptr): the slots HoldSlice() gave for exactly
  // these keys, in this order and with no apply of them in between, so no
  // key is looked up again (REQUIRES: held). Touched entries become dirty,
  // and pinned when `pin`; their slots are appended to *touched (rows) and
  // *touched_counters.
  [[nodiscard]] Status ApplySlice(const uint64_t* keys, const float* grads,
                                  size_t n, int64_t clock, int64_t now,
                                  float lr_scale, bool pin, bool held,
                                  const uint32_t* held_rows,
                                  const uint32_t* held_counters,
                                  std::vector<uint32_t>* touched,
                                  std::vector<uint32_t>* touched_counters);

  // Sets keys[0..n) (unique, n <= kSliceKeys) to `values` (n x dim), their
  // optimizer state and step count to zero (an upload: kAssign), as rows
  // (an admission counter of the key is dropped), at worker clock `clock`.
  // With `state` (n x state_floats(), checked by the caller) and `steps`
  // (n), those become the rows' optimizer state and step counts instead
  // (a restore of saved state). Reads the store first (a failed read fails
  // the slice before anything of it is set). Entries become dirty, pinned
  // when `pin`; slots appended to *touched.
  // With `kinds` and `clocks` (n each: a restore of saved entries,
  // checked by the caller with CheckSavedMeta), key i becomes a row (kind
  // kSavedRow) or an admission counter of steps[i] pushes (kSavedCounter:
  // a row of the key is dropped), last pushed at clocks[i].
  [[nodiscard]] Status AssignSlice(const uint64_t* keys, const float* values,
                                   size_t n, int64_t clock, int64_t now,
                                   bool pin, std::vector<uint32_t>* touched,
                                   std::vector<uint32_t>* touched_counters,
                                   const float* state = nullptr,
                                   const uint64_t* steps = nullptr,
                                   const uint32_t* kinds = nullptr,
                                   const int64_t* clocks = nullptr);
  // Bytes of a saved entry (common/sparse_table.h SavedRecordBytes).
  size_t saved_record_bytes() const {
    return kSavedHeaderBytes + rows_.floats_per_entry() * sizeof(float);
  }
  // A page of a scan of this table's entries (rows and admission counters,
  // cached or stored, not expired at `now`, whose key `owned` accepts):
  // the first min(max, left) of them with key >= `from`, in key order;
  // their keys go to keys[0..*n) and their saved records (common/
  // sparse_table.h) to out (max x saved_record_bytes()). Leaves the cache
  // as it is. Corruption for a bad stored record. Besides `out` it
  // allocates at most scan_scratch_bytes(max) (the cached entries of the
  // page; the store's are written straight into `out`), whatever the
  // table holds.
  // With `snapshot`: the page is read from the store as the snapshot holds
  // it, the cache not at all (the caller took the snapshot right after
  // writing every dirty entry to the store: a point-in-time scan).
  [[nodiscard]] Status ScanPage(uint64_t from, size_t max, int64_t now,
                                const std::function<bool(uint64_t)>& owned,
                                uint64_t* keys, uint8_t* out, size_t* n,
                                const StoreSnapshot* snapshot = nullptr);
  static size_t scan_scratch_bytes(size_t max) {
    return max * sizeof(ScanCached);
  }
  // Writes the row record (common/protocol.capnp, Assign phase 3: u64
  // steps, f32 weights[dim], f32 state[state_floats()]) of keys[0..n)
  // (unique, n <= kSliceKeys) to out (n x record_bytes(), unaligned): a
  // key without a row as its initial value, its optimizer's initial state
  // and 0 steps. `now` is the expiry clock.
  [[nodiscard]] Status ReadRecordSlice(const uint64_t* keys, size_t n,
                                       int64_t now, uint8_t* out);
  // Floats of optimizer state per row (dim x the optimizer's floats per
  // weight) and bytes of a row record.
  size_t state_floats() const { return state_floats_; }
  size_t record_bytes() const {
    return sizeof(uint64_t) + rows_.floats_per_entry() * sizeof(float);
  }

  // Puts the record of an entry into `batch`.
  void AddRecord(bool counter, uint32_t slot, StoreBatch* batch);
  // The store record's header and body of an entry (the body points into
  // the cache: valid until the entry changes).
  RecordHeader RecordOf(bool counter, uint32_t slot, std::string_view* body);
  // Puts the records of several entries into `batch` in key order (RocksDB
  // inserts sorted keys into its memtable much faster). Reorders `slots`;
  // skips RowCache::kNone.
  void AddRecords(bool counter, std::vector<uint32_t>* slots,
                  StoreBatch* batch);
  // Sorts entries by key and drops RowCache::kNone.
  void SortByKey(bool counter, std::vector<uint32_t>* slots) const;
  // Clears the pinned flag (and the dirty flag when `clean`) of an entry.
  void Release(bool counter, uint32_t slot, bool clean);

  // Evicts up to `max` entries in CLOCK order. Clean ones are removed at
  // once; dirty ones are put into `batch` (in key order) and stay in the
  // cache, pinned, until EndEvict() says whether the caller's write of the
  // batch succeeded: a failed write-back loses nothing. Returns how many
  // entries were evicted or await their write; 0 when nothing is evictable
  // (all pinned, or dirty with no store to write them to).
  size_t Evict(size_t max, StoreBatch* batch);
  // After the write of Evict()'s batch: `written`: the dirty victims go;
  // otherwise they stay, dirty and unpinned (evicted again later).
  void EndEvict(bool written);
  // Bytes of the dirty victims awaiting EndEvict().
  size_t evicting_bytes() const;

  // Calls fn(counter, slot) for every dirty entry.
  template <typename F>
  void ForEachDirty(F&& fn) {
    rows_.ForEach([&](uint32_t s) {
      if (rows_.meta(s).flags & EntryMeta::kDirty) fn(false, s);
    });
    if (admission_) {
      admission_->ForEach([&](uint32_t s) {
        if (admission_->meta(s).flags & EntryMeta::kDirty) fn(true, s);
      });
    }
  }
  // --- Moving key ranges (elastic shards; sparse_move.cc) ---
  // Appends the move record (row_format.h) of every cached entry whose key
  // `pick` accepts and that is not expired at `now` to *out; every cached
  // key it accepts, expired or not, goes into *cached (the store's copy of
  // such a key is older: the cache wins). Returns the records appended.
  size_t ExportCached(const std::function<bool(uint64_t)>& pick, int64_t now,
                      std::string* out, FlatIndex* cached);
  // Removes every cached entry whose key `pick` accepts, dirty or not (its
  // rows were exported and belong to another shard now).
  void DropCached(const std::function<bool(uint64_t)>& pick);
  // Makes a moved record (checked by the caller with ParseRecord) this
  // table's: with a store it goes into `batch` (a cached entry of the key
  // is dropped); without one it enters the cache, dirty.
  void Install(uint64_t key, std::string_view value, StoreBatch* batch);

  // Marks every entry clean (after a checkpoint wrote them).
  void MarkAllClean();
  // Drops every cache entry without writing (recovery, tests).
  void DropCache();

  // Cache memory: live bytes and allocated bytes.
  size_t cache_bytes() const;
  size_t cache_allocated_bytes() const;
  size_t cache_rows() const { return rows_.entries(); }
  // Keys among keys[0..n) without a cached row; and the bytes of one row
  // entry (floats, optimizer state, metadata).
  size_t CountUncached(const uint64_t* keys, size_t n) const;
  size_t entry_bytes() const { return rows_.entry_bytes(); }
  size_t cache_counters() const {
    return admission_ ? admission_->entries() : 0;
  }

  TableCounters& counters() { return counters_stats_; }
  const TableCounters& counters() const { return counters_stats_; }
  SpaceId space() const { return space_; }

  // True when an entry last pushed at `last_clock` is expired at `now`.
  bool Expired(int64_t last_clock, int64_t now) const {
    return spec_.expire_after_clocks > 0 &&
           now - last_clock > spec_.expire_after_clocks;
  }

 private:
  SparseTable(const TableSpec& spec, Store* store, SpaceId space,
              std::unique_ptr<Optimizer> optimizer);

  // A cached entry of a scan page (ScanPage).
  struct ScanCached {
    uint64_t key;
    uint32_t slot;
    bool counter;
  };
  // slot_[i] of a row Resolve() copied straight into `direct_out`.
  static constexpr uint32_t kDirect = RowCache::kNone - 1;
  // Fills slot_[i] / counter_slot_[i] for keys[0..n), reading misses from
  // the store into the cache (`read_store`; otherwise misses are absent).
  // With `direct_out` (n x dim floats), a row found in the store is not
  // cached: its weights go to direct_out[i] and slot_[i] = kDirect.
  Status Resolve(const uint64_t* keys, size_t n, int64_t now,
                 bool read_store = true, float* direct_out = nullptr);
  // Looks up one key in the cache (expired entries are dropped).
  void LookupCached(uint64_t key, int64_t now, uint32_t* row,
                    uint32_t* counter);
  // A new row from the initial value.
  uint32_t CreateRow(uint64_t key);
  // The optimizer state of a new row, per float (AdaGrad's initial sum).
  float InitialState() const;
  // Removes admission counter `c` (a row replaces it: same key, so the
  // row's record overwrites the counter's in the store), and its slot from
  // *touched_counters when it was pinned there.
  void DropCounter(uint32_t c, std::vector<uint32_t>* touched_counters);

  const TableSpec spec_;
  const uint64_t name_hash_;
  Store* const store_;  // may be null
  const SpaceId space_;
  std::unique_ptr<Optimizer> optimizer_;
  const size_t state_floats_;  // dim * state_per_elem
  RowCache rows_;
  std::unique_ptr<RowCache> admission_;  // counters; admission only
  TableCounters counters_stats_;

  // Per slice, reused.
  std::vector<uint32_t> slot_;
  std::vector<uint32_t> counter_slot_;
  std::vector<EncodedKey> miss_keys_;
  std::vector<std::string_view> miss_views_;
  std::vector<uint32_t> miss_index_;
  std::vector<uint32_t> victims_[2];  // rows, counters
  std::vector<uint32_t> dirty_;
  std::vector<float> record_scratch_;  // ReadRecordSlice: a row not stored
  std::vector<uint32_t> evicting_[2];  // dirty victims awaiting EndEvict
};

}  // namespace asyncps::server::sparse
