#include "common/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace asyncps {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<ShmSegment> NewSegment(size_t bytes = 1 << 20,
                                       uint32_t slots = 4) {
  auto s = ShmSegment::Create(bytes, slots);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

constexpr uint64_t kBig = uint64_t{1} << 30;

// Runs `body` in a forked child (the shard's side: Attach refuses its own
// pid) and returns its exit status, -1 if it did not exit.
int InChild(const std::function<int()>& body) {
  const pid_t c = fork();
  if (c == 0) _exit(body());
  int st = 0;
  if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

// What Attach answered in a child process: "" for OK, else the message;
// `why` (if not null) receives the cause it gave for its caller's log.
std::string AttachFromChild(uint32_t pid, int32_t fd, uint64_t size,
                            uint64_t token, uint64_t max_bytes = kBig,
                            std::string* why = nullptr) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  const int rc = InChild([&] {
    close(out[0]);
    std::string cause;
    auto a = ShmSegment::Attach(pid, fd, size, token, max_bytes, &cause);
    const std::string m = (a.ok() ? "" : a.status().message()) + '\0' + cause;
    const bool sent =
        write(out[1], m.data(), m.size()) == static_cast<ssize_t>(m.size());
    return sent ? 0 : 1;
  });
  close(out[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) got.append(buf, n);
  close(out[0]);
  if (rc != 0) return "child failed";
  const size_t nul = got.find('\0');
  if (why != nullptr && nul != std::string::npos) *why = got.substr(nul + 1);
  return got.substr(0, nul);
}

// A process that keeps a descriptor open (the fds this one has, inherited)
// until it is destroyed: a "client" whose descriptors a request names.
class Holder {
 public:
  Holder() {
    if (pipe(stop_) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(stop_[1]);
      char c;
      (void)!read(stop_[0], &c, 1);
      _exit(0);
    }
    close(stop_[0]);
  }
  ~Holder() {
    close(stop_[1]);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  uint32_t pid() const { return static_cast<uint32_t>(pid_); }

 private:
  int stop_[2] = {-1, -1};
  pid_t pid_ = -1;
};

// Whether another process sees a write lock of `owner` on `path`.
bool LockHeldBy(const std::string& path, pid_t owner) {
  return InChild([&] {
           const int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
           if (f < 0) return 2;
           struct flock l {};
           l.l_type = F_WRLCK;
           l.l_whence = SEEK_SET;
           if (fcntl(f, F_GETLK, &l) != 0) return 3;
           return l.l_type != F_UNLCK && l.l_pid == owner ? 0 : 1;
         }) == 0;
}

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/shm_" + std::to_string(getpid()) + "_" + name;
}

// A new file at `path` of `size` bytes (a descriptor, -1 on failure).
int NewFile(const std::string& path, uint64_t size) {
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(ShmSegmentTest, AttachSeesTheCreatorsBytes) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->data_offset() % 4096, 0u);
  float* a = static_cast<float*>(seg->Allocate(1000 * sizeof(float)));
  ASSERT_NE(a, nullptr);
  for (int i = 0; i < 1000; ++i) a[i] = static_cast<float>(i);
  uint64_t off = 0;
  ASSERT_TRUE(seg->Contains(a, 1000 * sizeof(float), &off));
  // The shard's side, in another process: it sees the bytes, and a write
  // through its mapping shows in the creator's.
  EXPECT_EQ(InChild([&] {
              auto other = ShmSegment::Attach(seg->pid(), seg->fd(),
                                              seg->size(), seg->token(), kBig);
              if (!other.ok()) return 1;
              uint8_t* base = (*other)->base();
              if (reinterpret_cast<const float*>(base + off)[999] != 999.0f)
                return 2;
              reinterpret_cast<float*>(base + off)[0] = -7.0f;
              return (*other)->num_slots() == 4u ? 0 : 3;
            }),
            0);
  EXPECT_EQ(a[0], -7.0f);
}

// Issue 40: closing any descriptor of a file drops every fcntl lock the
// process holds on it, so reopening a file that the request names (its own
// RocksDB LOCK, or the same file through another process's descriptor) and
// closing it again unlocked it. Neither may touch the caller's locks.
TEST(ShmSegmentTest, AttachNeverDropsTheCallersFcntlLocks) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  const std::string path = TempPath("lock");
  // The size asked for: the checks before the size check are what matter.
  const int fd = NewFile(path, seg->size());
  ASSERT_GE(fd, 0);
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(fd, F_SETLK, &l), 0);
  ASSERT_TRUE(LockHeldBy(path, getpid()));

  // This process's own pid and the locked fd.
  EXPECT_FALSE(ShmSegment::Attach(static_cast<uint32_t>(getpid()), fd,
                                  seg->size(), seg->token(), kBig)
                   .ok());
  EXPECT_TRUE(LockHeldBy(path, getpid())) << "own pid dropped the lock";
  // The same file through a descriptor of another process.
  {
    Holder other;
    EXPECT_FALSE(
        ShmSegment::Attach(other.pid(), fd, seg->size(), seg->token(), kBig)
            .ok());
  }
  EXPECT_TRUE(LockHeldBy(path, getpid()))
      << "another process's descriptor of the file dropped the lock";
  close(fd);
  std::remove(path.c_str());
}

