#include "common/wire.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace asyncps {
namespace {

TEST(WireTest, PushRoundTrip) {
  RequestHeader h;
  h.id = 42;
  h.rank = 3;
  h.incarnation = 0xdeadbeef;
  h.kind = RequestKind::kPush;
  h.clock = 17;
  h.chunks = {{5, 1, 0, 1000, 4000, 0}, {9, 2, 7, 20, 88, 0}};
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.id, 42u);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.incarnation, 0xdeadbeefu);
  EXPECT_EQ(d.kind, RequestKind::kPush);
  EXPECT_EQ(d.clock, 17);
  ASSERT_EQ(d.chunks.size(), 2u);
  EXPECT_EQ(d.chunks[1].chunk, 9u);
  EXPECT_EQ(d.chunks[1].codec, 7);
  EXPECT_EQ(d.chunks[1].byte_size, 88u);
}

TEST(WireTest, AssignStateRoundTrip) {
  RequestHeader h;
  h.kind = RequestKind::kAssign;
  h.rank = 1;
  h.assign_upload = 77;
  h.assign_phase = AssignOp::kState;
  h.assign_optimizer = "adam";
  h.chunks = {{3, 1, 0, 64, 256, (uint64_t{1} << 53)}};
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.kind, RequestKind::kAssign);
  EXPECT_EQ(d.assign_upload, 77u);
  EXPECT_EQ(d.assign_phase, AssignOp::kState);
  EXPECT_EQ(d.assign_optimizer, "adam");
  ASSERT_EQ(d.chunks.size(), 1u);
  EXPECT_EQ(d.chunks[0].num_elems, 64u);
  EXPECT_EQ(d.chunks[0].version, uint64_t{1} << 53);
  // A decoded header forgets the name of an earlier one; a long name is
  // refused.
  h.assign_optimizer.clear();
  bytes = EncodeRequest(h);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.assign_optimizer, "");
  h.assign_optimizer = std::string(65, 'x');
  bytes = EncodeRequest(h);
  EXPECT_FALSE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
}

// A page of a point-in-time scan and its reply; a later header decoded into
// the same struct does not keep the scan's fields.
TEST(WireTest, PointInTimeScanRoundTrip) {
  RequestHeader h;
  h.kind = RequestKind::kAssign;
  h.assign_phase = AssignOp::kScan;
  h.assign_cursor = 12;
  h.assign_scan_rows = 100;
  h.assign_snapshot = 0xfedcba9876543210ull;
  h.assign_open_snapshot = true;
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.assign_snapshot, 0xfedcba9876543210ull);
  EXPECT_TRUE(d.assign_open_snapshot);
  EXPECT_EQ(d.assign_cursor, 12u);
  RequestHeader plain;
  plain.kind = RequestKind::kHeartbeat;
  bytes = EncodeRequest(plain);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.assign_snapshot, 0u);
  EXPECT_FALSE(d.assign_open_snapshot);

  ReplyHeader r;
  r.kind = RequestKind::kAssign;
  r.scan_snapshot = 41;
  bytes = EncodeReply(r);
  ReplyHeader got;
  ASSERT_TRUE(DecodeReply(bytes.data(), bytes.size(), {}, &got).ok());
  EXPECT_EQ(got.scan_snapshot, 41u);
}

// A liveness record of a replica group's primary, then a plain request
// decoded into the same header: the worker states do not stay behind.
TEST(WireTest, ReplicateLivenessRoundTrip) {
  RequestHeader h;
  h.kind = RequestKind::kReplicate;
  h.replicate_epoch = 7;
  h.replicate_group = 2;
  h.replicate_workers = {{0, false, 12}, {3, true, int64_t{1} << 40}};
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.kind, RequestKind::kReplicate);
  EXPECT_EQ(d.replicate_epoch, 7u);
  EXPECT_EQ(d.replicate_workers, h.replicate_workers);
  DecodeLimits tight;
  tight.max_list_entries = 1;
  EXPECT_EQ(DecodeRequest(bytes.data(), bytes.size(), tight, &d).code(),
            StatusCode::kResourceExhausted);
  RequestHeader hb;
  hb.kind = RequestKind::kHeartbeat;
  bytes = EncodeRequest(hb);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_TRUE(d.replicate_workers.empty());
}

