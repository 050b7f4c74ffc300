// SparseTables / SparseTable: moving the rows of key-range buckets between
// shards (elastic shards: server/migrate/migration_rows.cc drives it).
//
// What moves is what the store would hold of a key: its row record (weights,
// optimizer state, step count, clock of the last push) or its admission
// counter, in the store's own encoding (row_format.h, the records that
// server/reshard/ copies offline), framed as move records. The cache holds
// the newest copy of a key when it holds one (dirty or not), so cached
// entries are taken first and the store's records only for keys not
// cached. Expired entries read as absent anywhere, so they do not move.
//
// Costs: an export scans the whole key space of every table once (RocksDB
// has the keys in key order, not bucket order); the coordinator asks for
// many buckets at a time to keep the number of scans low.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "server/sparse/row_format.h"
#include "server/sparse/sparse_tables.h"

namespace asyncps::server::sparse {
namespace {

// Per-import salt, so one FlatIndex tells repeats apart per table.
uint64_t Salted(uint64_t key, size_t table) {
  return key ^ (0x9e3779b97f4a7c15ULL * (table + 1));
}

uint64_t DecodeKey(const char* p) {
  uint64_t k = 0;
  for (int i = 0; i < 8; ++i) k = (k << 8) | static_cast<uint8_t>(p[i]);
  return k;
}

// Calls fn(key, value) for every move record of a run checked by
// StageImport().
template <typename F>
void ForEachMoveRecord(std::string_view f, F&& fn) {
  for (size_t at = 0; at < f.size();) {
    uint32_t size = 0;
    std::memcpy(&size, f.data() + at + 8, sizeof(size));
    fn(DecodeKey(f.data() + at), f.substr(at + kMoveRecordHeadBytes, size));
    at += kMoveRecordHeadBytes + size;
  }
}

}  // namespace

// --- SparseTable ---

size_t SparseTable::ExportCached(const std::function<bool(uint64_t)>& pick,
                                 int64_t now, std::string* out,
                                 FlatIndex* cached) {
  size_t n = 0;
  for (bool counter : {false, true}) {
    RowCache* cache = counter ? admission_.get() : &rows_;
    if (cache == nullptr) continue;
    cache->ForEach([&](uint32_t slot) {
      const EntryMeta& m = cache->meta(slot);
      if (!pick(m.key)) return;
      if (cached->Find(m.key) == FlatIndex::kNone) cached->Insert(m.key, 0);
      if (Expired(m.last_clock, now)) return;
      std::string_view body;
      const RecordHeader h = RecordOf(counter, slot, &body);
      AppendMoveRecord(out, EncodeKey(m.key).view(), HeaderBytes(h), body);
      ++n;
    });
  }
  return n;
}

void SparseTable::DropCached(const std::function<bool(uint64_t)>& pick) {
  for (bool counter : {false, true}) {
    RowCache* cache = counter ? admission_.get() : &rows_;
    if (cache == nullptr) continue;
    cache->ForEach([&](uint32_t slot) {
      if (pick(cache->meta(slot).key)) cache->Remove(slot);
    });
  }
}

void SparseTable::Install(uint64_t key, std::string_view value,
                          StoreBatch* batch) {
  for (RowCache* cache : {&rows_, admission_.get()}) {
    if (cache == nullptr) continue;
    const uint32_t s = cache->Find(key);
    if (s != RowCache::kNone) cache->Remove(s);
  }
  if (batch != nullptr) {
    batch->Put(space_, EncodeKey(key).view(), value, std::string_view());
    ++counters_stats_.store_writes;
    return;
  }
  RecordView rec;
  if (!ParseRecord(value, spec_.dim, rows_.floats_per_entry(), &rec).ok())
    return;  // checked by the caller
  RowCache* cache = rec.is_row() ? &rows_ : admission_.get();
  if (cache == nullptr) return;  // a counter of a table without admission
  const uint32_t slot = cache->Insert(key);
  if (rec.is_row()) {
    std::memcpy(rows_.floats(slot), rec.floats,
                rows_.floats_per_entry() * sizeof(float));
  }
  EntryMeta& m = cache->meta(slot);
  m.count = rec.header.count;
  m.last_clock = rec.header.clock;
  m.flags |= EntryMeta::kDirty;
}

// --- SparseTables ---

void SparseTables::SetKeyRanges(std::shared_ptr<const KeyRanges> ranges) {
  ranges_ = std::move(ranges);
}

Status SparseTables::ExportBuckets(uint32_t num_buckets,
                                   const std::vector<uint8_t>& chosen,
                                   uint64_t max_bytes,
                                   std::vector<std::string>* out,
                                   uint64_t* rows) {
  if (HasRoundSums()) {
    return Status::FailedPrecondition(
        "sparse rows of a BSP round are not applied yet: not drained");
  }
  out->assign(tables_.size(), std::string());
  *rows = 0;
  uint64_t bytes = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    SparseTable& table = *tables_[t];
    const uint64_t h = table.name_hash();
    auto pick = [&](uint64_t key) {
      return chosen[MulHigh(KeyHash(h, key), num_buckets)] != 0;
    };
    FlatIndex cached;
    std::string& frame = (*out)[t];
    *rows += table.ExportCached(pick, clock_, &frame, &cached);
    if (store_ != nullptr) {
      const size_t fpr = table.floats_per_row();
      Status s = store_->ScanSpace(
          table.space(),
          [&](std::string_view key, std::string_view value) -> Status {
            if (key.size() != 8) {
              return Status::Corruption("table '" + specs_[t].name +
                                        "': a stored key of " +
                                        std::to_string(key.size()) + " bytes");
            }
            const uint64_t k = DecodeKey(key.data());
            if (!pick(k) || cached.Find(k) != FlatIndex::kNone)
              return Status::OK();
            RecordView rec;
            RETURN_IF_ERROR(ParseRecord(value, specs_[t].dim, fpr, &rec)
                                .WithContext("table '" + specs_[t].name + "'"));
            if (table.Expired(rec.header.clock, clock_)) return Status::OK();
            if (bytes + frame.size() + kMoveRecordHeadBytes + value.size() >
                max_bytes) {
              return Status::ResourceExhausted("stop");
            }
            AppendMoveRecord(&frame, key, value, std::string_view());
            ++*rows;
            return Status::OK();
          });
      if (s.code() == StatusCode::kResourceExhausted) {
        out->clear();
        return Status::ResourceExhausted(
            "the rows of these buckets come to more than " +
            std::to_string(max_bytes) + " bytes: ask for fewer buckets");
      }
      RETURN_IF_ERROR(s);
    }
    bytes += frame.size();
    if (bytes > max_bytes) {
      out->clear();
      return Status::ResourceExhausted(
          "the rows of these buckets come to more than " +
          std::to_string(max_bytes) + " bytes: ask for fewer buckets");
    }
  }
  return Status::OK();
}

