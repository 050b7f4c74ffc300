// SparseTables: requests, budget, BSP sums, persistence and stats of a
// shard's sparse tables.
//
// Default-space records (little-endian):
//   "0tables"  u32 'TBL1', u32 n, per table: u32 name_len, name, u32 dim,
//              u8 init, f32 init_param, u64 seed, u8 optimizer, f32 lr,
//              f32 beta1, f32 beta2, f32 eps, f32 initial_accumulator,
//              u32 admit_after_pushes, i64 expire_after_clocks
//   "1sparse"  u32 'SPS1', i64 expiry clock, u32 n, per table:
//              u32 num_counters, u64 counters[num_counters],
//              u64 round_pushes, u64 num_sums, (u64 key, f32 sum[dim])*
// Key spaces: "table/<index>/<16 hex digits of the name's hash>".
#include "server/sparse/sparse_tables.h"

#include <glog/logging.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "server/internal/all_finite.h"
#include "server/internal/binary_io.h"
#include "server/sparse/row_format.h"

namespace asyncps::server::sparse {
namespace {

using internal::Put;
using internal::Reader;

constexpr uint32_t kTablesMagic = 0x314c4254;  // "TBL1"
constexpr uint32_t kStateMagic = 0x31535053;   // "SPS1"
constexpr size_t kNumCounters = sizeof(TableCounters) / sizeof(uint64_t);

Status Damaged(std::string_view what) {
  return Status::Corruption("store record " + std::string(what) +
                            " is damaged");
}

}  // namespace

std::string SparseTables::SpaceName(size_t index, const TableSpec& spec) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "table/%zu/%016" PRIx64, index,
                HashName(spec.name));
  return buf;
}

StatusOr<std::unique_ptr<SparseTables>> SparseTables::Create(
    const SparseOptions& options, const std::vector<TableSpec>& specs,
    Store* store) {
  RETURN_IF_ERROR(ValidateTables(specs));
  if (options.num_shards < 1 || options.shard_id < 0 ||
      options.shard_id >= options.num_shards) {
    return Status::InvalidArgument("sparse tables: bad shard id or count");
  }
  if (options.max_keys_per_request < 1)
    return Status::InvalidArgument("max_keys_per_request must be >= 1");
  std::unique_ptr<SparseTables> t(new SparseTables(options, specs, store));
  for (size_t i = 0; i < specs.size(); ++i) {
    SpaceId space = kDefaultSpace;
    if (store != nullptr) {
      ASSIGN_OR_RETURN(space, store->OpenSpace(SpaceName(i, specs[i])));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> table,
                     SparseTable::Create(specs[i], store, space));
    t->tables_.push_back(std::move(table));
  }
  if (store != nullptr) t->writeback_ = store->NewBatch();
  return t;
}

SparseTables::SparseTables(const SparseOptions& options,
                           std::vector<TableSpec> specs, Store* store)
    : options_(options),
      specs_(std::move(specs)),
      store_(store),
      round_(specs_.size()),
      touched_(specs_.size()),
      touched_counters_(specs_.size()),
      held_(specs_.size()),
      held_counters_(specs_.size()),
      holding_(specs_.size(), 0),
      hold_keys_(specs_.size(), nullptr),
      hold_n_(specs_.size(), 0),
      hold_rows_(specs_.size()),
      hold_counters_(specs_.size()),
      staged_(specs_.size()) {}

SparseTables::~SparseTables() = default;

void SparseTables::BeginRequest() {
  request_keys_ = 0;
  request_reply_bytes_ = 0;
  request_grow_bytes_ = 0;
}

