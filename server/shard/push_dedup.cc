#include "server/internal/push_dedup.h"

#include <algorithm>

namespace asyncps::server::internal {

PushDedup::PushDedup(const Options& options)
    : options_(options), ranks_(std::max(0, options.num_workers)) {
  options_.max_applied = std::max<size_t>(1, options_.max_applied);
  options_.incarnations_per_rank =
      std::max<size_t>(1, options_.incarnations_per_rank);
}

const PushDedup::Entry* PushDedup::Find(int rank, uint64_t incarnation) const {
  for (const Entry& e : ranks_[rank]) {
    if (e.incarnation == incarnation) return &e;
  }
  return nullptr;
}

PushDedup::Entry& PushDedup::Touch(int rank, uint64_t incarnation) {
  std::vector<Entry>& v = ranks_[rank];
  auto it = std::find_if(v.begin(), v.end(), [&](const Entry& e) {
    return e.incarnation == incarnation;
  });
  if (it != v.end()) {
    if (it + 1 != v.end()) std::rotate(it, it + 1, v.end());
    return v.back();
  }
  if (v.size() >= options_.incarnations_per_rank) v.erase(v.begin());
  v.push_back(Entry{incarnation, 0, {}});
  return v.back();
}

void PushDedup::RaiseFloor(int rank, uint64_t incarnation,
                           uint64_t done_below) {
  if (done_below == 0) return;
  const Entry* found = Find(rank, incarnation);
  if (found != nullptr && found->floor >= done_below) return;
  Entry& e = Touch(rank, incarnation);
  e.floor = done_below;
  e.applied.erase(
      e.applied.begin(),
      std::lower_bound(e.applied.begin(), e.applied.end(), e.floor));
}

PushDedup::Verdict PushDedup::Check(int rank, uint64_t incarnation,
                                    uint64_t id) const {
  const Entry* e = Find(rank, incarnation);
  if (e == nullptr) return Verdict::kNew;
  if (id < e->floor) return Verdict::kLate;
  return std::binary_search(e->applied.begin(), e->applied.end(), id)
             ? Verdict::kDuplicate
             : Verdict::kNew;
}

void PushDedup::Record(int rank, uint64_t incarnation, uint64_t id) {
  Entry& e = Touch(rank, incarnation);
  if (id < e.floor) return;
  auto at = std::lower_bound(e.applied.begin(), e.applied.end(), id);
  if (at != e.applied.end() && *at == id) return;
  e.applied.insert(at, id);
  if (e.applied.size() > options_.max_applied) {
    // No floor from this client: its oldest applied id becomes the floor.
    e.floor = e.applied.front() + 1;
    e.applied.erase(e.applied.begin());
  }
}

void PushDedup::RestoreHighWaterMark(int rank, uint64_t incarnation,
                                     uint64_t last_id) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  Entry& e = Touch(rank, incarnation);
  e.floor = last_id + 1;
  e.applied.clear();
}

void PushDedup::Encode(std::string* out) const {
  uint32_t n = 0;
  for (const auto& v : ranks_) n += static_cast<uint32_t>(v.size());
  Put<uint32_t>(out, n);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (const Entry& e : ranks_[r]) {
      Put<int32_t>(out, static_cast<int32_t>(r));
      Put<uint64_t>(out, e.incarnation);
      Put<uint64_t>(out, e.floor);
      Put<uint32_t>(out, static_cast<uint32_t>(e.applied.size()));
      for (uint64_t id : e.applied) Put<uint64_t>(out, id);
    }
  }
}

bool PushDedup::Decode(Reader* r) {
  for (auto& v : ranks_) v.clear();
  uint32_t n = 0;
  if (!r->Get(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    int32_t rank = 0;
    Entry e;
    uint32_t k = 0;
    if (!r->Get(&rank) || !r->Get(&e.incarnation) || !r->Get(&e.floor) ||
        !r->Get(&k) || k > options_.max_applied ||
        static_cast<size_t>(k) * sizeof(uint64_t) > r->remaining()) {
      return false;
    }
    e.applied.resize(k);
    for (uint64_t& id : e.applied) (void)r->Get(&id);
    if (!std::is_sorted(e.applied.begin(), e.applied.end())) return false;
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) continue;
    std::vector<Entry>& v = ranks_[rank];
    if (v.size() >= options_.incarnations_per_rank) v.erase(v.begin());
    v.push_back(std::move(e));
  }
  return true;
}

void PushDedup::ForEach(
    const std::function<void(int, uint64_t, uint64_t,
                             const std::vector<uint64_t>&)>& fn) const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (const Entry& e : ranks_[r]) {
      fn(static_cast<int>(r), e.incarnation, e.floor, e.applied);
    }
  }
}

size_t PushDedup::MaxBytes() const {
  return ranks_.size() * options_.incarnations_per_rank *
         (sizeof(Entry) + options_.max_applied * sizeof(uint64_t));
}

size_t PushDedup::applied_ids() const {
  size_t n = 0;
  for (const auto& v : ranks_) {
    for (const Entry& e : v) n += e.applied.size();
  }
  return n;
}

}  // namespace asyncps::server::internal