Status SparseTables::StageImport(uint32_t num_buckets,
                                 const std::vector<uint8_t>& chosen,
                                 const std::vector<std::string_view>& frames,
                                 uint64_t* rows) {
  if (frames.size() != tables_.size()) {
    return Status::InvalidArgument("rows of " + std::to_string(frames.size()) +
                                   " tables for " +
                                   std::to_string(tables_.size()) + " tables");
  }
  // A resend names buckets whose rows are staged already (the coordinator's
  // retry, or its first try handed on to a backup that is now the primary):
  // their staged records are replaced, as a resent chunk is
  // (server/migrate/migration.cc). The others' records stay.
  bool resent = false;
  for (size_t t = 0; t < tables_.size() && !resent; ++t) {
    ForEachMoveRecord(staged_[t], [&](uint64_t key, std::string_view) {
      resent =
          resent ||
          chosen[MulHigh(KeyHash(tables_[t]->name_hash(), key), num_buckets)];
    });
  }
  std::vector<std::string> kept;
  FlatIndex kept_keys;
  if (resent) {
    kept.resize(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t) {
      const std::string_view f = staged_[t];
      ForEachMoveRecord(f, [&](uint64_t key, std::string_view value) {
        if (chosen[MulHigh(KeyHash(tables_[t]->name_hash(), key), num_buckets)])
          return;
        const size_t at =
            static_cast<size_t>(value.data() - f.data()) - kMoveRecordHeadBytes;
        kept[t].append(f.substr(at, kMoveRecordHeadBytes + value.size()));
        kept_keys.Insert(Salted(key, t), 0);
      });
    }
  }
  const FlatIndex& staged_keys = resent ? kept_keys : staged_keys_;
  // Everything checked before anything is kept.
  *rows = 0;
  FlatIndex seen;
  for (size_t t = 0; t < frames.size(); ++t) {
    const SparseTable& table = *tables_[t];
    const std::string where = "import of table '" + specs_[t].name + "'";
    std::string_view f = frames[t];
    size_t at = 0;
    while (at < f.size()) {
      uint32_t size = 0;
      if (f.size() - at < kMoveRecordHeadBytes) {
        return Status::InvalidArgument(where + ": a record cut short at byte " +
                                       std::to_string(at));
      }
      std::memcpy(&size, f.data() + at + 8, sizeof(size));
      if (size > f.size() - at - kMoveRecordHeadBytes) {
        return Status::InvalidArgument(where + ": a record of " +
                                       std::to_string(size) +
                                       " bytes runs past the frame");
      }
      const uint64_t key = DecodeKey(f.data() + at);
      RecordView rec;
      Status p = ParseRecord(f.substr(at + kMoveRecordHeadBytes, size),
                             specs_[t].dim, table.floats_per_row(), &rec);
      if (!p.ok()) {
        return Status::InvalidArgument(where + ", key " + std::to_string(key) +
                                       ": " + p.message());
      }
      if (!chosen[MulHigh(KeyHash(table.name_hash(), key), num_buckets)]) {
        return Status::InvalidArgument(where + ": key " + std::to_string(key) +
                                       " is not in a bucket of the import");
      }
      const uint64_t salted = Salted(key, t);
      if (seen.Find(salted) != FlatIndex::kNone ||
          staged_keys.Find(salted) != FlatIndex::kNone) {
        return Status::InvalidArgument(where + ": key " + std::to_string(key) +
                                       " twice");
      }
      seen.Insert(salted, 0);
      at += kMoveRecordHeadBytes + size;
      ++*rows;
    }
  }
  if (resent) {
    staged_ = std::move(kept);
    staged_keys_ = std::move(kept_keys);
  }
  for (size_t t = 0; t < frames.size(); ++t)
    staged_[t].append(frames[t].data(), frames[t].size());
  for (size_t t = 0; t < frames.size(); ++t) {
    ForEachMoveRecord(frames[t], [&](uint64_t key, std::string_view) {
      staged_keys_.Insert(Salted(key, t), 0);
    });
  }
  return Status::OK();
}

