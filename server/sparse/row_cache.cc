#include "server/sparse/row_cache.h"

namespace asyncps::server::sparse {

RowCache::RowCache(size_t floats_per_entry)
    : floats_per_entry_(floats_per_entry) {}

uint32_t RowCache::Insert(uint64_t key) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<uint32_t>(meta_.size());
    if (slot % kSlotsPerBlock == 0 && floats_per_entry_ > 0) {
      blocks_.emplace_back(new float[kSlotsPerBlock * floats_per_entry_]);
    }
    meta_.emplace_back();
  }
  EntryMeta& m = meta_[slot];
  m = EntryMeta{};
  m.key = key;
  m.flags = EntryMeta::kUsed | EntryMeta::kRef;
  index_.Insert(key, slot);
  return slot;
}

void RowCache::Remove(uint32_t slot) {
  EntryMeta& m = meta_[slot];
  index_.Erase(m.key);
  m.flags = 0;
  free_.push_back(slot);
}

uint32_t RowCache::NextVictim() {
  const size_t n = meta_.size();
  if (n == 0) return kNone;
  // Two sweeps clear every reference bit; a third finds nothing only when
  // every used entry is pinned.
  for (size_t step = 0; step < 3 * n; ++step) {
    if (hand_ >= n) hand_ = 0;
    const uint32_t s = hand_++;
    EntryMeta& m = meta_[s];
    if (!(m.flags & EntryMeta::kUsed) || (m.flags & EntryMeta::kUnevictable))
      continue;
    if (m.flags & EntryMeta::kRef) {
      m.flags &= ~EntryMeta::kRef;
      continue;
    }
    return s;
  }
  return kNone;
}

}  // namespace asyncps::server::sparse
