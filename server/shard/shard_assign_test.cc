// Issue 22 items 2-4 at the shard: the upload claim (kAssign), a hostile
// upload validated whole before any chunk is written, the lr a worker
// carries in pushes and clocks, bounded by max_lr, and the optimizer state
// read (phase 3) and written back (phase 4).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Fill;
using testing::Floats;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

uint64_t Rejected(const ShardHarness& h, RejectReason r) {
  return h.shard->counters().rejected[static_cast<size_t>(r)];
}

void Register(ShardHarness& h) {
  ReplyHeader r =
      h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
}

RequestHeader Assign(int rank, uint64_t incarnation, uint64_t upload,
                     AssignOp phase) {
  RequestHeader r;
  r.kind = RequestKind::kAssign;
  r.rank = rank;
  r.incarnation = incarnation;
  r.assign_upload = upload;
  r.assign_phase = phase;
  return r;
}

// Values `v` for each of `chunks` (sized as the layout says).
RequestHeader Values(const ShardHarness& h, int rank, uint64_t inc,
                     uint64_t upload, const std::vector<uint32_t>& chunks,
                     float v, std::vector<ByteView>* data) {
  RequestHeader r = Assign(rank, inc, upload, AssignOp::kValues);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const uint64_t n = h.shard->layout()->chunks()[chunks[i]].num_elems;
    data->push_back(Floats(Fill(n, v)));
    ChunkRef c;
    c.chunk = chunks[i];
    c.frame = static_cast<uint32_t>(i + 1);
    c.num_elems = n;
    c.byte_size = n * sizeof(float);
    r.chunks.push_back(c);
  }
  return r;
}

TEST(ShardAssignTest, OneClaimAtATimeOthersWaitThenReadFinalValues) {
  ShardHarness h(testing::TestOptions(Consistency::kBsp));
  Register(h);
  const auto& mine = h.shard->layout()->shard_chunks(0);
  ReplyHeader r = h.Call(Assign(0, 7, 100, AssignOp::kBegin));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.created);  // rank 0 holds the claim
  r = h.Call(Assign(1, 8, 200, AssignOp::kBegin));
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_FALSE(r.created);
  // Rank 1's values without the claim: refused, nothing written.
  const auto before = h.AllWeights();
  std::vector<ByteView> d1;
  RequestHeader v1 = Values(h, 1, 8, 200, mine, 9.0f, &d1);
  r = h.Call(v1, d1);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.AllWeights(), before);
  // The claimant uploads (in two requests) and commits.
  std::vector<ByteView> a, b;
  RequestHeader va = Values(h, 0, 7, 100, {mine[0]}, 3.0f, &a);
  ASSERT_TRUE(h.Call(va, a).status.ok());
  RequestHeader vb =
      Values(h, 0, 7, 100, {mine.begin() + 1, mine.end()}, 3.0f, &b);
  ASSERT_TRUE(h.Call(vb, b).status.ok());
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kCommit)).status.ok());
  // A resent commit.
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kCommit)).status.ok());
  for (uint32_t id : mine) EXPECT_EQ((*h.shard->weights(id))[0], 3.0f);
  // Final: rank 1's begin answers "pull" (created false), and a pull sees
  // the values, not the initialisers' snapshot.
  r = h.Call(Assign(1, 8, 200, AssignOp::kBegin));
  ASSERT_TRUE(r.status.ok());
  EXPECT_FALSE(r.created);
  // Overwrite (a restore) claims it again.
  RequestHeader over = Assign(1, 8, 201, AssignOp::kBegin);
  over.assign_overwrite = true;
  r = h.Call(over);
  ASSERT_TRUE(r.status.ok());
  EXPECT_TRUE(r.created);
  EXPECT_EQ(Rejected(h, RejectReason::kUploadClaim), 2u);
}