TEST(WireTest, RegisterAndPullRoundTrip) {
  RequestHeader h;
  h.kind = RequestKind::kRegister;
  TensorSpec t;
  t.name = "fc0.weight";
  t.shape = {784, 256};
  t.init = InitKind::kHeNormal;
  t.seed = 99;
  h.tensors = {t};
  h.layout.chunk_elems = 4096;
  h.layout.num_shards = 2;
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  ASSERT_EQ(d.tensors.size(), 1u);
  EXPECT_EQ(d.tensors[0], t);
  EXPECT_EQ(d.layout.chunk_elems, 4096u);
  EXPECT_EQ(d.layout.num_shards, 2);
  EXPECT_EQ(d.layout.placement, Placement::kBalanced);  // the default, 0
  h.layout.placement = Placement::kInOrder;
  bytes = EncodeRequest(h);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.layout.placement, Placement::kInOrder);
  h.layout.placement =
      static_cast<Placement>(kMaxPlacement + 1);  // a newer peer's
  bytes = EncodeRequest(h);
  Status bad = DecodeRequest(bytes.data(), bytes.size(), {}, &d);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("placement"), std::string::npos)
      << bad.ToString();

  RequestHeader p;
  p.kind = RequestKind::kPull;
  p.clock = 4;
  p.pull_chunks = {1, 2, 3};
  p.pull_codec = "fp16";
  p.pull_base_seq = 41;
  bytes = EncodeRequest(p);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.kind, RequestKind::kPull);
  EXPECT_EQ(d.pull_chunks, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(d.pull_codec, "fp16");
  EXPECT_EQ(d.pull_base_seq, 41u);
  EXPECT_TRUE(d.tensors.empty());
}

TEST(WireTest, SparseTablesAndRowsRoundTrip) {
  RequestHeader h;
  h.kind = RequestKind::kRegister;
  h.tensors = {TensorSpec{"d", {4}, InitKind::kZeros, 0, 1}};
  TableSpec t;
  t.name = "emb";
  t.dim = 17;
  t.init = InitKind::kNormal;
  t.init_param = 0.01f;
  t.seed = 5;
  t.optimizer.kind = RowOptimizerKind::kAdam;
  t.optimizer.lr = 0.003f;
  t.optimizer.beta1 = 0.8f;
  t.optimizer.beta2 = 0.99f;
  t.optimizer.eps = 1e-6f;
  t.optimizer.initial_accumulator = 0.1f;
  t.admit_after_pushes = 3;
  t.expire_after_clocks = 100;
  h.tables = {t, t};
  h.tables[1].name = "emb2";
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  ASSERT_EQ(d.tables.size(), 2u);
  EXPECT_EQ(d.tables[0], t);
  EXPECT_EQ(d.tables[1].name, "emb2");

  RequestHeader push;
  push.kind = RequestKind::kPush;
  push.chunks = {{0, 1, 0, 4, 16, 0}};
  push.rows = {{1, 2, 3, 1000, 1}, {0, 4, 5, 7, 0}};
  bytes = EncodeRequest(push);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  ASSERT_EQ(d.rows.size(), 2u);
  EXPECT_EQ(d.rows[0].table, 1u);
  EXPECT_EQ(d.rows[0].keys_frame, 2u);
  EXPECT_EQ(d.rows[0].rows_frame, 3u);
  EXPECT_EQ(d.rows[0].num_keys, 1000u);
  EXPECT_EQ(d.rows[0].codec, 1);
  EXPECT_TRUE(d.tables.empty());

  // Pulls: rows and the dense flag (true unless cleared, also for old
  // senders that do not know the field).
  RequestHeader pull;
  pull.kind = RequestKind::kPull;
  bytes = EncodeRequest(pull);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_TRUE(d.pull_dense);
  EXPECT_TRUE(d.rows.empty());
  pull.pull_dense = false;
  pull.rows = {{0, 1, 0, 9, 1}};
  bytes = EncodeRequest(pull);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_FALSE(d.pull_dense);
  ASSERT_EQ(d.rows.size(), 1u);
  EXPECT_EQ(d.rows[0].num_keys, 9u);

  ReplyHeader r;
  r.kind = RequestKind::kPull;
  r.rows = {{0, 0, 1, 9, 0}};
  bytes = EncodeReply(r);
  ReplyHeader rd;
  ASSERT_TRUE(DecodeReply(bytes.data(), bytes.size(), {}, &rd).ok());
  ASSERT_EQ(rd.rows.size(), 1u);
  EXPECT_EQ(rd.rows[0].rows_frame, 1u);

  // Out-of-range enums are rejected while decoding.
  h.tables[0].optimizer.kind = static_cast<RowOptimizerKind>(9);
  bytes = EncodeRequest(h);
  EXPECT_FALSE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
}

