// Shared memory between a client and the shards on its host: the data path
// of colocated processes (the control messages stay on ZeroMQ).
//
// A client creates one segment: a sealed memfd (memfd_create with
// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so no one can truncate it under
// a mapping and fault the shard with SIGBUS). The client tells each shard
// the segment's (pid, fd, size, token) in an attach request. The shard
// refuses its own pid, then opens /proc/<pid>/fd/<fd> with O_PATH (which
// opens nothing, and whose close drops no fcntl lock: reopening and closing
// a file the shard itself holds, such as RocksDB's LOCK, would drop the
// shard's locks on it) and checks on that descriptor that it is a memfd
// (its link reads "/memfd:..." and it lies on the memfds' internal mount),
// a regular file owned by the shard's own user, of exactly that size (and
// at most the shard's limit). Only then is it reopened read-write and
// required to be sealed against shrinking, and its header to hold the magic
// and the 64-bit random token. Knowing the token proves the client could
// read the segment: a client cannot make a shard write into memory of a
// process it has no access to. Every refusal is the same InvalidArgument,
// so that a peer cannot probe which descriptors exist or their sizes.
//
// Layout: a 64-byte header, then one 8-byte slot per shard, then the data
// area (from data_offset(), 4 KiB aligned). A pull whose destinations lie in
// the data area is answered by the shard writing the weights there itself:
// one copy, shard to destination, instead of snapshot, socket and receive.
//
// Slots make that write happen at most once per request, and never after
// the client stopped waiting for it. A slot holds 0 (free) or a request id
// (< 2^61) with two flag bits:
//   client: Arm(slot, id)        0 -> id            before sending the pull
//   shard:  Claim(slot, id)      id -> id|kClaimed  before writing; fails if
//                                                   the client disarmed it or
//                                                   the pull was answered
//   shard:  Finish(slot, id)     -> id|kDone        after writing (release)
//   client: IsDone(slot, id)     the data is complete (acquire)
//   client: Disarm(slot, id)     -> 0; if the shard has claimed it, waits (up
//                                to a bound) for it to finish writing first
// A resent pull is answered by the shard once (Claim fails the second time);
// an abandoned pull is never written after Disarm returns.
//
// Thread safety: Segment methods are thread-safe; slots are atomics in the
// shared mapping, safe across processes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace asyncps {

class ShmSegment {
 public:
  static constexpr uint64_t kClaimed = uint64_t{1} << 62;
  static constexpr uint64_t kDone = uint64_t{1} << 61;
  static constexpr uint64_t kMaxId = kDone - 1;  // ids must be <= this
  static constexpr uint32_t kMaxSlots = 1u << 16;

  // Creates a sealed segment with `data_bytes` of data area and `num_slots`
  // slots (1..kMaxSlots). Unimplemented where memfd_create or sealing is
  // missing (not Linux).
  static StatusOr<std::unique_ptr<ShmSegment>> Create(size_t data_bytes,
                                                      uint32_t num_slots);

  // Maps the segment another process created (see the header comment for
  // the checks). `max_bytes` bounds the size accepted. Every refusal is
  // InvalidArgument with one message whatever the cause; if `why` is not
  // null it receives the cause, for the caller's own log (never for the
  // peer). Nothing is left mapped or open on failure, and no lock of this
  // process is touched.
  static StatusOr<std::unique_ptr<ShmSegment>> Attach(
      uint32_t pid, int32_t fd, uint64_t size, uint64_t token,
      uint64_t max_bytes, std::string* why = nullptr);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // What an attach request carries (creator side).
  uint32_t pid() const { return pid_; }
  int32_t fd() const { return fd_; }
  uint64_t size() const { return size_; }
  uint64_t token() const { return token_; }
  uint32_t num_slots() const { return num_slots_; }
  uint64_t data_offset() const { return data_offset_; }
  uint8_t* base() const { return base_; }

  // True (and the offset from base()) when [p, p + bytes) lies in the data
  // area.
  bool Contains(const void* p, size_t bytes, uint64_t* offset) const;
  // True when [offset, offset + bytes) lies in the data area and offset is
  // a multiple of `align`.
  bool ValidRange(uint64_t offset, uint64_t bytes, size_t align) const;

  // Creator side: a block of the data area (64-byte aligned), or nullptr
  // when fewer than `bytes` are left. Blocks live as long as the segment.
  void* Allocate(size_t bytes);
  size_t allocated() const { return allocated_.load(); }

  // The slot protocol (header comment). REQUIRES: slot < num_slots(),
  // id in [1, kMaxId].
  void Arm(uint32_t slot, uint64_t id);
  bool Claim(uint32_t slot, uint64_t id);
  void Finish(uint32_t slot, uint64_t id);
  bool IsDone(uint32_t slot, uint64_t id) const;
  bool IsFree(uint32_t slot) const;
  // Returns false if the slot was claimed and did not finish within
  // `patience` (the writer died or hangs); the slot is freed either way.
  bool Disarm(uint32_t slot, uint64_t id, std::chrono::milliseconds patience);

 private:
  ShmSegment() = default;
  std::atomic<uint64_t>* slot(uint32_t i) const;

  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t token_ = 0;
  uint64_t data_offset_ = 0;
  uint32_t num_slots_ = 0;
  uint32_t pid_ = 0;
  int32_t fd_ = -1;
  bool owner_ = false;
  std::atomic<size_t> allocated_{0};
};

}  // namespace asyncps
