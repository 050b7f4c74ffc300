// Persistence of a shard's state: a small key/value interface (the test
// seam) with a RocksDB implementation (one DB per shard) and an in-memory
// one for tests.
//
// The shard decides what the keys and values are (server/internal/
// state_codec.h); a Store only guarantees that one Write() is atomic: after
// a crash either every entry of a Write is visible or none is.
//
// A value is written as `head` followed by `parts` (pointers into the
// caller's memory, e.g. chunk weights), so a checkpoint copies the tensor
// bytes once, into the store's own batch.
//
// Thread safety: a Store is used by one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
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

enum class SyncMode : uint8_t {
  kNoSync = 0,  // through the write-ahead log, no fsync: survives kill -9
  kSync = 1,    // fsync before returning: survives power loss
};

class Store {
 public:
  virtual ~Store() = default;

  // Writes all entries in one atomic batch (replacing existing keys).
  [[nodiscard]] virtual Status Write(const std::vector<StoreEntry>& entries,
                                     SyncMode sync) = 0;

  // Calls fn(key, value) for every key in key order; stops at the first
  // non-OK status fn returns and returns it.
  [[nodiscard]] virtual Status Scan(
      const std::function<Status(std::string_view key, std::string_view value)>&
          fn) = 0;
};

struct RocksDbStoreOptions {
  // Directory of the database; created if missing. Required.
  std::string path;
  // RocksDB write buffer size, bytes. Default: 64 MiB.
  size_t write_buffer_bytes = size_t{64} << 20;
};

// Opens (or creates) a RocksDB database at options.path. RocksDB errors are
// converted to Status here (IOError -> Unavailable, Corruption ->
// Corruption, others -> Internal).
StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(
    const RocksDbStoreOptions& options);

// A Store in memory. Tests keep the returned shared handle to "restart" a
// shard on the same contents. Writes after FailWrites(true) fail with
// Unavailable (fault injection).
class MemStore final : public Store {
 public:
  Status Write(const std::vector<StoreEntry>& entries, SyncMode sync) override;
  Status Scan(const std::function<Status(std::string_view, std::string_view)>&
                  fn) override;
  void FailWrites(bool fail) { fail_writes_ = fail; }
  size_t writes() const { return writes_; }

 private:
  std::vector<std::pair<std::string, std::string>> SortedCopy() const;
  std::vector<std::pair<std::string, std::string>>
      kv_;  // unsorted, unique keys
  bool fail_writes_ = false;
  size_t writes_ = 0;
};

}  // namespace asyncps::server
