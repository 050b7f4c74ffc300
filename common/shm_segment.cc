#include "common/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <thread>

namespace asyncps {

namespace {

constexpr uint64_t kMagic = 0x31306d6873707361ull;  // "asypshm01"
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kPage = 4096;

// The first 64 bytes of a segment.
struct Header {
  uint64_t magic;
  uint64_t token;
  uint64_t size;
  uint64_t data_offset;
  uint32_t num_slots;
  uint32_t reserved[7];
};
static_assert(sizeof(Header) == kHeaderBytes, "header is 64 bytes");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "slots need lock-free 64-bit atomics to work across processes");

uint64_t DataOffset(uint32_t num_slots) {
  const uint64_t end = kHeaderBytes + uint64_t{num_slots} * sizeof(uint64_t);
  return (end + kPage - 1) / kPage * kPage;
}

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

uint64_t RandomToken() {
  std::random_device rd;
  uint64_t t = 0;
  while (t == 0) t = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return t;
}

}  // namespace

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(size_t data_bytes,
                                                         uint32_t num_slots) {
#if defined(__linux__) && defined(MFD_ALLOW_SEALING)
  if (num_slots == 0 || num_slots > kMaxSlots) {
    return Status::InvalidArgument("shared memory needs 1.." +
                                   std::to_string(kMaxSlots) + " slots");
  }
  const uint64_t offset = DataOffset(num_slots);
  const uint64_t data = (uint64_t{data_bytes} + kPage - 1) / kPage * kPage;
  if (data_bytes == 0 || data > (uint64_t{1} << 46)) {
    return Status::InvalidArgument("shared memory of " +
                                   std::to_string(data_bytes) +
                                   " bytes: out of range");
  }
  const uint64_t size = offset + data;
  int fd = memfd_create("asyncps-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::Unimplemented(Errno("memfd_create"));
  auto fail = [&](const std::string& what) {
    Status s = Status::Unavailable(Errno(what));
    close(fd);
    return s;
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return fail("sealing the shared memory");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap of the shared memory");
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment());
  seg->base_ = static_cast<uint8_t*>(p);
  seg->size_ = size;
  seg->token_ = RandomToken();
  seg->data_offset_ = offset;
  seg->num_slots_ = num_slots;
  seg->pid_ = static_cast<uint32_t>(getpid());
  seg->fd_ = fd;
  seg->owner_ = true;
  Header h{};
  h.token = seg->token_;
  h.size = size;
  h.data_offset = offset;
  h.num_slots = num_slots;
  h.magic = kMagic;
  std::memcpy(seg->base_, &h, sizeof(h));  // slots are zero (free) already
  return seg;
#else
  (void)data_bytes;
  (void)num_slots;
  return Status::Unimplemented("shared memory needs Linux memfd sealing");
#endif
}

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Attach(uint32_t pid,
                                                         int32_t fd,
                                                         uint64_t size,
                                                         uint64_t token,
                                                         uint64_t max_bytes) {
#if defined(__linux__) && defined(F_GET_SEALS)
  if (pid == 0 || fd < 0) return Status::InvalidArgument("bad pid or fd");
  if (size < DataOffset(1) + kPage || size > max_bytes) {
    return Status::InvalidArgument(
        "shared memory of " + std::to_string(size) +
        " bytes: out of range (at most " + std::to_string(max_bytes) + ")");
  }
  const std::string path =
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // Checked before opening: opening a device or a FIFO of another process
  // can block or have side effects. O_NONBLOCK | O_NOCTTY, and the same
  // inode after opening, cover a swap in between.
  struct stat before {};
  if (stat(path.c_str(), &before) != 0) {
    return errno == ENOENT ? Status::NotFound(Errno("stat of " + path))
                           : Status::InvalidArgument(Errno("stat of " + path));
  }
  if (!S_ISREG(before.st_mode))
    return Status::InvalidArgument(path + " is not a memory file");
  int f = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0) {
    return errno == ENOENT ? Status::NotFound(Errno("opening " + path))
                           : Status::InvalidArgument(Errno("opening " + path));
  }
  auto fail = [&](Status s) {
    close(f);
    return s;
  };
  struct stat st {};
  if (fstat(f, &st) != 0) return fail(Status::InvalidArgument(Errno("fstat")));
  if (!S_ISREG(st.st_mode) || st.st_ino != before.st_ino ||
      st.st_dev != before.st_dev)
    return fail(Status::InvalidArgument(path + " is not a memory file"));
  if (st.st_uid != geteuid()) {
    return fail(Status::InvalidArgument(
        path + " belongs to another user than this server's"));
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    return fail(Status::InvalidArgument(
        path + " is " + std::to_string(st.st_size) + " bytes, not " +
        std::to_string(size)));
  }
  const int seals = fcntl(f, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return fail(Status::InvalidArgument(
        path + " is not sealed against shrinking (a sealed memfd is needed)"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p == MAP_FAILED)
    return fail(Status::InvalidArgument(Errno("mmap of " + path)));
  close(f);  // the mapping keeps the file
  Header h;
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != kMagic || h.token != token || h.size != size ||
      h.num_slots == 0 || h.num_slots > kMaxSlots ||
      h.data_offset != DataOffset(h.num_slots) || h.data_offset >= size) {
    munmap(p, size);
    return Status::InvalidArgument(path +
                                   " is not the segment named (bad header or "
                                   "token)");
  }
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment());
  seg->base_ = static_cast<uint8_t*>(p);
  seg->size_ = size;
  seg->token_ = token;
  seg->data_offset_ = h.data_offset;
  seg->num_slots_ = h.num_slots;
  seg->pid_ = pid;
  seg->fd_ = -1;
  return seg;
#else
  (void)pid;
  (void)fd;
  (void)size;
  (void)token;
  (void)max_bytes;
  return Status::Unimplemented("shared memory needs Linux memfd sealing");
#endif
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_ && fd_ >= 0) close(fd_);
}

