#include "server/sparse/sparse_table.h"

#include <algorithm>
#include <cstring>

#include "common/hash.h"
#include "server/sparse/row_format.h"

namespace asyncps::server::sparse {
namespace {

OptimizerOptions ToOptimizerOptions(const RowOptimizerOptions& o) {
  OptimizerOptions d;
  switch (o.kind) {
    case RowOptimizerKind::kSgd:
      d.kind = OptimizerKind::kSgd;
      break;
    case RowOptimizerKind::kAdaGrad:
      d.kind = OptimizerKind::kAdaGrad;
      break;
    case RowOptimizerKind::kAdam:
      d.kind = OptimizerKind::kAdam;
      break;
  }
  d.lr = o.lr;
  d.beta1 = o.beta1;
  d.beta2 = o.beta2;
  d.eps = o.eps;
  return d;
}

}  // namespace

StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(
    const TableSpec& spec, Store* store, SpaceId space) {
  RETURN_IF_ERROR(spec.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                   Optimizer::Create(ToOptimizerOptions(spec.optimizer)));
  return std::unique_ptr<SparseTable>(
      new SparseTable(spec, store, space, std::move(opt)));
}

SparseTable::SparseTable(const TableSpec& spec, Store* store, SpaceId space,
                         std::unique_ptr<Optimizer> optimizer)
    : spec_(spec),
      name_hash_(HashName(spec.name)),
      store_(store),
      space_(space),
      optimizer_(std::move(optimizer)),
      state_floats_(spec.dim * spec.optimizer.state_per_elem()),
      rows_(spec.dim + state_floats_) {
  if (spec.admit_after_pushes > 1) admission_ = std::make_unique<RowCache>(0);
  slot_.resize(kSliceKeys);
  counter_slot_.resize(kSliceKeys);
  miss_keys_.resize(kSliceKeys);
  miss_views_.resize(kSliceKeys);
  miss_index_.resize(kSliceKeys);
}

void SparseTable::LookupCached(uint64_t key, int64_t now, uint32_t* row,
                               uint32_t* counter) {
  *row = RowCache::kNone;
  *counter = RowCache::kNone;
  // A pinned or held entry belongs to the request in progress: never
  // expired.
  uint32_t s = rows_.Find(key);
  if (s != RowCache::kNone) {
    EntryMeta& m = rows_.meta(s);
    if (!Expired(m.last_clock, now) || (m.flags & EntryMeta::kUnevictable)) {
      m.flags |= EntryMeta::kRef;
      *row = s;
    } else {
      // The store's copy, if any, is older still: expired too.
      rows_.Remove(s);
      ++counters_stats_.expired;
    }
    return;
  }
  if (!admission_) return;
  s = admission_->Find(key);
  if (s == RowCache::kNone) return;
  EntryMeta& m = admission_->meta(s);
  if (!Expired(m.last_clock, now) || (m.flags & EntryMeta::kUnevictable)) {
    m.flags |= EntryMeta::kRef;
    *counter = s;
  } else {
    admission_->Remove(s);
    ++counters_stats_.expired;
  }
}

Status SparseTable::Resolve(const uint64_t* keys, size_t n, int64_t now,
                            bool read_store, float* direct_out) {
  size_t misses = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t row, counter;
    LookupCached(keys[i], now, &row, &counter);
    slot_[i] = row;
    counter_slot_[i] = counter;
    if (row == RowCache::kNone && counter == RowCache::kNone) {
      miss_keys_[misses] = EncodeKey(keys[i]);
      miss_views_[misses] = miss_keys_[misses].view();
      miss_index_[misses] = static_cast<uint32_t>(i);
      ++misses;
    }
  }
  if (!read_store) return Status::OK();  // held: counted when held
  counters_stats_.hits += n - misses;
  counters_stats_.misses += misses;
  if (misses == 0 || store_ == nullptr) return Status::OK();
  counters_stats_.store_reads += misses;
  Status bad;
  Status s = store_->MultiGet(
      space_, miss_views_.data(), misses,
      [&](size_t j, std::string_view value) {
        RecordView rec;
        Status p =
            ParseRecord(value, spec_.dim, rows_.floats_per_entry(), &rec);
        if (!p.ok()) {
          if (bad.ok()) bad = p.WithContext("table '" + spec_.name + "'");
          return;
        }
        ++counters_stats_.store_found;
        if (Expired(rec.header.clock, now)) {
          ++counters_stats_.expired;
          return;
        }
        const uint32_t i = miss_index_[j];
        if (direct_out != nullptr) {
          // A pull that does not keep its misses: the record's weights go
          // straight into the reply (one copy, as a plain MultiGet's).
          if (rec.is_row()) {
            std::memcpy(direct_out + size_t{i} * spec_.dim, rec.floats,
                        spec_.dim * sizeof(float));
            slot_[i] = kDirect;
          }
          return;  // a counter reads as absent
        }
        if (rec.is_row()) {
          const uint32_t slot = rows_.Insert(keys[i]);
          std::memcpy(rows_.floats(slot), rec.floats,
                      rows_.floats_per_entry() * sizeof(float));
          EntryMeta& m = rows_.meta(slot);
          m.count = rec.header.count;
          m.last_clock = rec.header.clock;
          slot_[i] = slot;
        } else if (admission_) {
          const uint32_t slot = admission_->Insert(keys[i]);
          EntryMeta& m = admission_->meta(slot);
          m.count = rec.header.count;
          m.last_clock = rec.header.clock;
          counter_slot_[i] = slot;
        }
        // A counter record in a table without admission (its definition
        // cannot change while records exist) reads as absent.
      });
  RETURN_IF_ERROR(s.WithContext("reading table '" + spec_.name + "'"));
  return bad;
}