TEST(ShardAssignTest, SilentOrRestartedClaimantIsReplaced) {
  ShardOptions o = testing::TestOptions(Consistency::kAsp);
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  Register(h);
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kBegin)).created);
  // Rank 0 restarted (new incarnation): takes its own claim at once.
  ReplyHeader r = h.Call(Assign(0, 9, 101, AssignOp::kBegin));
  ASSERT_TRUE(r.status.ok());
  EXPECT_TRUE(r.created);
  // The old process's values are refused.
  std::vector<ByteView> d;
  RequestHeader old = Values(h, 0, 7, 100, {h.FirstChunk()}, 1.0f, &d);
  EXPECT_FALSE(h.Call(old, d).status.ok());
  // Rank 0 goes silent: after the worker timeout rank 1 takes over.
  EXPECT_EQ(h.Call(Assign(1, 8, 200, AssignOp::kBegin)).status.code(),
            StatusCode::kUnavailable);
  h.now += std::chrono::milliseconds(1500);
  r = h.Call(Assign(1, 8, 200, AssignOp::kBegin));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.created);
}

TEST(ShardAssignTest, HostileValuesAreRefusedWholeBeforeAnyWrite) {
  ShardHarness h(testing::TestOptions(Consistency::kAsp));
  Register(h);
  const auto& mine = h.shard->layout()->shard_chunks(0);
  ASSERT_GE(mine.size(), 2u);
  uint32_t theirs = 0;
  while (h.shard->weights(theirs) != nullptr) ++theirs;
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kBegin)).created);
  const auto before = h.AllWeights();
  auto expect_refused = [&](RequestHeader req, std::vector<ByteView> data,
                            RejectReason why) {
    const uint64_t was = Rejected(h, why);
    ReplyHeader r = h.Call(req, data);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument)
        << r.status.ToString();
    EXPECT_EQ(Rejected(h, why), was + 1) << r.status.ToString();
    EXPECT_EQ(h.AllWeights(), before);  // the good first chunk untouched too
  };
  std::vector<ByteView> d;
  // The last chunk is another shard's.
  RequestHeader req = Values(h, 0, 7, 100, {mine[0], theirs}, 2.0f, &d);
  expect_refused(req, d, RejectReason::kWrongShard);
  // Named twice.
  d.clear();
  req = Values(h, 0, 7, 100, {mine[0], mine[0]}, 2.0f, &d);
  expect_refused(req, d, RejectReason::kRepeatedChunk);
  // A short frame.
  d.clear();
  req = Values(h, 0, 7, 100, {mine[0], mine[1]}, 2.0f, &d);
  d[1] = Floats(Fill(3, 2.0f));
  req.chunks[1].byte_size = 3 * sizeof(float);
  expect_refused(req, d, RejectReason::kSizeMismatch);
  // NaN in the last chunk.
  d.clear();
  req = Values(h, 0, 7, 100, {mine[0], mine[1]}, 2.0f, &d);
  std::vector<float> bad(req.chunks[1].num_elems, 1.0f);
  bad.back() = std::numeric_limits<float>::quiet_NaN();
  d[1] = Floats(bad);
  expect_refused(req, d, RejectReason::kNonFinite);
  // A compressed payload.
  d.clear();
  req = Values(h, 0, 7, 100, {mine[0], mine[1]}, 2.0f, &d);
  req.chunks[1].codec = 1;
  expect_refused(req, d, RejectReason::kBadCodec);
  // Frame index out of range; frames and refs that disagree.
  d.clear();
  req = Values(h, 0, 7, 100, {mine[0], mine[1]}, 2.0f, &d);
  req.chunks[1].frame = 5;
  expect_refused(req, d, RejectReason::kUnknownChunk);
  d.pop_back();
  expect_refused(req, d, RejectReason::kSizeMismatch);
  // Begin and commit carry no values; phase and upload id are checked.
  d.clear();
  RequestHeader begin = Values(h, 0, 7, 100, {mine[0]}, 2.0f, &d);
  begin.assign_phase = AssignOp::kBegin;
  expect_refused(begin, d, RejectReason::kSizeMismatch);
  // Operation 200 is past the last (kClear).
  expect_refused(Assign(0, 7, 100, static_cast<AssignOp>(200)), {},
                 RejectReason::kUploadClaim);
  // Phase 5 (rows with state) carries rows, nothing else.
  expect_refused(Assign(0, 7, 100, AssignOp::kRows), {},
                 RejectReason::kSizeMismatch);
  expect_refused(Assign(0, 7, 0, AssignOp::kBegin), {},
                 RejectReason::kUploadClaim);
  // Observers may not upload.
  ReplyHeader r = h.Call(Assign(-1, 7, 100, AssignOp::kBegin));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
}

