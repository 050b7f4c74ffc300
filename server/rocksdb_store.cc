// RocksDB implementation of Store. The only file of the server that sees
// RocksDB types; rocksdb::Status is converted to Status in FromRocks().
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <memory>

#include "server/store.h"

namespace asyncps::server {
namespace {

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

class RocksDbStore final : public Store {
 public:
  explicit RocksDbStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
  ~RocksDbStore() override {
    if (db_) (void)db_->Close();
  }

  Status Write(const std::vector<StoreEntry>& entries, SyncMode sync) override {
    rocksdb::WriteBatch batch;
    std::vector<rocksdb::Slice> slices;
    for (const StoreEntry& e : entries) {
      slices.clear();
      slices.emplace_back(e.head);
      for (const StorePart& p : e.parts) {
        slices.emplace_back(static_cast<const char*>(p.data), p.size);
      }
      rocksdb::Slice key(e.key);
      rocksdb::Status s = batch.Put(
          rocksdb::SliceParts(&key, 1),
          rocksdb::SliceParts(slices.data(), static_cast<int>(slices.size())));
      if (!s.ok()) return FromRocks(s, "rocksdb batch put");
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync == SyncMode::kSync;
    return FromRocks(db_->Write(wo, &batch), "rocksdb write");
  }

  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      RETURN_IF_ERROR(
          fn(std::string_view(it->key().data(), it->key().size()),
             std::string_view(it->value().data(), it->value().size())));
    }
    return FromRocks(it->status(), "rocksdb scan");
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(
    const RocksDbStoreOptions& options) {
  if (options.path.empty())
    return Status::InvalidArgument("RocksDB store needs a path");
  rocksdb::Options o;
  o.create_if_missing = true;
  o.write_buffer_size = options.write_buffer_bytes;
  o.max_open_files = 256;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options.path, &raw);
  if (!s.ok()) return FromRocks(s, "opening RocksDB at " + options.path);
  return std::unique_ptr<Store>(
      new RocksDbStore(std::unique_ptr<rocksdb::DB>(raw)));
}

}  // namespace asyncps::server