Status SparseTable::ReadSlice(const uint64_t* keys, size_t n, int64_t now,
                              float* out, bool keep_misses) {
  RETURN_IF_ERROR(
      Resolve(keys, n, now, /*read_store=*/true, keep_misses ? nullptr : out));
  const uint32_t dim = spec_.dim;
  for (size_t i = 0; i < n; ++i) {
    float* dst = out + i * dim;
    if (slot_[i] == kDirect) continue;  // written by Resolve()
    if (slot_[i] != RowCache::kNone) {
      std::memcpy(dst, rows_.floats(slot_[i]), dim * sizeof(float));
    } else {
      InitializeRow(spec_, keys[i], dst);
    }
  }
  counters_stats_.rows_read += n;
  return Status::OK();
}

uint32_t SparseTable::CreateRow(uint64_t key) {
  const uint32_t slot = rows_.Insert(key);
  float* f = rows_.floats(slot);
  InitializeRow(spec_, key, f);
  std::fill(f + spec_.dim, f + spec_.dim + state_floats_, InitialState());
  ++counters_stats_.admitted;
  return slot;
}

float SparseTable::InitialState() const {
  return spec_.optimizer.kind == RowOptimizerKind::kAdaGrad
             ? spec_.optimizer.initial_accumulator
             : 0.0f;
}

Status SparseTable::ReadRecordSlice(const uint64_t* keys, size_t n, int64_t now,
                                    uint8_t* out) {
  RETURN_IF_ERROR(Resolve(keys, n, now));
  const uint32_t dim = spec_.dim;
  const size_t floats = rows_.floats_per_entry();
  std::vector<float>& fresh = record_scratch_;
  fresh.resize(floats);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* rec = out + i * record_bytes();
    uint64_t steps = 0;
    const float* f = fresh.data();
    if (slot_[i] != RowCache::kNone) {
      steps = rows_.meta(slot_[i]).count;
      f = rows_.floats(slot_[i]);
    } else {
      InitializeRow(spec_, keys[i], fresh.data());
      std::fill(fresh.begin() + dim, fresh.end(), InitialState());
    }
    std::memcpy(rec, &steps, sizeof(steps));
    std::memcpy(rec + sizeof(steps), f, floats * sizeof(float));
  }
  counters_stats_.rows_read += n;
  return Status::OK();
}