uint64_t SparseTables::MoveBytesEstimate() const {
  uint64_t bytes = 0;
  for (const auto& t : tables_) {
    uint64_t rows = t->cache_rows() + t->cache_counters();
    if (store_ != nullptr)
      rows = std::max<uint64_t>(
          rows, store_->GetSpaceStats(t->space()).estimated_keys);
    bytes += rows * (kMoveRecordHeadBytes + kRecordHeaderBytes +
                     t->floats_per_row() * sizeof(float));
  }
  return bytes;
}

uint64_t SparseTables::staged_bytes() const {
  uint64_t b = 0;
  for (const std::string& s : staged_) b += s.size();
  return b;
}

void SparseTables::DropStaged() {
  for (std::string& s : staged_) std::string().swap(s);
  staged_keys_ = FlatIndex();
}

Status SparseTables::InstallStaged() {
  std::unique_ptr<StoreBatch> batch =
      store_ != nullptr ? store_->NewBatch() : nullptr;
  Status first;
  for (size_t t = 0; t < tables_.size(); ++t) {
    ForEachMoveRecord(staged_[t], [&](uint64_t key, std::string_view value) {
      tables_[t]->Install(key, value, batch.get());
      if (batch && batch->bytes() >= options_.checkpoint_batch_bytes) {
        Status s = store_->Write({}, batch.get(), SyncMode::kNoSync,
                                 WriteKind::kPartial);
        batch->Clear();
        if (first.ok()) first = s.WithContext("writing moved rows");
      }
    });
  }
  if (batch && batch->count() > 0) {
    Status s =
        store_->Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kPartial);
    if (first.ok()) first = s.WithContext("writing moved rows");
  }
  if (!first.ok()) {
    // Nothing is lost: every record also enters the cache, dirty (the
    // newer copy wherever a write did land), for the next checkpoint.
    ++write_errors_;
    for (size_t t = 0; t < tables_.size(); ++t) {
      ForEachMoveRecord(staged_[t], [&](uint64_t key, std::string_view value) {
        tables_[t]->Install(key, value, nullptr);
      });
    }
  }
  DropStaged();
  return first;
}

Status SparseTables::DropBuckets(uint32_t num_buckets,
                                 const std::vector<uint8_t>& gone,
                                 uint64_t* rows) {
  *rows = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    SparseTable& table = *tables_[t];
    const uint64_t h = table.name_hash();
    auto pick = [&](uint64_t key) {
      return gone[MulHigh(KeyHash(h, key), num_buckets)] != 0;
    };
    table.DropCached(pick);
    if (store_ == nullptr) continue;
    // The scan may not write: keys first, deletes after.
    std::vector<uint64_t> keys;
    RETURN_IF_ERROR(store_->ScanSpace(
        table.space(), [&](std::string_view key, std::string_view) -> Status {
          if (key.size() == 8 && pick(DecodeKey(key.data())))
            keys.push_back(DecodeKey(key.data()));
          return Status::OK();
        }));
    std::unique_ptr<StoreBatch> batch = store_->NewBatch();
    for (size_t i = 0; i < keys.size(); ++i) {
      batch->Delete(table.space(), EncodeKey(keys[i]).view());
      if (batch->bytes() >= options_.checkpoint_batch_bytes ||
          i + 1 == keys.size()) {
        RETURN_IF_ERROR(
            store_
                ->Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kPartial)
                .WithContext("deleting rows moved away"));
        batch->Clear();
      }
    }
    *rows += keys.size();
  }
  return Status::OK();
}

}  // namespace asyncps::server::sparse