TEST(ShardAssignTest, CarriedLrReplacesTheFlagsAndIsBoundedByMaxLr) {
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
  o.max_lr = 0.25f;
  ShardHarness h(o);
  Register(h);
  const uint32_t c = h.FirstChunk();
  const uint64_t n = h.shard->layout()->chunks()[c].num_elems;
  const float w0 = (*h.shard->weights(c))[0];
  auto push = [&](float lr, int64_t clock) {
    RequestHeader req =
        ShardHarness::Push(0, clock, {c}, {Floats(Fill(n, 1.0f))});
    req.lr = lr;
    return h.Call(req, {Floats(Fill(n, 1.0f))});
  };
  ASSERT_TRUE(push(0.0f, 0).status.ok());  // not carried: --lr 0.5
  EXPECT_FLOAT_EQ((*h.shard->weights(c))[0], w0 - 0.5f);
  ASSERT_TRUE(push(0.125f, 1).status.ok());
  EXPECT_FLOAT_EQ((*h.shard->weights(c))[0], w0 - 0.625f);
  ASSERT_TRUE(push(0.0f, 2).status.ok());  // the last one set stays
  EXPECT_FLOAT_EQ((*h.shard->weights(c))[0], w0 - 0.75f);
  const auto before = h.AllWeights();
  const uint64_t version = h.shard->shard_version();
  for (float bad : {0.26f, -0.1f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    ReplyHeader r = push(bad, 3);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("max_lr"), std::string::npos);
    RequestHeader clock = ShardHarness::Clock(0, 4);
    clock.lr = bad;
    EXPECT_EQ(h.Call(clock).status.code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(h.AllWeights(), before);
  EXPECT_EQ(h.shard->shard_version(), version);
  EXPECT_EQ(h.shard->clocks().clock(0), 2);  // refused clocks did not move
  EXPECT_EQ(Rejected(h, RejectReason::kLrOutOfRange), 8u);
  // A clock sets it too.
  RequestHeader clock = ShardHarness::Clock(0, 4);
  clock.lr = 0.25f;
  ASSERT_TRUE(h.Call(clock).status.ok());
  ASSERT_TRUE(push(0.0f, 4).status.ok());
  EXPECT_FLOAT_EQ((*h.shard->weights(c))[0], w0 - 1.0f);
}

TEST(ShardAssignTest, MaxLrIsValidated) {
  ShardOptions o = testing::TestOptions(Consistency::kAsp);
  o.max_lr = -1.0f;
  EXPECT_FALSE(o.Validate().ok());
  o.max_lr = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(o.Validate().ok());
  o.max_lr = 0.0f;  // refuses every carried lr
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ShardAssignTest, ReadsTheOptimizerStateOfEveryChunk) {
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
  o.optimizer.kind = OptimizerKind::kAdam;
  ShardHarness h(o);
  Register(h);
  const uint32_t c = h.FirstChunk();
  const uint64_t n = h.shard->layout()->chunks()[c].num_elems;
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {c}, {Floats(Fill(n, 1.0f))}),
                     {Floats(Fill(n, 1.0f))})
                  .status.ok());
  auto out = h.Send(Assign(0, 7, 1, AssignOp::kRead));
  ASSERT_EQ(out.size(), 1u);
  const OutgoingReply& r = out[0];
  ASSERT_TRUE(r.header.status.ok()) << r.header.status.ToString();
  const auto& mine = h.shard->layout()->shard_chunks(0);
  ASSERT_EQ(r.header.chunks.size(), mine.size());
  ASSERT_EQ(r.frames.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const ChunkRef& ref = r.header.chunks[i];
    EXPECT_EQ(ref.chunk, mine[i]);
    const std::vector<float>& state = *h.shard->optimizer_state(mine[i]);
    ASSERT_EQ(ref.num_elems, state.size());  // Adam: [m | v]
    ASSERT_EQ(r.frames[ref.frame - 1].size, state.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(r.frames[ref.frame - 1].data, state.data(),
                          state.size() * sizeof(float)),
              0);
    EXPECT_EQ(ref.version, mine[i] == c ? 1u : 0u);  // optimizer steps
  }
  // Observers may not read it (a worker-only request), nothing changes.
  EXPECT_FALSE(h.Call(Assign(-1, 7, 1, AssignOp::kRead)).status.ok());
}