Status SparseTable::HoldSlice(const uint64_t* keys, size_t n, int64_t now,
                              std::vector<uint32_t>* held,
                              std::vector<uint32_t>* held_counters,
                              uint32_t* rows, uint32_t* counters) {
  RETURN_IF_ERROR(Resolve(keys, n, now));
  std::memcpy(rows, slot_.data(), n * sizeof(uint32_t));
  std::memcpy(counters, counter_slot_.data(), n * sizeof(uint32_t));
  for (size_t i = 0; i < n; ++i) {
    if (slot_[i] != RowCache::kNone) {
      EntryMeta& m = rows_.meta(slot_[i]);
      if (!(m.flags & EntryMeta::kHeld)) held->push_back(slot_[i]);
      m.flags |= EntryMeta::kHeld;
    }
    if (counter_slot_[i] != RowCache::kNone) {
      EntryMeta& m = admission_->meta(counter_slot_[i]);
      if (!(m.flags & EntryMeta::kHeld))
        held_counters->push_back(counter_slot_[i]);
      m.flags |= EntryMeta::kHeld;
    }
  }
  return Status::OK();
}

void SparseTable::Unhold(bool counter, uint32_t slot) {
  EntryMeta& m = (counter ? *admission_ : rows_).meta(slot);
  if (m.flags & EntryMeta::kUsed) m.flags &= ~EntryMeta::kHeld;
}

Status SparseTable::ApplySlice(const uint64_t* keys, const float* grads,
                               size_t n, int64_t clock, int64_t now,
                               float lr_scale, bool pin, bool held,
                               const uint32_t* held_rows,
                               const uint32_t* held_counters,
                               std::vector<uint32_t>* touched,
                               std::vector<uint32_t>* touched_counters) {
  if (held && held_rows != nullptr && held_counters != nullptr) {
    std::memcpy(slot_.data(), held_rows, n * sizeof(uint32_t));
    std::memcpy(counter_slot_.data(), held_counters, n * sizeof(uint32_t));
  } else {
    RETURN_IF_ERROR(Resolve(keys, n, now, /*read_store=*/!held));
  }
  const uint32_t dim = spec_.dim;
  const uint8_t mark = EntryMeta::kDirty | (pin ? EntryMeta::kPinned : 0);
  const uint32_t admit = spec_.admit_after_pushes;
  for (size_t i = 0; i < n; ++i) {
    uint32_t slot = slot_[i];
    if (slot == RowCache::kNone) {
      if (admit > 1) {
        uint32_t c = counter_slot_[i];
        const uint64_t pushes =
            (c == RowCache::kNone ? 0 : admission_->meta(c).count) + 1;
        if (pushes < admit) {
          if (c == RowCache::kNone) c = admission_->Insert(keys[i]);
          EntryMeta& m = admission_->meta(c);
          const bool was_pinned = m.flags & EntryMeta::kPinned;
          m.count = pushes;
          m.last_clock = clock;
          m.flags |= mark;
          if (pin && !was_pinned) touched_counters->push_back(c);
          ++counters_stats_.counted;
          continue;
        }
        // The N-th push: the row replaces the counter (same key, so its
        // record overwrites the counter's in the store).
        if (c != RowCache::kNone) DropCounter(c, touched_counters);
      }
      slot = CreateRow(keys[i]);
    }
    float* w = rows_.floats(slot);
    EntryMeta& m = rows_.meta(slot);
    ++m.count;
    optimizer_->Apply(w, w + dim, grads + i * dim, dim, lr_scale, m.count);
    m.last_clock = clock;
    const bool was_pinned = m.flags & EntryMeta::kPinned;
    m.flags |= mark;
    if (pin && !was_pinned) touched->push_back(slot);
  }
  counters_stats_.rows_pushed += n;
  return Status::OK();
}

void SparseTable::DropCounter(uint32_t c,
                              std::vector<uint32_t>* touched_counters) {
  if (admission_->meta(c).flags & EntryMeta::kPinned) {
    // Counted earlier in this durable request; drop it from the list.
    for (uint32_t& t : *touched_counters) {
      if (t == c) t = RowCache::kNone;
    }
  }
  admission_->Remove(c);
}

