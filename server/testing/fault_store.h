// FaultInjectionStore: a Store that forwards to another Store and fails
// writes on demand, so tests can inject store failures into a real RocksDB
// store (the leveldb way: wrap the environment). Test-only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/store/store.h"

namespace asyncps::server::testing {

class FaultInjectionStore final : public Store {
 public:
  // `base` is not owned and must outlive this store.
  explicit FaultInjectionStore(Store* base) : base_(base) {}

  // While set, every Write() fails with Unavailable and writes nothing
  // (reads and key spaces go through).
  void FailWrites(bool fail) { fail_ = fail; }
  size_t failed_writes() const { return failed_; }

  using Store::Write;
  Status Write(const std::vector<StoreEntry>& entries, StoreBatch* batch,
               SyncMode sync, WriteKind kind) override {
    if (fail_) {
      ++failed_;
      return Status::Unavailable("injected store failure");
    }
    return base_->Write(entries, batch, sync, kind);
  }
  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override {
    return base_->Scan(fn);
  }
  StatusOr<SpaceId> OpenSpace(const std::string& name) override {
    return base_->OpenSpace(name);
  }
  std::unique_ptr<StoreBatch> NewBatch() override { return base_->NewBatch(); }
  Status MultiGet(
      SpaceId space, const std::string_view* keys, size_t n,
      const std::function<void(size_t, std::string_view)>& found) override {
    return base_->MultiGet(space, keys, n, found);
  }
  Status ScanSpace(SpaceId space,
                   const std::function<Status(std::string_view,
                                              std::string_view)>& fn) override {
    return base_->ScanSpace(space, fn);
  }
  Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view, std::string_view)>& fn)
      override {
    return base_->ScanSpaceFrom(space, start, fn);
  }
  SpaceStats GetSpaceStats(SpaceId space) override {
    return base_->GetSpaceStats(space);
  }
  void SetSpaceExpiry(SpaceId space, size_t clock_offset,
                      int64_t keep_from) override {
    base_->SetSpaceExpiry(space, clock_offset, keep_from);
  }
  Status CompactSpace(SpaceId space) override {
    return base_->CompactSpace(space);
  }

 private:
  Store* base_;
  bool fail_ = false;
  size_t failed_ = 0;
};

}  // namespace asyncps::server::testing