bool ShmSegment::Contains(const void* p, size_t bytes,
                          uint64_t* offset) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto lo = reinterpret_cast<uintptr_t>(base_) + data_offset_;
  const auto hi = reinterpret_cast<uintptr_t>(base_) + size_;
  if (a < lo || a > hi || bytes > hi - a) return false;
  *offset = a - reinterpret_cast<uintptr_t>(base_);
  return true;
}

bool ShmSegment::ValidRange(uint64_t offset, uint64_t bytes,
                            size_t align) const {
  return offset >= data_offset_ && offset <= size_ &&
         bytes <= size_ - offset && offset % align == 0;
}

void* ShmSegment::Allocate(size_t bytes) {
  const uint64_t need = (uint64_t{bytes} + 63) / 64 * 64;
  size_t at = allocated_.load();
  do {
    if (need > size_ - data_offset_ - at) return nullptr;
  } while (!allocated_.compare_exchange_weak(at, at + need));
  return base_ + data_offset_ + at;
}

std::atomic<uint64_t>* ShmSegment::slot(uint32_t i) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(base_ + kHeaderBytes) + i;
}

void ShmSegment::Arm(uint32_t i, uint64_t id) {
  slot(i)->store(id, std::memory_order_release);
}

bool ShmSegment::Claim(uint32_t i, uint64_t id) {
  uint64_t want = id;
  return slot(i)->compare_exchange_strong(want, id | kClaimed,
                                          std::memory_order_acq_rel);
}

void ShmSegment::Finish(uint32_t i, uint64_t id) {
  slot(i)->store(id | kDone, std::memory_order_release);
}

bool ShmSegment::IsDone(uint32_t i, uint64_t id) const {
  return slot(i)->load(std::memory_order_acquire) == (id | kDone);
}

bool ShmSegment::IsFree(uint32_t i) const {
  return slot(i)->load(std::memory_order_acquire) == 0;
}

bool ShmSegment::Disarm(uint32_t i, uint64_t id,
                        std::chrono::milliseconds patience) {
  std::atomic<uint64_t>* s = slot(i);
  uint64_t want = id;
  if (s->compare_exchange_strong(want, 0, std::memory_order_acq_rel))
    return true;  // never claimed: the shard will not write it
  const auto until = std::chrono::steady_clock::now() + patience;
  bool finished = true;
  while (s->load(std::memory_order_acquire) == (id | kClaimed)) {
    if (std::chrono::steady_clock::now() >= until) {
      finished = false;
      break;
    }
    std::this_thread::yield();
  }
  s->store(0, std::memory_order_release);
  return finished;
}

}  // namespace asyncps