Status SparseTable::AssignSlice(const uint64_t* keys, const float* values,
                                size_t n, int64_t clock, int64_t now, bool pin,
                                std::vector<uint32_t>* touched,
                                std::vector<uint32_t>* touched_counters,
                                const float* state, const uint64_t* steps,
                                const uint32_t* kinds, const int64_t* clocks) {
  RETURN_IF_ERROR(Resolve(keys, n, now, /*read_store=*/true));
  const uint32_t dim = spec_.dim;
  const size_t per = rows_.floats_per_entry();
  const uint8_t mark = EntryMeta::kDirty | (pin ? EntryMeta::kPinned : 0);
  for (size_t i = 0; i < n; ++i) {
    uint32_t slot = slot_[i];
    if (kinds != nullptr && kinds[i] == kSavedCounter && admission_) {
      // A counter replaces a row of the key (same store key: its record
      // overwrites the row's).
      if (slot != RowCache::kNone) {
        if (rows_.meta(slot).flags & EntryMeta::kPinned) {
          for (uint32_t& t : *touched) {
            if (t == slot) t = RowCache::kNone;
          }
        }
        rows_.Remove(slot);
      }
      uint32_t c = counter_slot_[i];
      if (c == RowCache::kNone) c = admission_->Insert(keys[i]);
      EntryMeta& m = admission_->meta(c);
      const bool was_pinned = m.flags & EntryMeta::kPinned;
      m.count = steps[i];
      m.last_clock = clocks[i];
      m.flags |= mark;
      if (pin && !was_pinned) touched_counters->push_back(c);
      continue;
    }
    if (slot == RowCache::kNone) {
      // The row replaces an admission counter, as on the admitting push.
      const uint32_t c = counter_slot_[i];
      if (admission_ && c != RowCache::kNone) DropCounter(c, touched_counters);
      slot = CreateRow(keys[i]);
    }
    float* w = rows_.floats(slot);
    std::memcpy(w, values + i * dim, dim * sizeof(float));
    if (state != nullptr) {
      std::memcpy(w + dim, state + i * state_floats_,
                  state_floats_ * sizeof(float));
    } else {
      std::fill(w + dim, w + per, 0.0f);
    }
    EntryMeta& m = rows_.meta(slot);
    m.count = steps != nullptr ? steps[i] : 0;
    m.last_clock = clocks != nullptr ? clocks[i] : clock;
    const bool was_pinned = m.flags & EntryMeta::kPinned;
    m.flags |= mark;
    if (pin && !was_pinned) touched->push_back(slot);
  }
  return Status::OK();
}

