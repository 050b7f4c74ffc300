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
constexpr char kAttachRefused[] =
    "not a sealed shared-memory segment of this user's with that pid, fd, "
    "size and token";

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

#if defined(__linux__) && defined(MFD_ALLOW_SEALING)
// The device of the kernel's internal mount that holds every memfd: a
// memfd of this process's own, made once, tells it.
StatusOr<dev_t> MemfdDevice() {
  static const StatusOr<dev_t> dev = []() -> StatusOr<dev_t> {
    const int f = memfd_create("asyncps-probe", MFD_CLOEXEC);
    if (f < 0) return Status::Unimplemented(Errno("memfd_create"));
    struct stat st {};
    const int rc = fstat(f, &st);
    close(f);
    if (rc != 0) return Status::Unavailable(Errno("fstat of a memfd"));
    return st.st_dev;
  }();
  return dev;
}
#endif

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

StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Attach(
    uint32_t pid, int32_t fd, uint64_t size, uint64_t token, uint64_t max_bytes,
    std::string* why) {
#if defined(__linux__) && defined(MFD_ALLOW_SEALING) && defined(O_PATH)
  // One answer for every refusal, so that a peer learns nothing about which
  // descriptors exist in which process, or their sizes; `why` (for the
  // server's log only) says which check failed.
  auto refuse = [why](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return Status::InvalidArgument(kAttachRefused);
  };
  if (pid == 0 || fd < 0) return refuse("bad pid or fd");
  // Never a descriptor of this process: reopening one of its files and
  // closing that would drop every fcntl lock the process holds on it (the
  // RocksDB LOCK file among them).
  if (pid == static_cast<uint32_t>(getpid()))
    return refuse("the pid named is this process's own");
  if (size < DataOffset(1) + kPage || size > max_bytes) {
    return refuse("size " + std::to_string(size) + " out of range (at most " +
                  std::to_string(max_bytes) + ")");
  }
  const std::string path =
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // O_PATH opens nothing (no device or FIFO side effects, no blocking), and
  // closing an O_PATH descriptor drops no lock: every check before the real
  // open is made on it.
  const int o = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (o < 0) return refuse(Errno("opening " + path + " with O_PATH"));
  auto fail = [&](int f, const std::string& reason) {
    if (f >= 0) close(f);
    close(o);
    return refuse(reason);
  };
  const std::string self = "/proc/self/fd/" + std::to_string(o);
  char target[64] = {};
  const ssize_t n = readlink(self.c_str(), target, sizeof(target) - 1);
  if (n < 7 || std::memcmp(target, "/memfd:", 7) != 0)
    return fail(-1, path + " is not a memfd");
  struct stat st {};
  if (fstat(o, &st) != 0) return fail(-1, Errno("fstat of " + path));
  const StatusOr<dev_t> memfd_dev = MemfdDevice();
  if (!memfd_dev.ok() || st.st_dev != *memfd_dev || !S_ISREG(st.st_mode))
    return fail(-1, path + " is not a memfd");
  if (st.st_uid != geteuid())
    return fail(-1, path + " belongs to another user than this server's");
  if (static_cast<uint64_t>(st.st_size) != size) {
    return fail(-1, path + " is " + std::to_string(st.st_size) +
                        " bytes, not " + std::to_string(size));
  }
  // Only now the real open, of the very file checked (the O_PATH
  // descriptor's own link, not the other process's, which may have changed).
  const int f = open(self.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0) return fail(-1, Errno("reopening " + path));
  struct stat again {};
  if (fstat(f, &again) != 0 || again.st_ino != st.st_ino ||
      again.st_dev != st.st_dev)
    return fail(f, path + " changed while it was opened");
  const int seals = fcntl(f, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return fail(f, path + " is not sealed against shrinking");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p == MAP_FAILED) return fail(f, Errno("mmap of " + path));
  close(f);  // the mapping keeps the file
  close(o);
  Header h;
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != kMagic || h.token != token || h.size != size ||
      h.num_slots == 0 || h.num_slots > kMaxSlots ||
      h.data_offset != DataOffset(h.num_slots) || h.data_offset >= size) {
    munmap(p, size);
    return refuse(path + " is not the segment named (bad header or token)");
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
  (void)why;
  return Status::Unimplemented("shared memory needs Linux memfd sealing");
#endif
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_ && fd_ >= 0) close(fd_);
}

bool ShmSegment::Contains(const void* p, size_t bytes, uint64_t* offset) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto lo = reinterpret_cast<uintptr_t>(base_) + data_offset_;
  const auto hi = reinterpret_cast<uintptr_t>(base_) + size_;
  if (a < lo || a > hi || bytes > hi - a) return false;
  *offset = a - reinterpret_cast<uintptr_t>(base_);
  return true;
}

bool ShmSegment::ValidRange(uint64_t offset, uint64_t bytes,
                            size_t align) const {
  return offset >= data_offset_ && offset <= size_ && bytes <= size_ - offset &&
         offset % align == 0;
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