Status SparseTables::Check(uint32_t table, const uint64_t* keys, size_t n,
                           const float* rows, CheckFailure* why) {
  CheckFailure ignored;
  if (why == nullptr) why = &ignored;
  *why = CheckFailure::kNone;
  if (table >= tables_.size()) {
    *why = CheckFailure::kUnknownTable;
    return Status::NotFound("unknown table " + std::to_string(table) + " (" +
                            std::to_string(tables_.size()) +
                            " tables registered)");
  }
  const TableSpec& spec = specs_[table];
  // request_keys_ <= the limit, so this cannot overflow.
  if (n > options_.max_keys_per_request - request_keys_) {
    *why = CheckFailure::kTooLarge;
    return Status::InvalidArgument(
        "request names more than " +
        std::to_string(options_.max_keys_per_request) +
        " keys on this shard (table '" + spec.name + "': " + std::to_string(n) +
        " more after " + std::to_string(request_keys_) + "): split it");
  }
  request_keys_ += n;
  if (rows == nullptr) {
    const uint64_t bytes = uint64_t{n} * spec.dim * sizeof(float);
    if (bytes > options_.max_reply_bytes - request_reply_bytes_) {
      *why = CheckFailure::kTooLarge;
      return Status::ResourceExhausted(
          "pull of " + std::to_string(n) + " rows of table '" + spec.name +
          "' would make a reply of more than " +
          std::to_string(options_.max_reply_bytes) + " bytes: split it");
    }
    request_reply_bytes_ += bytes;
  }
  const uint64_t h = tables_[table]->name_hash();
  seen_.Clear();
  seen_.Reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t key = keys[i];
    if (!seen_.Insert(key)) {
      *why = CheckFailure::kDuplicateKey;
      return Status::InvalidArgument("table '" + spec.name + "': key " +
                                     std::to_string(key) +
                                     " appears twice in one request");
    }
    if (ranges_ != nullptr || options_.num_shards > 1) {
      const int owner = OwnerOf(h, key);
      if (owner != options_.shard_id) {
        *why = CheckFailure::kWrongShard;
        return Status::InvalidArgument(
            "table '" + spec.name + "': key " + std::to_string(key) +
            " belongs to shard " + std::to_string(owner) + ", not " +
            std::to_string(options_.shard_id));
      }
    }
  }
  if (rows != nullptr && !internal::AllFinite(rows, n * spec.dim)) {
    for (size_t i = 0; i < n; ++i) {
      if (!internal::AllFinite(rows + i * spec.dim, spec.dim)) {
        *why = CheckFailure::kNonFinite;
        return Status::InvalidArgument(
            "table '" + spec.name + "': the row of key " +
            std::to_string(keys[i]) + " contains NaN or Inf");
      }
    }
  }
  if (rows != nullptr && store_ == nullptr) {
    // Without a store the cache is all there is: a push may not take it
    // past its budget (a peer naming ever new keys would otherwise grow the
    // shard without limit).
    const uint64_t grow = uint64_t{tables_[table]->CountUncached(keys, n)} *
                          tables_[table]->entry_bytes();
    if (cache_bytes() + request_grow_bytes_ + grow > options_.cache_bytes) {
      *why = CheckFailure::kTooLarge;
      return Status::ResourceExhausted(
          "table '" + spec.name + "': " + std::to_string(grow) +
          " bytes of new rows do not fit the " +
          std::to_string(options_.cache_bytes) +
          " bytes of rows a shard without a store (--db_path) may hold");
    }
    request_grow_bytes_ += grow;
  }
  return Status::OK();
}

Status SparseTables::Read(uint32_t table, const uint64_t* keys, size_t n,
                          float* out) {
  SparseTable& t = *tables_[table];
  const size_t dim = t.spec().dim;
  for (size_t off = 0; off < n; off += SparseTable::kSliceKeys) {
    const size_t m = std::min(SparseTable::kSliceKeys, n - off);
    // A budget below one slice of rows cannot keep what a pull reads (the
    // Enforce() below would evict it again): the store's records then go
    // straight into the reply, copied once.
    const bool keep = options_.cache_bytes >= m * t.entry_bytes();
    RETURN_IF_ERROR(t.ReadSlice(keys + off, m, clock_, out + off * dim, keep));
    RETURN_IF_ERROR(Enforce());
  }
  return Status::OK();
}

