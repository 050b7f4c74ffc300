// RowCache: the in-memory tier of one sparse table on one shard: entries of
// a fixed number of floats (a row's weights and optimizer state, or none for
// an admission counter) addressed by key, with per-entry metadata and a
// CLOCK (second-chance) eviction order.
//
// Storage: entries live in slots of fixed-size blocks (4096 slots each, so
// growing never moves an entry and a pointer to an entry's floats stays
// valid until that entry is removed); a FlatIndex maps key -> slot; freed
// slots are reused before a new block is allocated. Nothing is allocated per
// entry.
//
// Eviction: NextVictim() advances the clock hand: an entry whose reference
// bit is set (it was used since the hand last passed) gets a second chance
// (the bit is cleared); pinned and held entries are skipped. The caller writes
// a dirty victim back before it calls Remove().
//
// Memory: bytes() counts live entries (floats + metadata) plus the index;
// allocated_bytes() what the blocks and the index hold (at most one block
// more than the peak of live entries).
//
// Thread safety: none (owned by one shard's event loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/flat_index.h"

namespace asyncps::server::sparse {

// Per-entry metadata.
struct EntryMeta {
  static constexpr uint8_t kUsed = 1;    // the slot holds an entry
  static constexpr uint8_t kDirty = 2;   // newer than the store's record
  static constexpr uint8_t kRef = 4;     // used since the clock hand passed
  static constexpr uint8_t kPinned = 8;  // not evictable (in a durable push)
  // Not evictable: read for the push (or BSP round) in progress, which is
  // applied only once every key it names is in the cache or known absent.
  static constexpr uint8_t kHeld = 16;
  static constexpr uint8_t kUnevictable = kPinned | kHeld;

  uint64_t key = 0;
  // Rows: optimizer steps applied. Admission counters: pushes counted.
  uint64_t count = 0;
  // Clock of the last push (expiry).
  int64_t last_clock = 0;
  uint8_t flags = 0;
};

class RowCache {
 public:
  static constexpr uint32_t kNone = FlatIndex::kNone;
  static constexpr size_t kSlotsPerBlock = 4096;

  // Entries of `floats_per_entry` floats (0: metadata only).
  explicit RowCache(size_t floats_per_entry);
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  // The slot of `key`, or kNone. Sets nothing.
  uint32_t Find(uint64_t key) const { return index_.Find(key); }

  // Adds `key` (REQUIRES: absent) with zeroed metadata (kUsed | kRef) and
  // uninitialised floats; returns its slot.
  uint32_t Insert(uint64_t key);

  // Removes the entry in `slot` (REQUIRES: used).
  void Remove(uint32_t slot);

  // The next entry to evict (clears reference bits on the way), or kNone
  // when every entry is pinned.
  uint32_t NextVictim();

  float* floats(uint32_t slot) {
    return blocks_[slot / kSlotsPerBlock].get() +
           (slot % kSlotsPerBlock) * floats_per_entry_;
  }
  EntryMeta& meta(uint32_t slot) { return meta_[slot]; }
  const EntryMeta& meta(uint32_t slot) const { return meta_[slot]; }

  // Calls fn(slot) for every used slot.
  template <typename F>
  void ForEach(F&& fn) {
    for (uint32_t s = 0; s < meta_.size(); ++s) {
      if (meta_[s].flags & EntryMeta::kUsed) fn(s);
    }
  }

  size_t entries() const { return index_.size(); }
  size_t floats_per_entry() const { return floats_per_entry_; }
  // Bytes of one entry (floats + metadata).
  size_t entry_bytes() const {
    return floats_per_entry_ * sizeof(float) + sizeof(EntryMeta);
  }
  size_t bytes() const {
    return entries() * entry_bytes() + index_.memory_bytes();
  }
  size_t allocated_bytes() const {
    return blocks_.size() * kSlotsPerBlock * floats_per_entry_ * sizeof(float) +
           meta_.capacity() * sizeof(EntryMeta) + index_.memory_bytes();
  }

 private:
  const size_t floats_per_entry_;
  FlatIndex index_;
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<EntryMeta> meta_;  // by slot
  std::vector<uint32_t> free_;   // free slots
  uint32_t hand_ = 0;            // clock hand
};

}  // namespace asyncps::server::sparse
