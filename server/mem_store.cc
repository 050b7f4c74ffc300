#include <algorithm>

#include "server/store.h"

namespace asyncps::server {

Status MemStore::Write(const std::vector<StoreEntry>& entries,
                       SyncMode /*sync*/) {
  if (fail_writes_)
    return Status::Unavailable("MemStore: writes disabled by the test");
  for (const StoreEntry& e : entries) {
    std::string value = e.head;
    for (const StorePart& p : e.parts)
      value.append(static_cast<const char*>(p.data), p.size);
    auto it = std::find_if(kv_.begin(), kv_.end(),
                           [&](const auto& kv) { return kv.first == e.key; });
    if (it == kv_.end()) {
      kv_.emplace_back(e.key, std::move(value));
    } else {
      it->second = std::move(value);
    }
  }
  ++writes_;
  return Status::OK();
}

std::vector<std::pair<std::string, std::string>> MemStore::SortedCopy() const {
  auto copy = kv_;
  std::sort(copy.begin(), copy.end());
  return copy;
}

Status MemStore::Scan(
    const std::function<Status(std::string_view, std::string_view)>& fn) {
  for (const auto& [k, v] : SortedCopy()) RETURN_IF_ERROR(fn(k, v));
  return Status::OK();
}

}  // namespace asyncps::server