Status SparseTables::Hold(uint32_t table, const uint64_t* keys, size_t n) {
  SparseTable& t = *tables_[table];
  // A second Hold() of one table (not done by the shard) keeps the holds
  // but loses the fast path: Apply() looks its keys up again.
  hold_keys_[table] = holding_[table] ? nullptr : keys;
  hold_n_[table] = n;
  holding_[table] = 1;
  hold_rows_[table].resize(n);
  hold_counters_[table].resize(n);
  for (size_t off = 0; off < n; off += SparseTable::kSliceKeys) {
    const size_t m = std::min(SparseTable::kSliceKeys, n - off);
    RETURN_IF_ERROR(t.HoldSlice(
        keys + off, m, clock_, &held_[table], &held_counters_[table],
        hold_rows_[table].data() + off, hold_counters_[table].data() + off));
    // A failed write-back keeps its victims (dirty) and is reported by the
    // Enforce() of Apply(), which writes them again.
    (void)Enforce();
  }
  return Status::OK();
}

Status SparseTables::HoldRound() {
  for (uint32_t t = 0; t < round_.size(); ++t) {
    const RoundSums& r = round_[t];
    if (r.pushes == 0) continue;
    RETURN_IF_ERROR(Hold(t, r.keys.data(), r.keys.size()));
  }
  return Status::OK();
}

void SparseTables::ReleaseHeld() {
  for (size_t t = 0; t < tables_.size(); ++t) {
    for (uint32_t s : held_[t]) tables_[t]->Unhold(false, s);
    for (uint32_t s : held_counters_[t]) tables_[t]->Unhold(true, s);
    held_[t].clear();
    held_counters_[t].clear();
    holding_[t] = 0;
    hold_keys_[t] = nullptr;
    hold_n_[t] = 0;
  }
}

Status SparseTables::Apply(uint32_t table, const uint64_t* keys,
                           const float* grads, size_t n, int64_t clock,
                           float lr_scale, bool durable) {
  SparseTable& t = *tables_[table];
  const size_t dim = t.spec().dim;
  const bool held = holding_[table] != 0;
  const bool same = held && keys == hold_keys_[table] && n == hold_n_[table];
  Status written;  // the first failed write-back: the rest still applies
  for (size_t off = 0; off < n; off += SparseTable::kSliceKeys) {
    const size_t m = std::min(SparseTable::kSliceKeys, n - off);
    RETURN_IF_ERROR(t.ApplySlice(
        keys + off, grads + off * dim, m, clock, clock_, lr_scale, durable,
        held, same ? hold_rows_[table].data() + off : nullptr,
        same ? hold_counters_[table].data() + off : nullptr, &touched_[table],
        &touched_counters_[table]));
    Status s = Enforce();
    if (written.ok()) written = s;
  }
  return written;
}

Status SparseTables::Assign(uint32_t table, const uint64_t* keys,
                            const float* values, size_t n, int64_t clock,
                            bool durable, const float* state,
                            const uint64_t* steps, const uint32_t* kinds,
                            const int64_t* clocks) {
  SparseTable& t = *tables_[table];
  const size_t dim = t.spec().dim;
  const size_t k = t.state_floats();
  Status written;  // the first failed write-back: the rest is still set
  for (size_t off = 0; off < n; off += SparseTable::kSliceKeys) {
    const size_t m = std::min(SparseTable::kSliceKeys, n - off);
    RETURN_IF_ERROR(t.AssignSlice(keys + off, values + off * dim, m, clock,
                                  clock_, durable, &touched_[table],
                                  &touched_counters_[table],
                                  state != nullptr ? state + off * k : nullptr,
                                  steps != nullptr ? steps + off : nullptr,
                                  kinds != nullptr ? kinds + off : nullptr,
                                  clocks != nullptr ? clocks + off : nullptr));
    Status s = Enforce();
    if (written.ok()) written = s;
  }
  return written;
}

int SparseTables::OwnerOf(uint64_t name_hash, uint64_t key) const {
  if (ranges_ != nullptr) return ranges_->Owner(name_hash, key);
  if (options_.num_shards <= 1) return options_.shard_id;
  return ShardOfKeyHashed(name_hash, key, options_.num_shards);
}

