// The vectorised, range-split optimizer loops and the shard's multi-threaded
// apply give bitwise the same weights as one plain scalar pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "server/optimizer/optimizer.h"
#include "server/shard/shard.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Floats;
using testing::ShardHarness;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

std::vector<float> Random(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  // Values of every magnitude: tiny, huge-ish, signed zeros.
  if (n > 8) {
    v[1] = 1e-30f;
    v[3] = -0.0f;
    v[5] = 3e4f;
    v[7] = -1e-38f;
  }
  return v;
}

std::vector<OptimizerOptions> AllRules() {
  std::vector<OptimizerOptions> all;
  for (int k = 0; k < 6; ++k) {
    OptimizerOptions o;
    o.lr = 0.01f;
    switch (k) {
      case 0:
        o.kind = OptimizerKind::kSgd;
        break;
      case 1:
        o.kind = OptimizerKind::kSgd;
        o.weight_decay = 0.01f;
        break;
      case 2:
        o.kind = OptimizerKind::kMomentum;
        o.weight_decay = 0.001f;
        break;
      case 3:
        o.kind = OptimizerKind::kMomentum;
        o.nesterov = true;
        break;
      case 4:
        o.kind = OptimizerKind::kAdam;
        o.weight_decay = 0.001f;
        break;
      default:
        o.kind = OptimizerKind::kAdaGrad;
        break;
    }
    all.push_back(o);
  }
  return all;
}

// One step of the rule written out element by element in plain scalar code
// (the reference the vectorised clones must match bit for bit).
void Reference(const OptimizerOptions& o, std::vector<float>& w,
               std::vector<float>& st, const std::vector<float>& g,
               uint64_t step) {
  const size_t n = w.size();
  const float a = o.lr;
  const float wd = o.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    switch (o.kind) {
      case OptimizerKind::kSgd:
        if (wd == 0.0f) {
          w[i] -= a * g[i];
        } else {
          w[i] -= a * (g[i] + wd * w[i]);
        }
        break;
      case OptimizerKind::kMomentum: {
        const float gi = g[i] + wd * w[i];
        const float vi = o.momentum * st[i] + gi;
        st[i] = vi;
        w[i] -= o.nesterov ? a * (gi + o.momentum * vi) : a * vi;
        break;
      }
      case OptimizerKind::kAdam: {
        const double t = static_cast<double>(step);
        const float c1 =
            static_cast<float>(o.lr / (1.0 - std::pow(double{o.beta1}, t)));
        const float c2 =
            static_cast<float>(1.0 / (1.0 - std::pow(double{o.beta2}, t)));
        const float gi = g[i] + wd * w[i];
        const float mi = o.beta1 * st[i] + (1.0f - o.beta1) * gi;
        const float vi = o.beta2 * st[n + i] + (1.0f - o.beta2) * gi * gi;
        st[i] = mi;
        st[n + i] = vi;
        w[i] -= c1 * mi / (std::sqrt(vi * c2) + o.eps);
        break;
      }
      case OptimizerKind::kAdaGrad: {
        const float gi = g[i] + wd * w[i];
        const float hi = st[i] + gi * gi;
        st[i] = hi;
        w[i] -= a * gi / (std::sqrt(hi) + o.eps);
        break;
      }
    }
  }
}

TEST(OptimizerVectorTest, EqualsScalarReferenceBitwise) {
  for (const OptimizerOptions& o : AllRules()) {
    auto opt = Optimizer::Create(o);
    ASSERT_TRUE(opt.ok());
    const size_t n = 1037;  // vector bodies and a scalar tail
    std::vector<float> w = Random(n, 1, 1.0f), ref_w = w;
    std::vector<float> st(n * (*opt)->state_per_elem(), 0.0f), ref_st = st;
    for (uint64_t step = 1; step <= 4; ++step) {
      const std::vector<float> g = Random(n, 10 + step, 0.1f);
      (*opt)->Apply(w.data(), st.data(), g.data(), n, 1.0f, step);
      Reference(o, ref_w, ref_st, g, step);
      ASSERT_TRUE(SameBits(w, ref_w)) << o.ToString() << " step " << step;
      ASSERT_TRUE(SameBits(st, ref_st)) << o.ToString() << " step " << step;
    }
  }
}

TEST(OptimizerVectorTest, RangesEqualTheWholeChunkBitwise) {
  for (const OptimizerOptions& o : AllRules()) {
    auto opt = Optimizer::Create(o);
    ASSERT_TRUE(opt.ok());
    const size_t n = 4099;
    std::vector<float> w = Random(n, 2, 1.0f), split_w = w;
    std::vector<float> st(n * (*opt)->state_per_elem(), 0.0f), split_st = st;
    // Unaligned, uneven cuts, applied out of order.
    const std::vector<size_t> cuts = {0, 3, 17, 1000, 1001, 2048, 4099};
    for (uint64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = Random(n, 20 + step, 0.1f);
      (*opt)->Apply(w.data(), st.data(), g.data(), n, 0.5f, step);
      for (size_t k = cuts.size() - 1; k > 0; --k) {
        (*opt)->ApplyRange(split_w.data(), split_st.data(), g.data(), n,
                           cuts[k - 1], cuts[k], 0.5f, step);
      }
      ASSERT_TRUE(SameBits(w, split_w)) << o.ToString();
      ASSERT_TRUE(SameBits(st, split_st)) << o.ToString();
    }
  }
}

