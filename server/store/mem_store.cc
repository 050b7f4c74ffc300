// MemStore: the in-memory Store of tests (same semantics as the RocksDB
// store, including key spaces and preserved cuts).
#include <algorithm>

#include "server/store/store.h"

namespace asyncps::server {
namespace {

class MemBatch final : public StoreBatch {
 public:
  struct Op {
    SpaceId space;
    std::string key;
    std::optional<std::string> value;  // nullopt: delete
    std::optional<std::string> end;    // a range delete of [key, end)
  };
  void Put(SpaceId space, std::string_view key, std::string_view head,
           std::string_view body) override {
    std::string v(head);
    v.append(body);
    bytes_ += key.size() + v.size();
    ops_.push_back({space, std::string(key), std::move(v), std::nullopt});
  }
  void Delete(SpaceId space, std::string_view key) override {
    bytes_ += key.size();
    ops_.push_back({space, std::string(key), std::nullopt, std::nullopt});
  }
  void DeleteRange(SpaceId space, std::string_view begin,
                   std::string_view end) override {
    bytes_ += begin.size() + end.size();
    ops_.push_back({space, std::string(begin), std::nullopt, std::string(end)});
  }
  size_t count() const override { return ops_.size(); }
  size_t bytes() const override { return bytes_; }
  void Clear() override {
    ops_.clear();
    bytes_ = 0;
  }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Op> ops_;
  size_t bytes_ = 0;
};

}  // namespace

Status MemStore::Write(const std::vector<StoreEntry>& entries,
                       StoreBatch* batch, SyncMode /*sync*/, WriteKind kind) {
  if (fail_writes_)
    return Status::Unavailable("MemStore: writes disabled by the test");
  if (kind == WriteKind::kPartial && !preserved_) preserved_ = kv_;
  for (const StoreEntry& e : entries) {
    std::string value = e.head;
    for (const StorePart& p : e.parts)
      value.append(static_cast<const char*>(p.data), p.size);
    kv_[{"", e.key}] = std::move(value);
  }
  if (batch != nullptr) {
    for (const MemBatch::Op& op : static_cast<MemBatch*>(batch)->ops()) {
      if (op.space >= spaces_.size())
        return Status::InvalidArgument("MemStore: unknown space");
      if (op.value) {
        kv_[{spaces_[op.space], op.key}] = *op.value;
      } else if (op.end) {
        const std::string& name = spaces_[op.space];
        if (op.key < *op.end) {
          kv_.erase(kv_.lower_bound({name, op.key}),
                    kv_.lower_bound({name, *op.end}));
        }
      } else {
        kv_.erase({spaces_[op.space], op.key});
      }
    }
  }
  if (kind == WriteKind::kCut) preserved_.reset();
  ++writes_;
  return Status::OK();
}

Status MemStore::Scan(
    const std::function<Status(std::string_view, std::string_view)>& fn) {
  Map copy;
  for (const auto& [k, v] : kv_) {
    if (k.first.empty()) copy.emplace(k, v);
  }
  for (const auto& [k, v] : copy) RETURN_IF_ERROR(fn(k.second, v));
  return Status::OK();
}

StatusOr<SpaceId> MemStore::OpenSpace(const std::string& name) {
  if (name.empty() || name.size() > 200)
    return Status::InvalidArgument("space name must be 1-200 bytes");
  auto it = std::find(spaces_.begin(), spaces_.end(), name);
  if (it != spaces_.end()) return static_cast<SpaceId>(it - spaces_.begin());
  spaces_.push_back(name);
  return static_cast<SpaceId>(spaces_.size() - 1);
}

std::unique_ptr<StoreBatch> MemStore::NewBatch() {
  return std::make_unique<MemBatch>();
}

Status MemStore::MultiGet(
    SpaceId space, const std::string_view* keys, size_t n,
    const std::function<void(size_t, std::string_view)>& found) {
  if (space >= spaces_.size())
    return Status::InvalidArgument("MemStore: unknown space");
  const bool fail = reads_left_ == 0;
  if (reads_left_ > 0) --reads_left_;
  for (size_t i = 0; i < (fail ? n / 2 : n); ++i) {
    auto it = kv_.find({spaces_[space], std::string(keys[i])});
    if (it != kv_.end()) found(i, it->second);
  }
  if (fail) return Status::Unavailable("injected read failure");
  return Status::OK();
}

Status MemStore::ScanSpace(
    SpaceId space,
    const std::function<Status(std::string_view, std::string_view)>& fn) {
  if (space >= spaces_.size())
    return Status::InvalidArgument("MemStore: unknown space");
  const std::string& name = spaces_[space];
  for (auto it = kv_.lower_bound({name, std::string()});
       it != kv_.end() && it->first.first == name; ++it) {
    RETURN_IF_ERROR(fn(it->first.second, it->second));
  }
  return Status::OK();
}

namespace {

using Map = std::map<std::pair<std::string, std::string>, std::string>;

// ScanSpaceFrom over the (space name, key) -> value map `kv`.
Status ScanMapFrom(
    const Map& kv, const std::vector<std::string>& spaces, SpaceId space,
    std::string_view start,
    const std::function<bool(std::string_view, std::string_view)>& fn) {
  if (space >= spaces.size())
    return Status::InvalidArgument("MemStore: unknown space");
  const std::string& name = spaces[space];
  for (auto it = kv.lower_bound({name, std::string(start)});
       it != kv.end() && it->first.first == name; ++it) {
    if (!fn(it->first.second, it->second)) break;
  }
  return Status::OK();
}

// A copy of a MemStore's contents.
class MemSnapshot final : public StoreSnapshot {
 public:
  MemSnapshot(Map kv, std::vector<std::string> spaces)
      : kv_(std::move(kv)), spaces_(std::move(spaces)) {}
  Status ScanSpaceFrom(
      SpaceId space, std::string_view start,
      const std::function<bool(std::string_view, std::string_view)>& fn)
      const override {
    return ScanMapFrom(kv_, spaces_, space, start, fn);
  }

 private:
  const Map kv_;
  const std::vector<std::string> spaces_;
};

}  // namespace

Status MemStore::ScanSpaceFrom(
    SpaceId space, std::string_view start,
    const std::function<bool(std::string_view, std::string_view)>& fn) {
  return ScanMapFrom(kv_, spaces_, space, start, fn);
}

StatusOr<std::unique_ptr<StoreSnapshot>> MemStore::NewSnapshot() {
  return std::unique_ptr<StoreSnapshot>(new MemSnapshot(kv_, spaces_));
}

SpaceStats MemStore::GetSpaceStats(SpaceId space) {
  SpaceStats s;
  if (space >= spaces_.size()) return s;
  for (const auto& [k, v] : kv_) {
    if (k.first != spaces_[space]) continue;
    ++s.estimated_keys;
    s.disk_bytes += k.second.size() + v.size();
  }
  return s;
}

void MemStore::Reopen() {
  if (preserved_) {
    kv_ = std::move(*preserved_);
    preserved_.reset();
  }
}

}  // namespace asyncps::server
