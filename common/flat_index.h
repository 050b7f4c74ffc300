// FlatIndex: an open-addressing hash map from uint64 keys to uint32 slot
// numbers (the index of the shard's sparse-row cache, the client's key
// de-duplication), and KeySet, a set of keys for duplicate detection.
//
// Linear probing over a power-of-two array of (key, slot) pairs kept at most
// half full; erase shifts the following entries back (no tombstones), so
// lookups never slow down with churn. A lookup of a present key costs one
// multiply and, at load <= 0.5, about 1.5 probes of one cache line; there is
// no allocation per entry (unlike std::unordered_map's nodes).
//
// Memory: memory_bytes() = 16 bytes x capacity; the array doubles when an
// insert would pass half full and never shrinks below what was reached.
//
// Thread safety: none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace asyncps {

class FlatIndex {
 public:
  static constexpr uint32_t kNone = ~uint32_t{0};

  explicit FlatIndex(size_t initial_capacity = 16) { Rehash(initial_capacity); }

  // The slot of `key`, or kNone.
  uint32_t Find(uint64_t key) const {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.slot == kNone) return kNone;
      if (e.key == key) return e.slot;
    }
  }

  // Adds key -> slot. REQUIRES: key absent, slot != kNone.
  void Insert(uint64_t key, uint32_t slot) {
    if ((size_ + 1) * 2 > entries_.size()) Rehash(entries_.size() * 2);
    Place(key, slot);
    ++size_;
  }

  // Changes the slot of a present key. REQUIRES: key present.
  void Update(uint64_t key, uint32_t slot) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      if (entries_[i].key == key && entries_[i].slot != kNone) {
        entries_[i].slot = slot;
        return;
      }
    }
  }

  // Removes `key` if present; returns whether it was.
  bool Erase(uint64_t key) {
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (entries_[i].slot == kNone) return false;
      if (entries_[i].key == key) break;
    }
    // Backward-shift deletion: move later members of the probe run into the
    // hole when the hole lies on their way from their home slot.
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; entries_[j].slot != kNone;
         j = (j + 1) & mask_) {
      const size_t home = Home(entries_[j].key);
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        entries_[hole] = entries_[j];
        hole = j;
      }
    }
    entries_[hole].slot = kNone;
    --size_;
    return true;
  }

  void Clear() {
    for (Entry& e : entries_) e.slot = kNone;
    size_ = 0;
  }

  size_t size() const { return size_; }
  size_t capacity() const { return entries_.size(); }
  size_t memory_bytes() const { return entries_.size() * sizeof(Entry); }

 private:
  struct Entry {
    uint64_t key = 0;
    uint32_t slot = kNone;
  };

  size_t Home(uint64_t key) const {
    // Fibonacci hashing of a pre-mixed key: sequential and hashed keys both
    // spread over the whole array.
    const uint64_t h = (key ^ (key >> 29)) * 0x9e3779b97f4a7c15ULL;
    return static_cast<size_t>(h >> shift_);
  }

  void Place(uint64_t key, uint32_t slot) {
    size_t i = Home(key);
    while (entries_[i].slot != kNone) i = (i + 1) & mask_;
    entries_[i].key = key;
    entries_[i].slot = slot;
  }

  void Rehash(size_t capacity) {
    size_t cap = 16;
    while (cap < capacity) cap *= 2;
    std::vector<Entry> old;
    old.swap(entries_);
    entries_.assign(cap, Entry{});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    for (const Entry& e : old) {
      if (e.slot != kNone) Place(e.key, e.slot);
    }
  }

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// KeySet: which keys one request has named so far (duplicate detection).
// Clear() is O(1) (a generation number), so a set serves every request
// without re-zeroing; memory is 16 bytes x capacity, capacity >= 2 x the
// most keys inserted between two Clear()s.
class KeySet {
 public:
  void Clear() {
    if (++generation_ == 0) {  // wrapped: really clear once per 2^32
      for (Entry& e : entries_) e.generation = 0;
      generation_ = 1;
    }
    size_ = 0;
  }
  // Makes room for n more keys (call before inserting them).
  void Reserve(size_t n) {
    if ((size_ + n) * 2 <= entries_.size()) return;
    size_t cap = entries_.empty() ? 64 : entries_.size();
    while (cap < (size_ + n) * 2) cap *= 2;
    std::vector<Entry> old;
    old.swap(entries_);
    entries_.assign(cap, Entry{});
    mask_ = cap - 1;
    for (const Entry& e : old) {
      if (e.generation == generation_) Place(e.key);
    }
  }
  // Adds key; false when it is already in the set. REQUIRES: Reserve()d.
  bool Insert(uint64_t key) {
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.generation != generation_) break;
      if (e.key == key) return false;
    }
    entries_[i].key = key;
    entries_[i].generation = generation_;
    ++size_;
    return true;
  }
  size_t memory_bytes() const { return entries_.size() * sizeof(Entry); }

 private:
  struct Entry {
    uint64_t key = 0;
    uint32_t generation = 0;
  };
  size_t Home(uint64_t key) const {
    return static_cast<size_t>(((key ^ (key >> 29)) * 0x9e3779b97f4a7c15ULL) >>
                               7) &
           mask_;
  }
  void Place(uint64_t key) {
    size_t i = Home(key);
    while (entries_[i].generation == generation_) i = (i + 1) & mask_;
    entries_[i].key = key;
    entries_[i].generation = generation_;
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  uint32_t generation_ = 1;
  size_t size_ = 0;
};

}  // namespace asyncps