TEST(WireTest, SharedMemoryAttachAndPullRoundTrip) {
  RequestHeader a;
  a.kind = RequestKind::kAttachShm;
  a.id = 3;
  a.shm_pid = 4242;
  a.shm_fd = 17;
  a.shm_size = uint64_t{5} << 32;
  a.shm_token = 0xfeedface12345678ull;
  auto bytes = EncodeRequest(a);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.kind, RequestKind::kAttachShm);
  EXPECT_EQ(d.shm_pid, 4242u);
  EXPECT_EQ(d.shm_fd, 17);
  EXPECT_EQ(d.shm_size, uint64_t{5} << 32);
  EXPECT_EQ(d.shm_token, 0xfeedface12345678ull);
  EXPECT_STREQ(RequestKindName(d.kind), "attach_shm");

  RequestHeader p;
  p.kind = RequestKind::kPull;
  p.pull_chunks = {4, 9};
  p.pull_shm_offsets = {4096, UINT64_MAX};
  p.pull_shm_slot = 7;
  bytes = EncodeRequest(p);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.pull_shm_offsets, p.pull_shm_offsets);
  EXPECT_EQ(d.pull_shm_slot, 7u);
  // Decoding into a reused header clears what the last request set.
  p.pull_shm_offsets.clear();
  bytes = EncodeRequest(p);
  ASSERT_TRUE(DecodeRequest(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_TRUE(d.pull_shm_offsets.empty());
  EXPECT_EQ(d.pull_shm_slot, 0u);
  EXPECT_EQ(d.shm_pid, 0u);
}

TEST(WireTest, ReplyCarriesStatus) {
  ReplyHeader r;
  r.id = 7;
  r.kind = RequestKind::kPull;
  r.status = Status::NotFound("chunk 12");
  r.min_clock = 5;
  r.pull_seq = 9;
  r.chunks = {{1, 1, 0, 10, 40, 3}};
  auto bytes = EncodeReply(r);
  ReplyHeader d;
  ASSERT_TRUE(DecodeReply(bytes.data(), bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.status, Status::NotFound("chunk 12"));
  EXPECT_EQ(d.min_clock, 5);
  EXPECT_EQ(d.pull_seq, 9u);
  EXPECT_EQ(d.chunks[0].version, 3u);
}

TEST(WireTest, WrongVersionIsRejectedButIdEchoed) {
  RequestHeader h;
  h.version = 9;
  h.id = 1234;
  auto bytes = EncodeRequest(h);
  RequestHeader d;
  Status s = DecodeRequest(bytes.data(), bytes.size(), {}, &d);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.id, 1234u);
}

TEST(WireTest, GarbageAndTruncationNeverCrash) {
  RequestHeader h;
  h.kind = RequestKind::kPush;
  h.chunks.resize(50);
  auto good = EncodeRequest(h);
  RequestHeader d;
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);
    EXPECT_FALSE(DecodeRequest(cut.data(), cut.size(), {}, &d).ok()) << len;
  }
  std::mt19937 rng(3);
  int rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<uint8_t> m = good;
    for (int k = 0; k < 1 + i % 8; ++k)
      m[rng() % m.size()] = static_cast<uint8_t>(rng());
    if (!DecodeRequest(m.data(), m.size(), {}, &d).ok()) ++rejected;
    std::vector<uint8_t> g(8 * (1 + rng() % 64));
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    (void)DecodeRequest(g.data(), g.size(), {}, &d);
  }
  EXPECT_GT(rejected, 0);
}

TEST(WireTest, LimitsAreEnforced) {
  RequestHeader h;
  h.kind = RequestKind::kPush;
  h.chunks.resize(100);
  auto bytes = EncodeRequest(h);
  DecodeLimits small;
  small.max_list_entries = 10;
  RequestHeader d;
  EXPECT_EQ(DecodeRequest(bytes.data(), bytes.size(), small, &d).code(),
            StatusCode::kResourceExhausted);
  small.max_header_bytes = 64;
  EXPECT_EQ(DecodeRequest(bytes.data(), bytes.size(), small, &d).code(),
            StatusCode::kResourceExhausted);
}

TEST(WireTest, UnalignedInputIsCopied) {
  RequestHeader h;
  h.kind = RequestKind::kClock;
  h.clock = 77;
  auto bytes = EncodeRequest(h);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  RequestHeader d;
  ASSERT_TRUE(DecodeRequest(shifted.data() + 1, bytes.size(), {}, &d).ok());
  EXPECT_EQ(d.clock, 77);
}

}  // namespace
}  // namespace asyncps
