// FaultInjectionStore: a Store that forwards to another Store and fails
// writes on demand, so tests can inject store failures into a real RocksDB
// store (the leveldb way: wrap the environment). Test-only.
#pragma once

#include <string_view>
#include <vector>

#include "server/store.h"

namespace asyncps::server::testing {

class FaultInjectionStore final : public Store {
 public:
  // `base` is not owned and must outlive this store.
  explicit FaultInjectionStore(Store* base) : base_(base) {}

  // While set, every Write() fails with Unavailable and writes nothing.
  void FailWrites(bool fail) { fail_ = fail; }
  size_t failed_writes() const { return failed_; }

  Status Write(const std::vector<StoreEntry>& entries, SyncMode sync) override {
    if (fail_) {
      ++failed_;
      return Status::Unavailable("injected store failure");
    }
    return base_->Write(entries, sync);
  }
  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override {
    return base_->Scan(fn);
  }

 private:
  Store* base_;
  bool fail_ = false;
  size_t failed_ = 0;
};

}  // namespace asyncps::server::testing