// A model whose chunks are cut into several apply pieces (65,536 elements)
// with uneven ends: "big" 300,001 floats in chunks of 150,000, "small" 33.
std::vector<TensorSpec> Model() {
  return {TensorSpec{"big", {300001}, InitKind::kUniform, 0.1f, 3},
          TensorSpec{"small", {33}, InitKind::kConstant, 0.5f, 1}};
}

LayoutOptions Layout1() {
  LayoutOptions l;
  l.chunk_elems = 150000;
  l.min_chunk_elems = 16;
  l.num_shards = 1;
  return l;
}

ShardOptions ThreadOptions(Consistency c, const OptimizerOptions& opt,
                           int threads) {
  ShardOptions o;
  o.num_shards = 1;
  o.num_workers = 2;
  o.consistency = c;
  o.optimizer = opt;
  o.apply_threads = threads;
  o.parallel_apply_min_elems = 1;  // every push takes the parallel path
  return o;
}

// Runs the same pushes through a shard with `threads` apply threads and
// returns every chunk's weights and optimizer state.
std::vector<std::vector<float>> Train(Consistency c, const OptimizerOptions& o,
                                      int threads) {
  ShardHarness h(ThreadOptions(c, o, threads));
  EXPECT_TRUE(
      h.Call(ShardHarness::Register(0, Model(), Layout1())).status.ok());
  const Layout& layout = *h.shard->layout();
  for (int64_t step = 0; step < 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<uint32_t> ids;
      std::vector<ByteView> frames;
      for (const ChunkSpec& cs : layout.chunks()) {
        ids.push_back(cs.id);
        frames.push_back(Floats(
            Random(cs.num_elems, 1000 * step + 10 * rank + cs.id, 0.1f)));
      }
      ReplyHeader r =
          h.Call(ShardHarness::Push(rank, step, ids, frames), frames);
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      r = h.Call(ShardHarness::Clock(rank, step + 1));
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }
  EXPECT_GT(h.shard->shard_version(), 0u);
  return h.AllWeights();
}

TEST(ApplyThreadsTest, WeightsAreBitwiseIndependentOfTheThreadCount) {
  for (Consistency c : {Consistency::kAsp, Consistency::kBsp}) {
    for (const OptimizerOptions& o : AllRules()) {
      const auto one = Train(c, o, 1);
      for (int threads : {2, 3, 5}) {
        const auto many = Train(c, o, threads);
        ASSERT_EQ(one.size(), many.size());
        for (size_t i = 0; i < one.size(); ++i) {
          EXPECT_TRUE(SameBits(one[i], many[i]))
              << ConsistencyName(c) << " " << o.ToString() << ", " << threads
              << " threads, chunk entry " << i;
        }
      }
    }
  }
}

TEST(ApplyThreadsTest, BadLastChunkLeavesEveryChunkUntouched) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  ShardHarness h(ThreadOptions(Consistency::kAsp, o, 3));
  ASSERT_TRUE(
      h.Call(ShardHarness::Register(0, Model(), Layout1())).status.ok());
  const auto before = h.AllWeights();
  std::vector<uint32_t> ids;
  std::vector<ByteView> frames;
  for (const ChunkSpec& cs : h.shard->layout()->chunks()) {
    std::vector<float> g = Random(cs.num_elems, cs.id, 0.1f);
    if (cs.id + 1 == h.shard->layout()->chunks().size()) {
      g.back() = std::nanf("");
    }
    ids.push_back(cs.id);
    frames.push_back(Floats(g));
  }
  ReplyHeader r = h.Call(ShardHarness::Push(0, 0, ids, frames), frames);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  const auto after = h.AllWeights();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(SameBits(before[i], after[i])) << i;
  }
  EXPECT_EQ(h.shard->shard_version(), 0u);
}

TEST(ApplyThreadsTest, TheFirstBadChunkInRequestOrderIsReported) {
  // A NaN in the first chunk and a wrong size in the third: the NaN is
  // reported, as a chunk-by-chunk check would, with any thread count.
  for (int threads : {1, 3}) {
    ShardHarness h(
        ThreadOptions(Consistency::kAsp, OptimizerOptions(), threads));
    ASSERT_TRUE(
        h.Call(ShardHarness::Register(0, Model(), Layout1())).status.ok());
    const auto& chunks = h.shard->layout()->chunks();
    ASSERT_GE(chunks.size(), 3u);
    std::vector<uint32_t> ids;
    std::vector<ByteView> frames;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<float> g(chunks[i].num_elems - (i == 2 ? 1 : 0), 0.5f);
      if (i == 0) g[70000] = std::numeric_limits<float>::infinity();
      ids.push_back(chunks[i].id);
      frames.push_back(Floats(g));
    }
    RequestHeader push = ShardHarness::Push(0, 0, ids, frames);
    push.chunks[2].num_elems =
        chunks[2].num_elems;  // header right, frame short
    ReplyHeader r = h.Call(push, frames);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("chunk " + std::to_string(chunks[0].id) +
                                      ": gradient contains NaN or Inf"),
              std::string::npos)
        << r.status.message();
    EXPECT_EQ(h.shard->counters()
                  .rejected[static_cast<size_t>(RejectReason::kNonFinite)],
              1u);
    EXPECT_EQ(h.shard->shard_version(), 0u);
  }
}

TEST(ApplyThreadsTest, RejectsBadThreadCounts) {
  ShardOptions o;
  o.apply_threads = 0;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.apply_threads = 257;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.apply_threads = 4;
  EXPECT_TRUE(o.Validate().ok());
}

}  // namespace
}  // namespace asyncps::server
