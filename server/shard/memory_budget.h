// MemoryBudget: the bytes a shard may hold for what its peers ask of it.
//
// Every allocation whose size a peer's request decides (registered chunks,
// pull snapshots and codec payloads waiting in ZeroMQ's queues, per-worker
// pull replicas, parked pulls, the layout tables) is drawn from one budget
// first: Reserve() either returns a Charge for the bytes or, when they do not
// fit, ResourceExhausted naming what was asked for, how much and what is in
// use, and nothing is allocated. A Charge gives its bytes back when it is
// destroyed, on whatever thread that happens (the buffers of sent replies are
// released by ZeroMQ's I/O thread), so a Charge may be tied to the lifetime
// of a ref-counted buffer.
//
// Ownership: shared (std::shared_ptr); every Charge keeps its budget alive.
// Thread safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace asyncps::server {

class MemoryBudget : public std::enable_shared_from_this<MemoryBudget> {
 public:
  // A reservation of bytes from a budget, returned on destruction.
  // Move-only. A default-constructed Charge holds nothing.
  class Charge {
   public:
    Charge() = default;
    ~Charge() { Reset(); }
    Charge(Charge&& o) noexcept;
    Charge& operator=(Charge&& o) noexcept;
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;

    uint64_t bytes() const { return bytes_; }
    // Gives back the bytes above `bytes` (no-op if it holds fewer).
    void ShrinkTo(uint64_t bytes);
    // Gives back everything.
    void Reset();

   private:
    friend class MemoryBudget;
    Charge(std::shared_ptr<MemoryBudget> b, uint64_t bytes)
        : budget_(std::move(b)), bytes_(bytes) {}
    std::shared_ptr<MemoryBudget> budget_;
    uint64_t bytes_ = 0;
  };

  // `capacity` in bytes, >= 1.
  static std::shared_ptr<MemoryBudget> Create(uint64_t capacity);

  // Reserves `bytes` for `what` (a phrase such as "pull replica of rank 3"),
  // or ResourceExhausted: "<what> needs N bytes: the shard's memory budget of
  // C bytes has U in use".
  StatusOr<Charge> Reserve(uint64_t bytes, std::string_view what);
  // True when `bytes` more would fit now (a check; reserves nothing).
  bool Fits(uint64_t bytes) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Most bytes in use at once since creation.
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  // Reservations refused so far.
  uint64_t refusals() const {
    return refusals_.load(std::memory_order_relaxed);
  }

  // The default budget of a shard on this machine, in bytes: half of the
  // memory it may use (physical memory, or the cgroup's memory.max when that
  // is lower), at least 256 MiB.
  static uint64_t DefaultCapacity();

 private:
  explicit MemoryBudget(uint64_t capacity) : capacity_(capacity) {}
  void Release(uint64_t bytes);

  const uint64_t capacity_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace asyncps::server