Status SparseTables::Scan(uint32_t table, uint64_t from, size_t max,
                          uint64_t* keys, uint8_t* out, size_t* n,
                          const StoreSnapshot* snapshot, int64_t clock) {
  SparseTable& t = *tables_[table];
  const uint64_t h = t.name_hash();
  auto owned = [&](uint64_t key) {
    return OwnerOf(h, key) == options_.shard_id;
  };
  return t.ScanPage(from, max, snapshot != nullptr ? clock : clock_, owned,
                    keys, out, n, snapshot);
}

Status SparseTables::ClearTables(const std::vector<uint32_t>& tables) {
  for (uint32_t t : tables) {
    if (t < staged_.size() && !staged_[t].empty()) {
      return Status::FailedPrecondition(
          "clearing table '" + specs_[t].name +
          "': a key-range move has rows of it staged here; retry after the "
          "move");
    }
  }
  if (store_ != nullptr) {
    // Every store key of a table is 8 bytes (EncodeKey): all of them sort
    // below nine 0xff bytes.
    static const std::string kPastLastKey(9, '\xff');
    std::unique_ptr<StoreBatch> batch = store_->NewBatch();
    for (uint32_t t : tables)
      batch->DeleteRange(tables_[t]->space(), std::string_view(), kPastLastKey);
    RETURN_IF_ERROR(
        store_->Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kPartial)
            .WithContext("clearing sparse tables"));
  }
  for (uint32_t t : tables) tables_[t]->DropCache();
  return Status::OK();
}

Status SparseTables::ReadRecords(uint32_t table, const uint64_t* keys, size_t n,
                                 uint8_t* out) {
  SparseTable& t = *tables_[table];
  for (size_t off = 0; off < n; off += SparseTable::kSliceKeys) {
    const size_t m = std::min(SparseTable::kSliceKeys, n - off);
    RETURN_IF_ERROR(
        t.ReadRecordSlice(keys + off, m, clock_, out + off * t.record_bytes()));
    RETURN_IF_ERROR(Enforce());
  }
  return Status::OK();
}

void SparseTables::Accumulate(uint32_t table, const uint64_t* keys,
                              const float* grads, size_t n, int rank) {
  RoundSums& r = round_[table];
  const size_t dim = specs_[table].dim;
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = r.index.Find(keys[i]);
    if (s == FlatIndex::kNone) {
      s = static_cast<uint32_t>(r.keys.size());
      r.index.Insert(keys[i], s);
      r.keys.push_back(keys[i]);
      r.sums.resize(r.sums.size() + dim, 0.0f);
    }
    float* sum = r.sums.data() + size_t{s} * dim;
    const float* g = grads + i * dim;
    for (size_t j = 0; j < dim; ++j) sum[j] += g[j];
  }
  if (rank < 0) {
    ++r.pushes;
    return;
  }
  auto [it, first] = r.rank_keys.try_emplace(rank);
  if (first) ++r.pushes;
  for (size_t i = 0; i < n; ++i)
    if (it->second.Find(keys[i]) == FlatIndex::kNone)
      it->second.Insert(keys[i], 0);
}

bool SparseTables::PushedInRound(int rank, uint32_t table, const uint64_t* keys,
                                 size_t n) const {
  const auto it = round_[table].rank_keys.find(rank);
  if (it == round_[table].rank_keys.end()) return false;
  for (size_t i = 0; i < n; ++i)
    if (it->second.Find(keys[i]) != FlatIndex::kNone) return true;
  return false;
}

bool SparseTables::HasRoundSums() const {
  for (const RoundSums& r : round_) {
    if (r.pushes > 0) return true;
  }
  return false;
}