// One chunk's optimizer state as phase 3 answers it.
struct ChunkState {
  uint32_t chunk = 0;
  std::vector<float> state;  // [slot 0 | slot 1 ...]
  uint64_t steps = 0;
  bool operator==(const ChunkState& o) const {
    return chunk == o.chunk && steps == o.steps &&
           state.size() == o.state.size() &&
           std::memcmp(state.data(), o.state.data(),
                       state.size() * sizeof(float)) == 0;  // bitwise
  }
};

std::vector<ChunkState> ReadState(ShardHarness& h) {
  auto out = h.Send(Assign(0, 7, 1, AssignOp::kRead));
  EXPECT_EQ(out.size(), 1u);
  std::vector<ChunkState> all;
  if (out.empty()) return all;
  EXPECT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
  for (const ChunkRef& ref : out[0].header.chunks) {
    const ByteView& f = out[0].frames[ref.frame - 1];
    ChunkState c;
    c.chunk = ref.chunk;
    c.state.resize(f.size / sizeof(float));
    if (f.size > 0) std::memcpy(c.state.data(), f.data, f.size);
    c.steps = ref.version;
    all.push_back(std::move(c));
  }
  return all;
}

// A state request (phase 4) setting `states` (k x the chunk's floats each).
RequestHeader State(int rank, uint64_t inc, uint64_t upload,
                    const std::string& optimizer,
                    const std::vector<ChunkState>& states,
                    std::vector<ByteView>* data) {
  RequestHeader r = Assign(rank, inc, upload, AssignOp::kState);
  r.assign_optimizer = optimizer;
  for (size_t i = 0; i < states.size(); ++i) {
    data->push_back(Floats(states[i].state));
    ChunkRef c;
    c.chunk = states[i].chunk;
    c.frame = static_cast<uint32_t>(i + 1);
    c.num_elems = states[i].state.size();
    c.byte_size = states[i].state.size() * sizeof(float);
    c.version = states[i].steps;
    r.chunks.push_back(c);
  }
  return r;
}

// k slots of distinct positive values for each of `chunks`, steps 5, 6, ...
std::vector<ChunkState> MadeState(const ShardHarness& h,
                                  const std::vector<uint32_t>& chunks,
                                  size_t k) {
  std::vector<ChunkState> out;
  for (size_t i = 0; i < chunks.size(); ++i) {
    ChunkState c;
    c.chunk = chunks[i];
    c.state.resize(k * h.ChunkElems(chunks[i]));
    for (size_t e = 0; e < c.state.size(); ++e)
      c.state[e] = 0.25f + 0.001f * static_cast<float>(i * 1000 + e);
    c.steps = 5 + i;
    out.push_back(std::move(c));
  }
  return out;
}

ShardOptions AdamOptions() {
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 2);
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.01f;
  return o;
}

