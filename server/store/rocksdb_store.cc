// RocksDB implementation of Store. The only file of the server that sees
// RocksDB types; rocksdb::Status is converted to Status in FromRocks().
//
// Key spaces are column families named "s/<name>", tuned for point lookups
// of fixed-size float records: a bloom filter per SST (whole keys; also in
// the memtable), partitioned index and filter blocks kept in a bounded block
// cache (so a table of 50 M rows does not pin its filters in memory), hash
// index inside data blocks, and no compression (random floats do not
// compress; compressing costs CPU on every read and write).
//
// Preserved cuts (see store.h): the mark is the key "partial" of the column
// family "asyncps.meta"; the preserved copy is a RocksDB checkpoint (hard
// links of the SST files, made after flushing the memtables) at
// `<path>.cut`, built at `<path>.cut.tmp` and renamed into place.
#include <glog/logging.h>
#include <rocksdb/cache.h>
#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <system_error>

#include "server/store/store.h"

namespace asyncps::server {
namespace {

namespace fs = std::filesystem;

constexpr char kMetaFamily[] = "asyncps.meta";
constexpr char kPartialKey[] = "partial";
constexpr char kSpacePrefix[] = "s/";

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsIOError() || s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) {
    return Status::Unavailable(msg);
  }
  if (s.IsCorruption()) return Status::Corruption(msg);
  if (s.IsNotFound()) return Status::NotFound(msg);
  if (s.IsInvalidArgument()) return Status::InvalidArgument(msg);
  if (s.IsNoSpace() || s.IsMemoryLimit()) return Status::ResourceExhausted(msg);
  return Status::Internal(msg);
}

rocksdb::Slice ToSlice(std::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

// Expiry of one key space: records whose int64 at `offset` is < keep_from
// are dropped by compaction.
struct Expiry {
  std::atomic<int64_t> keep_from{INT64_MIN};
  std::atomic<size_t> offset{0};
  std::atomic<uint64_t> dropped{0};
};

class ExpiryFilter final : public rocksdb::CompactionFilter {
 public:
  explicit ExpiryFilter(std::shared_ptr<Expiry> e) : e_(std::move(e)) {}
  bool Filter(int /*level*/, const rocksdb::Slice& /*key*/,
              const rocksdb::Slice& value, std::string* /*new_value*/,
              bool* /*value_changed*/) const override {
    const int64_t keep_from = e_->keep_from.load(std::memory_order_relaxed);
    const size_t off = e_->offset.load(std::memory_order_relaxed);
    if (keep_from == INT64_MIN || value.size() < off + sizeof(int64_t))
      return false;
    int64_t clock;
    std::memcpy(&clock, value.data() + off, sizeof(clock));
    if (clock >= keep_from) return false;
    e_->dropped.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const char* Name() const override { return "asyncps.ExpiryFilter"; }

 private:
  std::shared_ptr<Expiry> e_;
};

class ExpiryFilterFactory final : public rocksdb::CompactionFilterFactory {
 public:
  explicit ExpiryFilterFactory(std::shared_ptr<Expiry> e) : e_(std::move(e)) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context& /*context*/) override {
    return std::make_unique<ExpiryFilter>(e_);
  }
  const char* Name() const override { return "asyncps.ExpiryFilterFactory"; }

 private:
  std::shared_ptr<Expiry> e_;
};

class RocksBatch final : public StoreBatch {
 public:
  explicit RocksBatch(const std::vector<rocksdb::ColumnFamilyHandle*>* spaces)
      : spaces_(spaces) {}
  void Put(SpaceId space, std::string_view key, std::string_view head,
           std::string_view body) override {
    rocksdb::Slice k = ToSlice(key);
    rocksdb::Slice parts[2] = {ToSlice(head), ToSlice(body)};
    Check(batch_.Put((*spaces_)[space], rocksdb::SliceParts(&k, 1),
                     rocksdb::SliceParts(parts, 2)));
  }
  void Delete(SpaceId space, std::string_view key) override {
    Check(batch_.Delete((*spaces_)[space], ToSlice(key)));
  }
  void DeleteRange(SpaceId space, std::string_view begin,
                   std::string_view end) override {
    Check(batch_.DeleteRange((*spaces_)[space], ToSlice(begin), ToSlice(end)));
  }
  size_t count() const override { return batch_.Count(); }
  size_t bytes() const override { return batch_.GetDataSize(); }
  void Clear() override {
    batch_.Clear();
    error_ = rocksdb::Status::OK();
  }
  rocksdb::WriteBatch* batch() { return &batch_; }
  const rocksdb::Status& error() const { return error_; }

 private:
  void Check(const rocksdb::Status& s) {
    if (!s.ok() && error_.ok()) error_ = s;
  }
  const std::vector<rocksdb::ColumnFamilyHandle*>* spaces_;
  rocksdb::WriteBatch batch_;
  rocksdb::Status error_;
};

// A RocksDB snapshot; released when destroyed (before the store is).
class RocksSnapshot final : public StoreSnapshot {
 public:
  RocksSnapshot(rocksdb::DB* db,
                const std::vector<rocksdb::ColumnFamilyHandle*>* spaces,
                const rocksdb::Snapshot* snapshot)
      : db_(db), spaces_(spaces), snapshot_(snapshot) {}
  ~RocksSnapshot() override { db_->ReleaseSnapshot(snapshot_); }

  Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view, std::string_view)>& fn)
      const override {
    if (space >= spaces_->size())
      return Status::InvalidArgument("unknown key space");
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    ro.snapshot = snapshot_;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(ro, (*spaces_)[space]));
    for (it->Seek(ToSlice(start)); it->Valid(); it->Next()) {
      if (!fn(std::string_view(it->key().data(), it->key().size()),
              std::string_view(it->value().data(), it->value().size())))
        break;
    }
    return FromRocks(it->status(), "rocksdb scan of a key space's snapshot");
  }

 private:
  rocksdb::DB* const db_;
  const std::vector<rocksdb::ColumnFamilyHandle*>* const spaces_;
  const rocksdb::Snapshot* const snapshot_;
};