Status SparseTables::ApplyRound(int64_t round, float lr_scale, bool durable) {
  for (uint32_t t = 0; t < round_.size(); ++t) {
    RoundSums& r = round_[t];
    if (r.pushes == 0) continue;
    const float k = static_cast<float>(r.pushes);
    for (float& v : r.sums) v = v / k;
    Status s = Apply(t, r.keys.data(), r.sums.data(), r.keys.size(), round,
                     lr_scale, durable);
    r = RoundSums();
    RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

void SparseTables::AddDurable(StoreBatch* batch) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    sorted_ = touched_[t];
    tables_[t]->AddRecords(false, &sorted_, batch);
    sorted_ = touched_counters_[t];
    tables_[t]->AddRecords(true, &sorted_, batch);
  }
}

void SparseTables::CommitDurable(bool ok) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    for (uint32_t s : touched_[t]) tables_[t]->Release(false, s, ok);
    for (uint32_t s : touched_counters_[t]) {
      if (s != RowCache::kNone) tables_[t]->Release(true, s, ok);
    }
    touched_[t].clear();
    touched_counters_[t].clear();
  }
  if (ok) persisted_clock_ = clock_;
  if (!ok) ++write_errors_;
  if (ok && store_ != nullptr) {
    for (auto& t : tables_) {
      if (t->spec().expire_after_clocks > 0) {
        const int64_t at = expiry_hold_
                               ? std::min(persisted_clock_, *expiry_hold_)
                               : persisted_clock_;
        store_->SetSpaceExpiry(t->space(), kRecordClockOffset,
                               at - t->spec().expire_after_clocks);
      }
    }
  }
}

Status SparseTables::FlushForCheckpoint(StoreBatch* batch) {
  for (auto& t : tables_) {
    for (bool counter : {false, true}) {
      sorted_.clear();
      t->ForEachDirty([&](bool c, uint32_t slot) {
        if (c == counter) sorted_.push_back(slot);
      });
      t->SortByKey(counter, &sorted_);
      // Full batches go out as partial writes; the rest is the caller's.
      for (uint32_t slot : sorted_) {
        t->AddRecord(counter, slot, batch);
        if (batch->bytes() >= options_.checkpoint_batch_bytes) {
          Status st =
              store_->Write({}, batch, SyncMode::kNoSync, WriteKind::kPartial);
          batch->Clear();
          RETURN_IF_ERROR(
              st.WithContext("checkpoint of table '" + t->spec().name + "'"));
        }
      }
    }
  }
  return Status::OK();
}

void SparseTables::CommitCheckpoint() {
  for (auto& t : tables_) t->MarkAllClean();
  for (size_t t = 0; t < tables_.size(); ++t) {
    touched_[t].clear();
    touched_counters_[t].clear();
  }
  CommitDurable(true);
}

Status SparseTables::Enforce() {
  if (store_ == nullptr) return Status::OK();
  uint64_t used = cache_bytes();
  if (used <= options_.cache_bytes) return Status::OK();
  const uint64_t target = options_.cache_bytes - options_.cache_bytes / 32;
  // Victims come from the table holding the most bytes, 256 at a time.
  // Dirty victims stay in the cache until their write-back succeeded.
  auto left = [](const SparseTable& t) {
    return t.cache_bytes() - t.evicting_bytes();
  };
  while (used > target) {
    size_t biggest = 0;
    for (size_t i = 1; i < tables_.size(); ++i) {
      if (left(*tables_[i]) > left(*tables_[biggest])) biggest = i;
    }
    if (tables_[biggest]->Evict(256, writeback_.get()) == 0) break;
    used = 0;
    for (const auto& t : tables_) used += left(*t);
  }
  Status s;
  if (writeback_->count() > 0) {
    s = store_->Write({}, writeback_.get(), SyncMode::kNoSync,
                      WriteKind::kPartial);
    writeback_->Clear();
    if (!s.ok()) ++write_errors_;
  }
  for (auto& t : tables_) t->EndEvict(s.ok());
  return s.WithContext("writing back evicted rows");
}

uint64_t SparseTables::cache_bytes() const {
  uint64_t b = 0;
  for (const auto& t : tables_) b += t->cache_bytes();
  return b;
}