Status SparseTable::ScanPage(uint64_t from, size_t max, int64_t now,
                             const std::function<bool(uint64_t)>& owned,
                             uint64_t* keys, uint8_t* out, size_t* n,
                             const StoreSnapshot* snapshot) {
  *n = 0;
  if (max == 0) return Status::OK();
  // Live entries of the cache (they are newer than the store's records of
  // their keys), the smallest `max` keys >= from: a max-heap by key of at
  // most `max` entries (scan_scratch_bytes(max)), whatever the cache holds.
  std::vector<ScanCached> cached;
  cached.reserve(std::min(
      max, rows_.entries() + (admission_ ? admission_->entries() : 0)));
  auto by_key = [](const ScanCached& a, const ScanCached& b) {
    return a.key < b.key;
  };
  auto collect = [&](RowCache& cache, bool counter) {
    cache.ForEach([&](uint32_t s) {
      const EntryMeta& m = cache.meta(s);
      if (m.key < from || !owned(m.key)) return;
      if (Expired(m.last_clock, now) && !(m.flags & EntryMeta::kUnevictable))
        return;
      if (cached.size() == max) {
        if (m.key >= cached.front().key) return;
        std::pop_heap(cached.begin(), cached.end(), by_key);
        cached.pop_back();
      }
      cached.push_back(ScanCached{m.key, s, counter});
      std::push_heap(cached.begin(), cached.end(), by_key);
    });
  };
  if (snapshot == nullptr) {
    collect(rows_, false);
    if (admission_) collect(*admission_, true);
  }
  std::sort_heap(cached.begin(), cached.end(), by_key);
  // Merged with the store's live records of keys not cached, in key order,
  // each written straight into `out` (nothing copied in between).
  const size_t floats = rows_.floats_per_entry();
  const size_t bytes = saved_record_bytes();
  auto emit = [&](uint64_t key, uint32_t kind, uint64_t count, int64_t clock,
                  const void* row) {
    uint8_t* rec = out + *n * bytes;
    std::memset(rec, 0, bytes);
    std::memcpy(rec, &kind, sizeof(kind));
    std::memcpy(rec + 8, &count, sizeof(count));
    std::memcpy(rec + 16, &clock, sizeof(clock));
    if (row != nullptr)
      std::memcpy(rec + kSavedHeaderBytes, row, floats * sizeof(float));
    keys[(*n)++] = key;
  };
  size_t a = 0;
  auto emit_cached_below = [&](uint64_t key, bool all) {
    while (*n < max && a < cached.size() && (all || cached[a].key < key)) {
      const ScanCached& e = cached[a++];
      const EntryMeta& m = (e.counter ? *admission_ : rows_).meta(e.slot);
      emit(e.key, e.counter ? kSavedCounter : kSavedRow, m.count, m.last_clock,
           e.counter ? nullptr : rows_.floats(e.slot));
    }
  };
  if (store_ != nullptr) {
    Status bad;
    const EncodedKey start = EncodeKey(from);
    auto each = [&](std::string_view k, std::string_view v) {
      if (k.size() != 8) {
        bad =
            Status::Corruption("table '" + spec_.name + "': a stored key of " +
                               std::to_string(k.size()) + " bytes");
        return false;
      }
      uint64_t key = 0;
      for (int i = 0; i < 8; ++i) key = (key << 8) | static_cast<uint8_t>(k[i]);
      emit_cached_below(key, false);
      if (*n == max) return false;
      if (!owned(key)) return true;
      if (snapshot == nullptr &&
          (rows_.Find(key) != RowCache::kNone ||
           (admission_ && admission_->Find(key) != RowCache::kNone)))
        return true;
      RecordView rec;
      Status p = ParseRecord(v, spec_.dim, floats, &rec);
      if (!p.ok()) {
        bad = p.WithContext("table '" + spec_.name + "'");
        return false;
      }
      if (Expired(rec.header.clock, now) || (!rec.is_row() && !admission_))
        return true;
      emit(key, rec.is_row() ? kSavedRow : kSavedCounter, rec.header.count,
           rec.header.clock, rec.is_row() ? rec.floats : nullptr);
      return *n < max;
    };
    RETURN_IF_ERROR(snapshot != nullptr
                        ? snapshot->ScanSpaceFrom(space_, start.view(), each)
                        : store_->ScanSpaceFrom(space_, start.view(), each));
    RETURN_IF_ERROR(bad);
  }
  emit_cached_below(0, true);
  return Status::OK();
}

RecordHeader SparseTable::RecordOf(bool counter, uint32_t slot,
                                   std::string_view* body) {
  RowCache& cache = counter ? *admission_ : rows_;
  const EntryMeta& m = cache.meta(slot);
  RecordHeader h;
  h.magic = counter ? kCounterMagic : kRowMagic;
  h.dim = spec_.dim;
  h.count = m.count;
  h.clock = m.last_clock;
  *body = std::string_view();
  if (!counter) {
    *body = std::string_view(reinterpret_cast<const char*>(rows_.floats(slot)),
                             rows_.floats_per_entry() * sizeof(float));
  }
  return h;
}

void SparseTable::AddRecord(bool counter, uint32_t slot, StoreBatch* batch) {
  std::string_view body;
  const RecordHeader h = RecordOf(counter, slot, &body);
  const EncodedKey k =
      EncodeKey((counter ? *admission_ : rows_).meta(slot).key);
  batch->Put(space_, k.view(), HeaderBytes(h), body);
  ++counters_stats_.store_writes;
}

void SparseTable::Release(bool counter, uint32_t slot, bool clean) {
  EntryMeta& m = (counter ? *admission_ : rows_).meta(slot);
  m.flags &= ~EntryMeta::kPinned;
  if (clean) m.flags &= ~EntryMeta::kDirty;
}