class RocksDbStore final : public Store {
 public:
  explicit RocksDbStore(const RocksDbStoreOptions& o) : options_(o) {}
  ~RocksDbStore() override { Close(); }

  // Opens the DB with every column family it has; rolls back to the
  // preserved cut when marked.
  Status Open() {
    RETURN_IF_ERROR(OpenDb());
    std::string v;
    rocksdb::Status s =
        db_->Get(rocksdb::ReadOptions(), meta_, kPartialKey, &v);
    if (s.IsNotFound()) return Status::OK();
    RETURN_IF_ERROR(FromRocks(s, "reading the cut mark"));
    // Records newer than the last cut were written and then the shard
    // stopped before its next checkpoint: restore the cut.
    const std::string cut = options_.path + ".cut";
    if (!fs::exists(cut)) {
      return Status::Corruption("store " + options_.path +
                                " holds records newer than its last "
                                "checkpoint and its preserved cut " +
                                cut + " is missing");
    }
    LOG(WARNING) << "store " << options_.path
                 << ": rolling back to the last checkpoint (" << cut << ")";
    Close();
    std::error_code ec;
    fs::remove_all(options_.path, ec);
    if (!ec) fs::rename(cut, options_.path, ec);
    if (ec) {
      return Status::Unavailable("restoring " + cut + ": " + ec.message());
    }
    RETURN_IF_ERROR(OpenDb());
    marked_ = false;
    s = db_->Get(rocksdb::ReadOptions(), meta_, kPartialKey, &v);
    if (!s.IsNotFound())
      return Status::Corruption("the preserved cut of " + options_.path +
                                " is itself marked partial");
    return Status::OK();
  }

