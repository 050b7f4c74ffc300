#include "server/shard/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace asyncps::server {

MemoryBudget::Charge::Charge(Charge&& o) noexcept
    : budget_(std::move(o.budget_)), bytes_(o.bytes_) {
  o.bytes_ = 0;
}

MemoryBudget::Charge& MemoryBudget::Charge::operator=(Charge&& o) noexcept {
  if (this != &o) {
    Reset();
    budget_ = std::move(o.budget_);
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

void MemoryBudget::Charge::ShrinkTo(uint64_t bytes) {
  if (budget_ == nullptr || bytes >= bytes_) return;
  budget_->Release(bytes_ - bytes);
  bytes_ = bytes;
}

void MemoryBudget::Charge::Reset() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Release(bytes_);
  bytes_ = 0;
  budget_.reset();
}

std::shared_ptr<MemoryBudget> MemoryBudget::Create(uint64_t capacity) {
  return std::shared_ptr<MemoryBudget>(
      new MemoryBudget(std::max<uint64_t>(1, capacity)));
}

bool MemoryBudget::Fits(uint64_t bytes) const {
  const uint64_t used = used_.load(std::memory_order_relaxed);
  return used <= capacity_ && bytes <= capacity_ - used;
}

StatusOr<MemoryBudget::Charge> MemoryBudget::Reserve(uint64_t bytes,
                                                     std::string_view what) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used > capacity_ || bytes > capacity_ - used) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return Status::ResourceExhausted(
          std::string(what) + " needs " + std::to_string(bytes) +
          " bytes: the shard's memory budget of " + std::to_string(capacity_) +
          " bytes has " + std::to_string(used) + " in use");
    }
  } while (!used_.compare_exchange_weak(used, used + bytes,
                                        std::memory_order_relaxed));
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (used + bytes > peak &&
         !peak_.compare_exchange_weak(peak, used + bytes,
                                      std::memory_order_relaxed)) {
  }
  return Charge(shared_from_this(), bytes);
}

void MemoryBudget::Release(uint64_t bytes) {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

uint64_t MemoryBudget::DefaultCapacity() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t machine = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) *
                                                 static_cast<uint64_t>(page)
                                           : uint64_t{8} << 30;
  // cgroup v2: "max" or a byte count.
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (cg >> limit && limit != "max") {
    try {
      machine = std::min<uint64_t>(machine, std::stoull(limit));
    } catch (const std::exception&) {
      // Unreadable: keep the physical size.
    }
  }
  return std::max<uint64_t>(machine / 2, uint64_t{256} << 20);
}

}  // namespace asyncps::server