// Values and state of every chunk of shard 0 in upload `upload` of rank 0.
void UploadWithState(ShardHarness& h, uint64_t upload,
                     const std::vector<ChunkState>& states) {
  const auto& mine = h.shard->layout()->shard_chunks(0);
  RequestHeader begin = Assign(0, 7, upload, AssignOp::kBegin);
  begin.assign_overwrite = true;
  ASSERT_TRUE(h.Call(begin).created);
  std::vector<ByteView> v, st;
  RequestHeader values = Values(h, 0, 7, upload, mine, 3.0f, &v);
  ASSERT_TRUE(h.Call(values, v).status.ok());
  RequestHeader state = State(0, 7, upload, "adam", states, &st);
  ReplyHeader r = h.Call(state, st);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  r = h.Call(Assign(0, 7, upload, AssignOp::kCommit));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
}

// Values `value` of every chunk of shard 0, no state, in upload `upload`.
void UploadValues(ShardHarness& h, uint64_t upload, float value) {
  const auto& mine = h.shard->layout()->shard_chunks(0);
  std::vector<ByteView> v;
  RequestHeader begin = Assign(0, 7, upload, AssignOp::kBegin);
  begin.assign_overwrite = true;
  ASSERT_TRUE(h.Call(begin).created);
  RequestHeader values = Values(h, 0, 7, upload, mine, value, &v);
  ASSERT_TRUE(h.Call(values, v).status.ok());
  ASSERT_TRUE(h.Call(Assign(0, 7, upload, AssignOp::kCommit)).status.ok());
}

TEST(ShardAssignTest, StateUploadRoundTripsBitwiseThroughTheRead) {
  // A trained shard: chunks with different optimizer steps (3, 1, 0).
  ShardHarness a(AdamOptions());
  Register(a);
  const auto& mine = a.shard->layout()->shard_chunks(0);
  ASSERT_GE(mine.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    std::vector<uint32_t> ids = {mine[0]};
    if (step == 0) ids.push_back(mine[1]);
    std::vector<ByteView> g;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> v(a.ChunkElems(ids[i]));
      for (size_t e = 0; e < v.size(); ++e)
        v[e] = 0.03f * static_cast<float>(e) - 0.2f * static_cast<float>(step);
      g.push_back(Floats(v));
    }
    ASSERT_TRUE(a.Call(ShardHarness::Push(0, step, ids, g), g).status.ok());
  }
  const std::vector<ChunkState> saved = ReadState(a);
  ASSERT_EQ(saved.size(), mine.size());
  EXPECT_EQ(saved[0].steps, 3u);
  EXPECT_EQ(saved[1].steps, 1u);
  EXPECT_EQ(saved[2].steps, 0u);
  // A fresh shard takes it in an upload with the values: read back bitwise,
  // each chunk's steps exact; the values are the upload's.
  ShardHarness b(AdamOptions());
  Register(b);
  UploadWithState(b, 100, saved);
  EXPECT_EQ(ReadState(b), saved);
  for (uint32_t id : mine) EXPECT_EQ((*b.shard->weights(id))[0], 3.0f);
  // The next update of both from the same weights is the same, bitwise
  // (Adam with the restored moments and steps).
  UploadWithState(a, 200, saved);
  for (ShardHarness* h : {&a, &b}) {
    const uint64_t n = h->ChunkElems(mine[0]);
    const int64_t clock = h == &a ? 3 : 0;  // each worker's next clock
    ReplyHeader r = h->Call(
        ShardHarness::Push(0, clock, {mine[0]}, {Floats(Fill(n, 0.5f))}),
        {Floats(Fill(n, 0.5f))});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  }
  EXPECT_EQ(a.AllWeights(), b.AllWeights());
  EXPECT_EQ(ReadState(a), ReadState(b));
  // An upload without state resets it (as before phase 4 existed).
  UploadValues(b, 300, 1.0f);
  for (const ChunkState& c : ReadState(b)) {
    EXPECT_EQ(c.steps, 0u);
    EXPECT_EQ(c.state, std::vector<float>(c.state.size(), 0.0f));
  }
}