  Status Write(const std::vector<StoreEntry>& entries, StoreBatch* batch,
               SyncMode sync, WriteKind kind) override {
    rocksdb::WriteBatch local;
    rocksdb::WriteBatch* wb = &local;
    if (batch != nullptr) {
      auto* rb = static_cast<RocksBatch*>(batch);
      RETURN_IF_ERROR(FromRocks(rb->error(), "rocksdb batch"));
      wb = rb->batch();
    }
    std::vector<rocksdb::Slice> slices;
    for (const StoreEntry& e : entries) {
      slices.clear();
      slices.emplace_back(e.head);
      for (const StorePart& p : e.parts) {
        slices.emplace_back(static_cast<const char*>(p.data), p.size);
      }
      rocksdb::Slice key(e.key);
      rocksdb::Status s = wb->Put(
          rocksdb::SliceParts(&key, 1),
          rocksdb::SliceParts(slices.data(), static_cast<int>(slices.size())));
      if (!s.ok()) return FromRocks(s, "rocksdb batch put");
    }
    const bool unmark = kind == WriteKind::kCut && marked_;
    if (kind == WriteKind::kPartial && !marked_) {
      RETURN_IF_ERROR(PreserveCut());
      RETURN_IF_ERROR(FromRocks(wb->Put(meta_, kPartialKey, "1"), "mark"));
    }
    if (unmark) {
      RETURN_IF_ERROR(FromRocks(wb->Delete(meta_, kPartialKey), "unmark"));
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync == SyncMode::kSync;
    rocksdb::Status s = db_->Write(wo, wb);
    if (batch == nullptr) local.Clear();
    RETURN_IF_ERROR(FromRocks(s, "rocksdb write"));
    if (kind == WriteKind::kPartial) marked_ = true;
    if (unmark) {
      marked_ = false;
      std::error_code ec;
      fs::remove_all(options_.path + ".cut", ec);
      if (ec) LOG(WARNING) << "removing the old cut: " << ec.message();
    }
    return Status::OK();
  }

  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), spaces_[kDefaultSpace]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      RETURN_IF_ERROR(
          fn(std::string_view(it->key().data(), it->key().size()),
             std::string_view(it->value().data(), it->value().size())));
    }
    return FromRocks(it->status(), "rocksdb scan");
  }

  StatusOr<SpaceId> OpenSpace(const std::string& name) override {
    if (name.empty() || name.size() > 200)
      return Status::InvalidArgument("space name must be 1-200 bytes");
    const std::string family = kSpacePrefix + name;
    for (size_t i = 1; i < spaces_.size(); ++i) {
      if (spaces_[i]->GetName() == family) return static_cast<SpaceId>(i);
    }
    rocksdb::ColumnFamilyHandle* h = nullptr;
    RETURN_IF_ERROR(
        FromRocks(db_->CreateColumnFamily(SpaceOptions(family), family, &h),
                  "creating key space " + name));
    spaces_.push_back(h);
    all_handles_.push_back(h);
    return static_cast<SpaceId>(spaces_.size() - 1);
  }

  std::unique_ptr<StoreBatch> NewBatch() override {
    return std::make_unique<RocksBatch>(&spaces_);
  }

  Status MultiGet(
      SpaceId space, const std::string_view* keys, size_t n,
      const std::function<void(size_t, std::string_view)>& found) override {
    if (space >= spaces_.size())
      return Status::InvalidArgument("unknown key space");
    if (n == 0) return Status::OK();
    if (slices_.size() < n) {
      slices_.resize(n);
      values_ = std::vector<rocksdb::PinnableSlice>(n);
      statuses_.resize(n);
    }
    for (size_t i = 0; i < n; ++i) slices_[i] = ToSlice(keys[i]);
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    db_->MultiGet(ro, spaces_[space], n, slices_.data(), values_.data(),
                  statuses_.data());
    Status first;
    for (size_t i = 0; i < n; ++i) {
      if (statuses_[i].ok()) {
        found(i, std::string_view(values_[i].data(), values_[i].size()));
      } else if (!statuses_[i].IsNotFound() && first.ok()) {
        first = FromRocks(statuses_[i], "rocksdb multiget");
      }
      values_[i].Reset();
    }
    return first;
  }

  Status ScanSpace(SpaceId space,
                   const std::function<Status(std::string_view,
                                              std::string_view)>& fn) override {
    if (space >= spaces_.size())
      return Status::InvalidArgument("unknown key space");
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, spaces_[space]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      RETURN_IF_ERROR(
          fn(std::string_view(it->key().data(), it->key().size()),
             std::string_view(it->value().data(), it->value().size())));
    }
    return FromRocks(it->status(), "rocksdb scan of a key space");
  }

  Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view, std::string_view)>& fn)
      override {
    if (space >= spaces_.size())
      return Status::InvalidArgument("unknown key space");
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, spaces_[space]));
    for (it->Seek(ToSlice(start)); it->Valid(); it->Next()) {
      if (!fn(std::string_view(it->key().data(), it->key().size()),
              std::string_view(it->value().data(), it->value().size())))
        break;
    }
    return FromRocks(it->status(), "rocksdb scan of a key space");
  }

  StatusOr<std::unique_ptr<StoreSnapshot>> NewSnapshot() override {
    return std::unique_ptr<StoreSnapshot>(
        new RocksSnapshot(db_.get(), &spaces_, db_->GetSnapshot()));
  }

  SpaceStats GetSpaceStats(SpaceId space) override {
    SpaceStats st;
    if (space >= spaces_.size()) return st;
    uint64_t v = 0;
    if (db_->GetIntProperty(spaces_[space], "rocksdb.total-sst-files-size", &v))
      st.disk_bytes += v;
    if (db_->GetIntProperty(spaces_[space], "rocksdb.size-all-mem-tables", &v))
      st.memtable_bytes = v;
    if (db_->GetIntProperty(spaces_[space], "rocksdb.estimate-num-keys", &v))
      st.estimated_keys = v;
    return st;
  }

  StoreStats GetStoreStats() override {
    StoreStats st;
    if (!db_) return st;
    if (stats_) {
      st.bytes_written = stats_->getTickerCount(rocksdb::BYTES_WRITTEN);
      st.keys_written = stats_->getTickerCount(rocksdb::NUMBER_KEYS_WRITTEN);
      st.wal_bytes = stats_->getTickerCount(rocksdb::WAL_FILE_BYTES);
      st.flush_bytes = stats_->getTickerCount(rocksdb::FLUSH_WRITE_BYTES);
      st.compaction_read_bytes =
          stats_->getTickerCount(rocksdb::COMPACT_READ_BYTES);
      st.compaction_write_bytes =
          stats_->getTickerCount(rocksdb::COMPACT_WRITE_BYTES);
      st.stall_micros = stats_->getTickerCount(rocksdb::STALL_MICROS);
      st.block_cache_hits = stats_->getTickerCount(rocksdb::BLOCK_CACHE_HIT);
      st.block_cache_misses = stats_->getTickerCount(rocksdb::BLOCK_CACHE_MISS);
    }
    uint64_t v = 0;
    for (rocksdb::ColumnFamilyHandle* h : all_handles_) {
      if (db_->GetIntProperty(h, "rocksdb.live-sst-files-size", &v))
        st.disk_bytes += v;
      if (db_->GetIntProperty(h, "rocksdb.size-all-mem-tables", &v))
        st.memtable_bytes += v;
      if (db_->GetIntProperty(h, "rocksdb.estimate-pending-compaction-bytes",
                              &v))
        st.pending_compaction_bytes += v;
    }
    if (db_->GetIntProperty("rocksdb.num-running-compactions", &v))
      st.running_compactions = v;
    if (block_cache_) st.block_cache_bytes = block_cache_->GetUsage();
    return st;
  }

  void SetSpaceExpiry(SpaceId space, size_t clock_offset,
                      int64_t keep_from) override {
    if (space == kDefaultSpace || space >= spaces_.size()) return;
    Expiry& e = *ExpiryOf(spaces_[space]->GetName());
    e.offset.store(clock_offset, std::memory_order_relaxed);
    e.keep_from.store(keep_from, std::memory_order_relaxed);
  }

  Status CompactSpace(SpaceId space) override {
    if (space >= spaces_.size()) return Status::InvalidArgument("no space");
    rocksdb::CompactRangeOptions o;
    o.bottommost_level_compaction =
        rocksdb::BottommostLevelCompaction::kForceOptimized;
    return FromRocks(db_->CompactRange(o, spaces_[space], nullptr, nullptr),
                     "compacting a key space");
  }

 private:
  std::shared_ptr<Expiry> ExpiryOf(const std::string& family) {
    std::shared_ptr<Expiry>& e = expiry_[family];
    if (!e) e = std::make_shared<Expiry>();
    return e;
  }

  rocksdb::ColumnFamilyOptions SpaceOptions(const std::string& family) {
    rocksdb::ColumnFamilyOptions cf;
    cf.compaction_filter_factory =
        std::make_shared<ExpiryFilterFactory>(ExpiryOf(family));
    cf.write_buffer_size = options_.write_buffer_bytes;
    cf.compression = rocksdb::kNoCompression;
    cf.bottommost_compression = rocksdb::kNoCompression;
    cf.level_compaction_dynamic_level_bytes = true;
    cf.memtable_whole_key_filtering = true;
    cf.memtable_prefix_bloom_size_ratio = 0.02;
    // The memtable stays RocksDB's skiplist: a hashed one (HashLinkList,
    // whole-key buckets) inserts faster on the shard's thread but must be
    // sorted when flushed, and on a busy machine writes then stop behind a
    // starved flush thread; write-backs arrive sorted by key instead.
    rocksdb::BlockBasedTableOptions t;
    t.block_cache = block_cache_;
    t.filter_policy.reset(
        rocksdb::NewBloomFilterPolicy(options_.bloom_bits_per_key));
    t.whole_key_filtering = true;
    t.cache_index_and_filter_blocks = true;
    t.cache_index_and_filter_blocks_with_high_priority = true;
    t.pin_top_level_index_and_filter = true;
    t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
    t.partition_filters = true;
    t.data_block_index_type =
        rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
    cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    return cf;
  }

  Status OpenDb() {
    if (!block_cache_)
      block_cache_ = rocksdb::NewLRUCache(options_.block_cache_bytes);
    rocksdb::DBOptions o;
    // Tickers only (no histograms or timers): a few relaxed atomic adds per
    // write, read by GetStoreStats() for the shard's metrics.
    if (!stats_) {
      stats_ = rocksdb::CreateDBStatistics();
      stats_->set_stats_level(rocksdb::StatsLevel::kExceptHistogramOrTimers);
    }
    o.statistics = stats_;
    o.create_if_missing = true;
    o.create_missing_column_families = true;
    o.max_open_files = 256;
    o.max_background_jobs = 2;
    o.bytes_per_sync = 1 << 20;
    std::vector<std::string> names;
    rocksdb::Status ls =
        rocksdb::DB::ListColumnFamilies(o, options_.path, &names);
    if (!ls.ok()) names = {rocksdb::kDefaultColumnFamilyName};
    if (std::find(names.begin(), names.end(), kMetaFamily) == names.end())
      names.push_back(kMetaFamily);
    std::vector<rocksdb::ColumnFamilyDescriptor> descs;
    rocksdb::ColumnFamilyOptions def;
    def.write_buffer_size = options_.write_buffer_bytes;
    for (const std::string& n : names) {
      descs.emplace_back(n, n.rfind(kSpacePrefix, 0) == 0
                                ? SpaceOptions(n)
                                : rocksdb::ColumnFamilyOptions(def));
    }
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    RETURN_IF_ERROR(
        FromRocks(rocksdb::DB::Open(o, options_.path, descs, &handles, &raw),
                  "opening RocksDB at " + options_.path));
    db_.reset(raw);
    spaces_.assign(1, nullptr);
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == rocksdb::kDefaultColumnFamilyName) {
        spaces_[0] = handles[i];
      } else if (names[i] == kMetaFamily) {
        meta_ = handles[i];
      } else {
        spaces_.push_back(handles[i]);
      }
      all_handles_.push_back(handles[i]);
    }
    return Status::OK();
  }

  void Close() {
    if (!db_) return;
    for (auto* h : all_handles_) (void)db_->DestroyColumnFamilyHandle(h);
    all_handles_.clear();
    spaces_.clear();
    meta_ = nullptr;
    (void)db_->Close();
    db_.reset();
  }

  Status ExportCheckpoint(const std::string& dir) override {
    rocksdb::Checkpoint* raw = nullptr;
    RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_.get(), &raw),
                              "exporting a checkpoint"));
    std::unique_ptr<rocksdb::Checkpoint> ck(raw);
    // No memtable flush (it would stall the shard's loop): the write-ahead
    // log is copied instead and replayed by whoever opens the copy.
    return FromRocks(
        ck->CreateCheckpoint(dir, /*log_size_for_flush=*/UINT64_MAX),
        "exporting a checkpoint to " + dir);
  }

  // Hard-links the current contents (a consistent cut) to <path>.cut.
  Status PreserveCut() {
    const std::string cut = options_.path + ".cut";
    const std::string tmp = cut + ".tmp";
    std::error_code ec;
    fs::remove_all(tmp, ec);
    rocksdb::Checkpoint* raw = nullptr;
    RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_.get(), &raw),
                              "preserving the cut"));
    std::unique_ptr<rocksdb::Checkpoint> ck(raw);
    RETURN_IF_ERROR(
        FromRocks(ck->CreateCheckpoint(tmp), "preserving the cut in " + tmp));
    fs::remove_all(cut, ec);
    if (!ec) fs::rename(tmp, cut, ec);
    if (ec) return Status::Unavailable("preserving the cut: " + ec.message());
    return Status::OK();
  }

  RocksDbStoreOptions options_;
  std::shared_ptr<rocksdb::Cache> block_cache_;
  std::shared_ptr<rocksdb::Statistics> stats_;
  std::map<std::string, std::shared_ptr<Expiry>> expiry_;  // by family
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> spaces_;  // [0] = default
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> all_handles_;
  bool marked_ = false;  // a partial write happened since the last cut
  // Reused by MultiGet.
  std::vector<rocksdb::Slice> slices_;
  std::vector<rocksdb::PinnableSlice> values_;
  std::vector<rocksdb::Status> statuses_;
};

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(
    const RocksDbStoreOptions& options) {
  if (options.path.empty())
    return Status::InvalidArgument("RocksDB store needs a path");
  if (options.bloom_bits_per_key < 0 || options.bloom_bits_per_key > 64)
    return Status::InvalidArgument("bloom_bits_per_key must be in [0, 64]");
  auto store = std::make_unique<RocksDbStore>(options);
  RETURN_IF_ERROR(store->Open());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace asyncps::server
