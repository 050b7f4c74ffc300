#include "common/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace asyncps {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<ShmSegment> NewSegment(size_t bytes = 1 << 20,
                                       uint32_t slots = 4) {
  auto s = ShmSegment::Create(bytes, slots);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(ShmSegmentTest, AttachSeesTheCreatorsBytes) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->data_offset() % 4096, 0u);
  float* a = static_cast<float*>(seg->Allocate(1000 * sizeof(float)));
  ASSERT_NE(a, nullptr);
  for (int i = 0; i < 1000; ++i) a[i] = static_cast<float>(i);
  auto other = ShmSegment::Attach(seg->pid(), seg->fd(), seg->size(),
                                  seg->token(), uint64_t{1} << 30);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  uint64_t off = 0;
  ASSERT_TRUE(seg->Contains(a, 1000 * sizeof(float), &off));
  const float* b = reinterpret_cast<const float*>((*other)->base() + off);
  EXPECT_EQ(b[999], 999.0f);
  // A write through the attached mapping shows in the creator's.
  reinterpret_cast<float*>((*other)->base() + off)[0] = -7.0f;
  EXPECT_EQ(a[0], -7.0f);
  EXPECT_EQ((*other)->num_slots(), 4u);
}

TEST(ShmSegmentTest, AttachRefusesWrongTokenSizeFdAndLimit) {
  auto seg = NewSegment();
  ASSERT_NE(seg, nullptr);
  const uint64_t big = uint64_t{1} << 30;
  EXPECT_FALSE(ShmSegment::Attach(seg->pid(), seg->fd(), seg->size(),
                                  seg->token() ^ 1, big)
                   .ok());
  EXPECT_FALSE(ShmSegment::Attach(seg->pid(), seg->fd(), seg->size() - 4096,
                                  seg->token(), big)
                   .ok());
  EXPECT_FALSE(ShmSegment::Attach(seg->pid(), seg->fd(), seg->size(),
                                  seg->token(), seg->size() - 1)
                   .ok());
  EXPECT_FALSE(
      ShmSegment::Attach(seg->pid(), 100000, seg->size(), seg->token(), big)
          .ok());
  EXPECT_FALSE(ShmSegment::Attach(0, seg->fd(), seg->size(), seg->token(), big)
                   .ok());
  EXPECT_FALSE(ShmSegment::Attach(seg->pid(), -1, seg->size(), seg->token(),
                                  big)
                   .ok());
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
  auto a = ShmSegment::Attach(static_cast<uint32_t>(getpid()), fd, seg->size(),
                              seg->token(), uint64_t{1} << 30);
  EXPECT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("sealed"), std::string::npos)
      << a.status().ToString();
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
    auto a = ShmSegment::Attach(pid, fd, size, token, uint64_t{1} << 30);
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