TEST(ShardAssignTest, StateUploadResumesTheLrScheduleAtItsSteps) {
  // An lr warm-up over 10 updates: every update has its own rate.
  ShardOptions o = AdamOptions();
  o.lr_warmup_updates = 10;
  o.lr_warmup_start = 0.1f;
  ShardHarness a(o);
  Register(a);
  const auto& mine = a.shard->layout()->shard_chunks(0);
  auto push_all = [&](ShardHarness& h, int64_t clock, float g) {
    std::vector<ByteView> frames;
    for (uint32_t id : mine)
      frames.push_back(Floats(Fill(h.ChunkElems(id), g)));
    ReplyHeader r = h.Call(ShardHarness::Push(0, clock, mine, frames), frames);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  };
  for (int step = 0; step < 3; ++step) push_all(a, step, 0.1f * (step + 1));
  ASSERT_EQ(a.shard->shard_version(), 3u);
  const std::vector<ChunkState> saved = ReadState(a);
  // A fresh shard given a's values and state continues a's schedule: the
  // next update of both is the same, bitwise (at version 0 its rate would
  // be the warm-up's first).
  ShardHarness b(o);
  Register(b);
  UploadWithState(b, 100, saved);
  EXPECT_EQ(b.shard->shard_version(), 3u);
  UploadWithState(a, 200, saved);
  EXPECT_EQ(a.shard->shard_version(), 3u);
  push_all(a, 3, 0.7f);
  push_all(b, 0, 0.7f);
  EXPECT_EQ(a.AllWeights(), b.AllWeights());
  // Steps that differ by chunk: the largest counts.
  UploadWithState(b, 300, MadeState(b, mine, 2));
  EXPECT_EQ(b.shard->shard_version(), 5u + mine.size() - 1);
  // An upload without state restarts the optimizer and the schedule.
  UploadValues(b, 400, 1.0f);
  EXPECT_EQ(b.shard->shard_version(), 0u);
}