TEST(ShmSegmentTest, AttachRefusesARegularFileOfTheRightSize) {
  // Same size and header as a real segment, in an ordinary file (on disk
  // and, where there is one, on a tmpfs): not a memfd, refused.
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  std::vector<std::string> paths = {TempPath("regular")};
  if (access("/dev/shm", W_OK) == 0) {
    paths.push_back("/dev/shm/memfd:asyncps-test-" + std::to_string(getpid()));
  }
  for (const std::string& path : paths) {
    const int fd = NewFile(path, seg->size());
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(pwrite(fd, seg->base(), 64 + 4 * 8, 0), 64 + 4 * 8);
    Holder other;
    std::string why;
    EXPECT_NE(
        AttachFromChild(other.pid(), fd, seg->size(), seg->token(), kBig, &why),
        "")
        << path;
    EXPECT_NE(why.find("is not a memfd"), std::string::npos) << why;
    close(fd);
    std::remove(path.c_str());
  }
}

TEST(ShmSegmentTest, EveryRefusalSaysTheSame) {
  // Wrong token, size, limit, fd, pid, kind of file: each refused, and what
  // a refusal says must not tell a peer which descriptors exist, what they
  // are, or their sizes.
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  const uint32_t pid = seg->pid();
  const int32_t fd = seg->fd();
  const uint64_t size = seg->size(), token = seg->token();
  const std::string path = TempPath("same");
  const int file = NewFile(path, size);
  ASSERT_GE(file, 0);
  const int unsealed = memfd_create("not-sealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, static_cast<off_t>(size)), 0);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(AttachFromChild(pid, fd, size, token), "");  // the real one
  const std::vector<std::string> said = {
      AttachFromChild(pid, fd, size, token ^ 1),        // wrong token
      AttachFromChild(pid, fd, size - 4096, token),     // wrong size
      AttachFromChild(pid, fd, size, token, size - 1),  // over the limit
      AttachFromChild(pid, 100000, size, token),        // no such fd
      AttachFromChild(pid, file, size, token),          // a regular file
      AttachFromChild(pid, unsealed, size, token),      // not sealed
      AttachFromChild(pid, p[0], size, token),          // a pipe
      AttachFromChild(pid, -1, size, token),
      AttachFromChild(0, fd, size, token),
      AttachFromChild(0x7ffffff0, fd, size, token),  // no such process
      AttachFromChild(1, 0, size, token),            // pid 1's stdin
  };
  auto own = ShmSegment::Attach(pid, fd, size, token, kBig);  // own pid
  EXPECT_FALSE(own.ok()) << "this process's own pid was accepted";
  EXPECT_EQ(own.status().code(), StatusCode::kInvalidArgument);
  for (size_t i = 0; i < said.size(); ++i) {
    EXPECT_EQ(said[i], said[0]) << "refusal " << i;
  }
  EXPECT_EQ(own.status().message(), said[0]);
  EXPECT_NE(said[0].find("sealed"), std::string::npos) << said[0];
  close(p[0]);
  close(p[1]);
  close(unsealed);
  close(file);
  std::remove(path.c_str());
}

TEST(ShmSegmentTest, AttachRefusesAnUnsealedFile) {
  // Same size and header as a real segment, but it could be truncated under
  // the mapping (SIGBUS in the shard): refused.
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  int fd = memfd_create("not-sealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(seg->size())), 0);
  ASSERT_EQ(pwrite(fd, seg->base(), 64 + 4 * 8, 0), 64 + 4 * 8);
  std::string why;
  const std::string said =
      AttachFromChild(static_cast<uint32_t>(getpid()), fd, seg->size(),
                      seg->token(), kBig, &why);
  EXPECT_NE(said.find("sealed"), std::string::npos) << said;
  EXPECT_NE(why.find("not sealed against shrinking"), std::string::npos) << why;
  close(fd);
}

TEST(ShmSegmentTest, SealedSegmentCannotShrink) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  EXPECT_NE(ftruncate(seg->fd(), 4096), 0);
}

TEST(ShmSegmentTest, RangesAndAllocation) {
  auto seg = NewSegment(1 << 16, 1);
  ASSERT_NE(seg, nullptr);
  const uint64_t lo = seg->data_offset(), hi = seg->size();
  EXPECT_TRUE(seg->ValidRange(lo, hi - lo, 4));
  EXPECT_FALSE(seg->ValidRange(lo, hi - lo + 1, 4));
  EXPECT_FALSE(seg->ValidRange(lo - 8, 8, 4));  // header and slots
  EXPECT_FALSE(seg->ValidRange(lo + 2, 4, 4));  // unaligned
  EXPECT_FALSE(seg->ValidRange(UINT64_MAX - 3, 8, 4));
  EXPECT_FALSE(seg->ValidRange(lo, UINT64_MAX, 4));
  uint64_t off;
  int x = 0;
  EXPECT_FALSE(seg->Contains(&x, sizeof(x), &off));
  EXPECT_NE(seg->Allocate(1 << 15), nullptr);
  EXPECT_NE(seg->Allocate(1 << 15), nullptr);
  EXPECT_EQ(seg->Allocate(1), nullptr);  // full
}

TEST(ShmSegmentTest, SlotIsClaimedOnceAndNotAfterDisarm) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  EXPECT_TRUE(seg->IsFree(2));
  EXPECT_FALSE(seg->Claim(2, 5));  // not armed
  seg->Arm(2, 5);
  EXPECT_FALSE(seg->Claim(2, 6));  // another id
  EXPECT_TRUE(seg->Claim(2, 5));
  EXPECT_FALSE(seg->Claim(2, 5));  // a resend: once only
  EXPECT_FALSE(seg->IsDone(2, 5));
  seg->Finish(2, 5);
  EXPECT_TRUE(seg->IsDone(2, 5));
  EXPECT_FALSE(seg->Claim(2, 5));
  EXPECT_TRUE(seg->Disarm(2, 5, milliseconds(0)));
  EXPECT_TRUE(seg->IsFree(2));
  seg->Arm(2, 7);
  EXPECT_TRUE(seg->Disarm(2, 7, milliseconds(0)));  // abandoned unclaimed
  EXPECT_FALSE(seg->Claim(2, 7));
  EXPECT_TRUE(seg->IsFree(2));
}