void SparseTables::AdvanceClock(int64_t min_live_clock) {
  clock_ = std::max(clock_, min_live_clock);
}

void SparseTables::AddSpecsEntry(std::vector<StoreEntry>* entries) const {
  StoreEntry e;
  e.key = std::string(kTablesKey);
  std::string& h = e.head;
  Put<uint32_t>(&h, kTablesMagic);
  Put<uint32_t>(&h, static_cast<uint32_t>(specs_.size()));
  for (const TableSpec& t : specs_) {
    Put<uint32_t>(&h, static_cast<uint32_t>(t.name.size()));
    h += t.name;
    Put<uint32_t>(&h, t.dim);
    Put<uint8_t>(&h, static_cast<uint8_t>(t.init));
    Put<float>(&h, t.init_param);
    Put<uint64_t>(&h, t.seed);
    Put<uint8_t>(&h, static_cast<uint8_t>(t.optimizer.kind));
    Put<float>(&h, t.optimizer.lr);
    Put<float>(&h, t.optimizer.beta1);
    Put<float>(&h, t.optimizer.beta2);
    Put<float>(&h, t.optimizer.eps);
    Put<float>(&h, t.optimizer.initial_accumulator);
    Put<uint32_t>(&h, t.admit_after_pushes);
    Put<int64_t>(&h, t.expire_after_clocks);
  }
  entries->push_back(std::move(e));
}

StatusOr<std::vector<TableSpec>> SparseTables::ParseSpecs(
    std::string_view value) {
  Reader r(value);
  uint32_t magic = 0, n = 0;
  if (!r.Get(&magic) || magic != kTablesMagic || !r.Get(&n) || n > kMaxTables) {
    return Damaged("tables");
  }
  std::vector<TableSpec> specs(n);
  for (TableSpec& t : specs) {
    uint32_t len = 0;
    uint8_t init = 0, kind = 0;
    if (!r.Get(&len) || len > r.remaining()) return Damaged("tables");
    t.name.resize(len);
    if (!r.GetBytes(t.name.data(), len) || !r.Get(&t.dim) || !r.Get(&init) ||
        !r.Get(&t.init_param) || !r.Get(&t.seed) || !r.Get(&kind) ||
        !r.Get(&t.optimizer.lr) || !r.Get(&t.optimizer.beta1) ||
        !r.Get(&t.optimizer.beta2) || !r.Get(&t.optimizer.eps) ||
        !r.Get(&t.optimizer.initial_accumulator) ||
        !r.Get(&t.admit_after_pushes) || !r.Get(&t.expire_after_clocks)) {
      return Damaged("tables");
    }
    t.init = static_cast<InitKind>(init);
    t.optimizer.kind = static_cast<RowOptimizerKind>(kind);
  }
  Status v = ValidateTables(specs);
  if (!v.ok()) return Status::Corruption("stored tables: " + v.message());
  return specs;
}

void SparseTables::AddStateEntry(std::vector<StoreEntry>* entries) const {
  StoreEntry e;
  e.key = std::string(kStateKey);
  std::string& h = e.head;
  Put<uint32_t>(&h, kStateMagic);
  Put<int64_t>(&h, clock_);
  Put<uint32_t>(&h, static_cast<uint32_t>(tables_.size()));
  for (size_t t = 0; t < tables_.size(); ++t) {
    Put<uint32_t>(&h, static_cast<uint32_t>(kNumCounters));
    uint64_t c[kNumCounters];
    std::memcpy(c, &tables_[t]->counters(), sizeof(c));
    for (uint64_t v : c) Put<uint64_t>(&h, v);
    const RoundSums& r = round_[t];
    Put<uint64_t>(&h, r.pushes);
    Put<uint64_t>(&h, r.keys.size());
    const size_t dim = specs_[t].dim;
    for (size_t i = 0; i < r.keys.size(); ++i) {
      Put<uint64_t>(&h, r.keys[i]);
      h.append(reinterpret_cast<const char*>(r.sums.data() + i * dim),
               dim * sizeof(float));
    }
  }
  entries->push_back(std::move(e));
}