void SparseTable::SortByKey(bool counter, std::vector<uint32_t>* slots) const {
  slots->erase(std::remove(slots->begin(), slots->end(), RowCache::kNone),
               slots->end());
  if (slots->empty()) return;
  const RowCache& cache = counter ? *admission_ : rows_;
  std::sort(slots->begin(), slots->end(), [&](uint32_t a, uint32_t b) {
    return cache.meta(a).key < cache.meta(b).key;
  });
}

void SparseTable::AddRecords(bool counter, std::vector<uint32_t>* slots,
                             StoreBatch* batch) {
  SortByKey(counter, slots);
  for (uint32_t s : *slots) AddRecord(counter, s, batch);
}

size_t SparseTable::Evict(size_t max, StoreBatch* batch) {
  // Admission counters go first when they take more memory than rows.
  RowCache* order[2] = {&rows_, admission_.get()};
  if (admission_ && admission_->bytes() > rows_.bytes())
    std::swap(order[0], order[1]);
  const bool can_write = store_ != nullptr && batch != nullptr;
  size_t evicted = 0;
  for (RowCache* cache : order) {
    if (cache == nullptr || evicted >= max) continue;
    const bool counter = cache == admission_.get();
    std::vector<uint32_t>& victims = victims_[counter ? 1 : 0];
    victims.clear();
    dirty_.clear();
    // Victims are pinned while collected, so the hand passes them by.
    while (evicted + victims.size() < max) {
      const uint32_t v = cache->NextVictim();
      if (v == RowCache::kNone) break;
      EntryMeta& m = cache->meta(v);
      if ((m.flags & EntryMeta::kDirty) && !can_write) {
        m.flags |= EntryMeta::kRef;  // nowhere to write it: keep it
        break;
      }
      m.flags |= EntryMeta::kPinned;
      victims.push_back(v);
      if (m.flags & EntryMeta::kDirty) dirty_.push_back(v);
    }
    counters_stats_.write_backs += dirty_.size();
    if (!dirty_.empty()) AddRecords(counter, &dirty_, batch);
    // Dirty victims leave once their records are written (EndEvict).
    for (uint32_t v : victims) {
      if (cache->meta(v).flags & EntryMeta::kDirty) {
        evicting_[counter ? 1 : 0].push_back(v);
      } else {
        cache->Remove(v);
      }
    }
    evicted += victims.size();
  }
  counters_stats_.evictions += evicted;
  return evicted;
}

void SparseTable::EndEvict(bool written) {
  for (int c = 0; c < 2; ++c) {
    RowCache* cache = c == 0 ? &rows_ : admission_.get();
    for (uint32_t v : evicting_[c]) {
      if (written) {
        cache->Remove(v);
      } else {
        Release(c == 1, v, /*clean=*/false);
        --counters_stats_.evictions;
      }
    }
    evicting_[c].clear();
  }
}

size_t SparseTable::CountUncached(const uint64_t* keys, size_t n) const {
  size_t missing = 0;
  for (size_t i = 0; i < n; ++i)
    missing += rows_.Find(keys[i]) == RowCache::kNone;
  return missing;
}

size_t SparseTable::evicting_bytes() const {
  size_t b = evicting_[0].size() * rows_.entry_bytes();
  if (admission_) b += evicting_[1].size() * admission_->entry_bytes();
  return b;
}

void SparseTable::MarkAllClean() {
  rows_.ForEach([this](uint32_t s) {
    rows_.meta(s).flags &= ~(EntryMeta::kDirty | EntryMeta::kPinned);
  });
  if (admission_) {
    admission_->ForEach([this](uint32_t s) {
      admission_->meta(s).flags &= ~(EntryMeta::kDirty | EntryMeta::kPinned);
    });
  }
}

void SparseTable::DropCache() {
  rows_.ForEach([this](uint32_t s) { rows_.Remove(s); });
  if (admission_)
    admission_->ForEach([this](uint32_t s) { admission_->Remove(s); });
}

size_t SparseTable::cache_bytes() const {
  return rows_.bytes() + (admission_ ? admission_->bytes() : 0);
}

size_t SparseTable::cache_allocated_bytes() const {
  return rows_.allocated_bytes() +
         (admission_ ? admission_->allocated_bytes() : 0);
}

}  // namespace asyncps::server::sparse