TEST(ShmSegmentTest, DisarmWaitsForAWriteInProgressAcrossProcesses) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  float* buf = static_cast<float*>(seg->Allocate(4096));
  uint64_t off;
  ASSERT_TRUE(seg->Contains(buf, 4096, &off));
  seg->Arm(0, 9);
  const uint32_t pid = seg->pid();
  const int32_t fd = seg->fd();
  const uint64_t size = seg->size(), token = seg->token();
  int claimed[2];
  ASSERT_EQ(pipe(claimed), 0);
  pid_t child = fork();
  if (child == 0) {
    // The "shard": attaches, claims, says so, writes slowly, finishes.
    auto a = ShmSegment::Attach(pid, fd, size, token, kBig);
    if (!a.ok() || !(*a)->Claim(0, 9)) _exit(1);
    if (write(claimed[1], "c", 1) != 1) _exit(2);
    std::this_thread::sleep_for(milliseconds(200));
    std::memset((*a)->base() + off, 0x7f, 4096);
    (*a)->Finish(0, 9);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  char c;
  ASSERT_EQ(read(claimed[0], &c, 1), 1);
  // Claimed: disarm returns only once the write is complete.
  EXPECT_TRUE(seg->Disarm(0, 9, milliseconds(5000)));
  EXPECT_EQ(reinterpret_cast<uint8_t*>(buf)[4095], 0x7f);
  EXPECT_TRUE(seg->IsFree(0));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(claimed[0]);
  close(claimed[1]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace asyncps