Status SparseTables::RestoreState(std::string_view value) {
  Reader r(value);
  uint32_t magic = 0, n = 0;
  if (!r.Get(&magic) || magic != kStateMagic || !r.Get(&clock_) || !r.Get(&n) ||
      n != tables_.size()) {
    return Damaged("sparse state");
  }
  persisted_clock_ = clock_;
  for (size_t t = 0; t < n; ++t) {
    uint32_t nc = 0;
    if (!r.Get(&nc) || nc > 1024) return Damaged("sparse state");
    uint64_t c[kNumCounters] = {};
    for (uint32_t i = 0; i < nc; ++i) {
      uint64_t v = 0;
      if (!r.Get(&v)) return Damaged("sparse state");
      if (i < kNumCounters) c[i] = v;
    }
    std::memcpy(&tables_[t]->counters(), c, sizeof(c));
    RoundSums& rs = round_[t];
    rs = RoundSums();
    uint64_t nk = 0;
    const size_t dim = specs_[t].dim;
    if (!r.Get(&rs.pushes) || !r.Get(&nk) ||
        nk > r.remaining() / (8 + dim * sizeof(float))) {
      return Damaged("sparse state");
    }
    rs.keys.resize(nk);
    rs.sums.resize(nk * dim);
    for (uint64_t i = 0; i < nk; ++i) {
      if (!r.Get(&rs.keys[i]) ||
          !r.GetBytes(rs.sums.data() + i * dim, dim * sizeof(float)) ||
          rs.index.Find(rs.keys[i]) != FlatIndex::kNone) {
        return Damaged("sparse state");
      }
      rs.index.Insert(rs.keys[i], static_cast<uint32_t>(i));
    }
  }
  if (r.remaining() != 0) return Damaged("sparse state");
  CommitDurable(true);  // expiry thresholds from the restored clock
  return Status::OK();
}

std::string SparseTables::StatsJson() const {
  nlohmann::json j;
  j["cache_budget_bytes"] = options_.cache_bytes;
  j["cache_bytes"] = cache_bytes();
  uint64_t allocated = 0;
  for (const auto& t : tables_) allocated += t->cache_allocated_bytes();
  j["cache_allocated_bytes"] = allocated;
  j["expiry_clock"] = clock_;
  j["write_errors"] = write_errors_;
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& tp : tables_) {
    const SparseTable& t = *tp;
    const TableCounters& c = t.counters();
    nlohmann::json o;
    o["name"] = t.spec().name;
    o["dim"] = t.spec().dim;
    o["optimizer"] = RowOptimizerKindName(t.spec().optimizer.kind);
    SpaceStats ss;
    if (store_ != nullptr) ss = store_->GetSpaceStats(t.space());
    o["rows"] = ss.estimated_keys;
    o["disk_bytes"] = ss.disk_bytes;
    o["memtable_bytes"] = ss.memtable_bytes;
    o["cache_rows"] = t.cache_rows();
    o["cache_counters"] = t.cache_counters();
    o["cache_bytes"] = t.cache_bytes();
    const uint64_t lookups = c.hits + c.misses;
    o["hit_rate"] = lookups == 0 ? 0.0
                                 : static_cast<double>(c.hits) /
                                       static_cast<double>(lookups);
    o["hits"] = c.hits;
    o["misses"] = c.misses;
    o["rows_read"] = c.rows_read;
    o["rows_pushed"] = c.rows_pushed;
    o["rocksdb_reads"] = c.store_reads;
    o["rocksdb_found"] = c.store_found;
    o["rocksdb_writes"] = c.store_writes;
    o["write_backs"] = c.write_backs;
    o["evictions"] = c.evictions;
    o["admitted"] = c.admitted;
    o["admission_counted"] = c.counted;
    o["expired"] = c.expired;
    tables.push_back(std::move(o));
  }
  j["tables"] = std::move(tables);
  return j.dump();
}

}  // namespace asyncps::server::sparse