TEST(ShardAssignTest, HostileStateUploadsAreRefusedAndChangeNothing) {
  ShardHarness h(AdamOptions());
  Register(h);
  const auto& mine = h.shard->layout()->shard_chunks(0);
  uint32_t theirs = 0;
  while (h.shard->weights(theirs) != nullptr) ++theirs;
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kBegin)).created);
  const auto weights = h.AllWeights();  // weights and optimizer state
  const auto state = ReadState(h);
  // `data` by reference: State(..., &d) fills it while the arguments are
  // evaluated.
  auto expect_refused = [&](const RequestHeader& req,
                            const std::vector<ByteView>& data, RejectReason why,
                            const std::string& says) {
    const uint64_t was = Rejected(h, why);
    ReplyHeader r = h.Call(req, data);
    EXPECT_FALSE(r.status.ok());
    EXPECT_EQ(Rejected(h, why), was + 1) << r.status.ToString();
    EXPECT_NE(r.status.message().find(says), std::string::npos)
        << r.status.ToString();
    EXPECT_EQ(h.AllWeights(), weights);  // the good first chunk untouched
    EXPECT_EQ(ReadState(h), state);      // steps too
  };
  std::vector<ByteView> d;
  // k = 1 floats per weight for Adam's 2.
  expect_refused(State(0, 7, 100, "adam", MadeState(h, mine, 1), &d), d,
                 RejectReason::kOptimizerState, "floats per weight");
  // A short frame (and a ref that says so).
  d.clear();
  RequestHeader req = State(0, 7, 100, "adam", MadeState(h, mine, 2), &d);
  d.back() = Floats(Fill(3, 1.0f));
  req.chunks.back().byte_size = 3 * sizeof(float);
  expect_refused(req, d, RejectReason::kSizeMismatch, "bytes");
  // NaN in the last chunk.
  d.clear();
  auto nan = MadeState(h, mine, 2);
  nan.back().state.back() = std::numeric_limits<float>::quiet_NaN();
  expect_refused(State(0, 7, 100, "adam", nan, &d), d, RejectReason::kNonFinite,
                 "NaN");
  // A negative second moment.
  d.clear();
  auto negative = MadeState(h, mine, 2);
  negative.back().state.back() = -1.0f;
  expect_refused(State(0, 7, 100, "adam", negative, &d), d,
                 RejectReason::kOptimizerState, "sum of squares");
  // Another shard's chunk.
  d.clear();
  expect_refused(
      State(0, 7, 100, "adam", MadeState(h, {mine[0], theirs}, 2), &d), d,
      RejectReason::kWrongShard, "another shard");
  // A chunk named twice.
  d.clear();
  expect_refused(
      State(0, 7, 100, "adam", MadeState(h, {mine[0], mine[0]}, 2), &d), d,
      RejectReason::kRepeatedChunk, "twice");
  // More steps than 2^53.
  d.clear();
  auto huge = MadeState(h, mine, 2);
  huge.back().steps = (uint64_t{1} << 53) + 1;
  expect_refused(State(0, 7, 100, "adam", huge, &d), d,
                 RejectReason::kOptimizerState, "2^53");
  // Saved from another optimizer (the same k floats): named, refused.
  d.clear();
  expect_refused(State(0, 7, 100, "adagrad", MadeState(h, mine, 2), &d), d,
                 RejectReason::kOptimizerState,
                 "tensor 'w' (chunk " + std::to_string(mine[0]) +
                     ") was saved from 'adagrad', this shard runs 'adam'");
  // Without the claim.
  d.clear();
  expect_refused(State(1, 8, 200, "adam", MadeState(h, mine, 2), &d), d,
                 RejectReason::kUploadClaim, "begin first");
  // Half a state is never made final: the commit is refused until every
  // chunk's state came (or the next claimant's upload resets it).
  d.clear();
  const auto good = MadeState(h, mine, 2);
  req = State(0, 7, 100, "adam", {good[0]}, &d);
  ASSERT_TRUE(h.Call(req, d).status.ok());
  ReplyHeader r = h.Call(Assign(0, 7, 100, AssignOp::kCommit));
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status.message().find("1 of this shard's"), std::string::npos)
      << r.status.ToString();
  d.clear();
  req = State(0, 7, 100, "adam", good, &d);
  ASSERT_TRUE(h.Call(req, d).status.ok());
  ASSERT_TRUE(h.Call(Assign(0, 7, 100, AssignOp::kCommit)).status.ok());
  EXPECT_EQ(ReadState(h), good);

  // Adam's state into an SGD shard: refused, naming the tensor.
  ShardHarness sgd(testing::TestOptions(Consistency::kAsp, 2));
  Register(sgd);
  ASSERT_TRUE(sgd.Call(Assign(0, 7, 100, AssignOp::kBegin)).created);
  d.clear();
  req = State(0, 7, 100, "adam", MadeState(sgd, mine, 2), &d);
  r = sgd.Call(req, d);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("tensor 'w'"), std::string::npos)
      << r.status.ToString();
  EXPECT_NE(r.status.message().find("this shard runs 'sgd'"),
            std::string::npos);
  EXPECT_EQ(Rejected(sgd, RejectReason::kOptimizerState), 1u);
}

TEST(ShardAssignTest, UploadedStateSurvivesARestart) {
  MemStore store;
  std::vector<ChunkState> saved;
  std::vector<std::vector<float>> weights;
  {
    ShardHarness a(AdamOptions(), &store);
    Register(a);
    saved = MadeState(a, a.shard->layout()->shard_chunks(0), 2);
    UploadWithState(a, 100, saved);  // the commit checkpoints
    weights = a.AllWeights();
  }
  ShardHarness b(AdamOptions(), &store);
  ASSERT_TRUE(b.shard->registered());
  EXPECT_EQ(ReadState(b), saved);
  EXPECT_EQ(b.AllWeights(), weights);
}

}  // namespace
}  // namespace asyncps::server
