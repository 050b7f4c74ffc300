// Shard: push validation (phase 1) and apply (phase 2), BSP rounds.
//
// A push is validated completely before anything is applied: every frame
// index, chunk id, owner, element count, byte size and codec payload is
// checked, compressed payloads are decoded into the chunk's scratch buffer
// and every gradient is checked for NaN/Inf. Only then is any chunk
// updated, so a bad push never leaves half an update behind.
//
// Worker-set lr: a push or clock whose lr is > 0 must have lr <= max_lr
// (else it is refused, nothing of it applied); it then replaces the flags'
// lr and schedule for that update and every later one (ScheduleScale()).
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "compression/codec.h"
#include "server/internal/all_finite.h"
#include "server/internal/push_dedup.h"
#include "server/internal/task_pool.h"
#include "server/shard/shard.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ASYNCPS_NO_IFUNC)
__attribute__((target_clones("avx2", "default")))
#endif
void AddInto(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ASYNCPS_NO_IFUNC)
__attribute__((target_clones("avx2", "default")))
#endif
void DivideBy(float* __restrict__ x, float k, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / k;
}

// Elements per piece of the parallel apply: large enough that handing one
// out costs nothing next to its update, small enough to balance threads.
constexpr size_t kPieceElems = size_t{1} << 16;

std::string ChunkName(uint32_t id) { return "chunk " + std::to_string(id); }

}  // namespace

Status Shard::CheckWorkerLr(const RequestHeader& req) {
  if (req.lr == 0.0f) return Status::OK();
  if (!(req.lr > 0.0f) || !std::isfinite(req.lr) || req.lr > options_.max_lr) {
    return Reject(
        RejectReason::kLrOutOfRange,
        Status::InvalidArgument(
            std::string(RequestKindName(req.kind)) + " of rank " +
            std::to_string(req.rank) + " sets lr " + std::to_string(req.lr) +
            ", outside (0, max_lr = " + std::to_string(options_.max_lr) +
            "] (ps_server --max_lr): refused, not clamped"));
  }
  return Status::OK();
}

void Shard::TakeWorkerLr(const RequestHeader& req) {
  if (req.lr > 0.0f) worker_lr_ = req.lr;
}

Status Shard::HandlePush(const RequestHeader& req,
                         const std::vector<ByteView>& data,
                         ReplyHeader* reply) {
  const int rank = req.rank;
  reply->staleness = -1;
  if (!layout_) {
    return Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: register first"));
  }
  if (degraded_) {
    // Also a retry of the push whose durable write failed: it is applied in
    // memory, and acknowledged only once a checkpoint has stored it.
    return Reject(RejectReason::kStore,
                  Status::Unavailable("the store is failing: pushes wait "
                                      "until a checkpoint succeeds; retry"));
  }
  using Verdict = internal::PushDedup::Verdict;
  const Verdict seen = dedup_->Check(rank, req.incarnation, req.id);
  if (seen != Verdict::kNew) {
    // Applied already (a resend), or a late copy of a push the client has
    // finished with: acknowledge, never apply twice.
    ++counters_.duplicate_pushes;
    return Status::OK();
  }
  // Elastic shards: routed by this layout, and not held back by a move.
  RETURN_IF_ERROR(CheckRoute(req, reply));
  RETURN_IF_ERROR(CheckFrozen(req, reply));
  RETURN_IF_ERROR(CheckWorkerLr(req));
  const auto decode_start = std::chrono::steady_clock::now();
  // A backup replaying a round record has the header alone: the round's
  // sums came with the record (shard_round_sums.cc).
  RETURN_IF_ERROR(replay_headers_ ? ReplayPushRefs(req)
                                  : ValidatePush(req, data));
  counters_.validate_decode_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - decode_start)
          .count());
  const bool bsp = options_.consistency == Consistency::kBsp;
  // Hybrid (sparse_async): rows arrive on their own and are applied now.
  const bool rows_only_async = bsp && options_.sparse_async && pending_.empty();
  const bool counted = bsp && !options_.transport_only && !rows_only_async &&
                       !(pending_.empty() && rows_->pending.empty());
  if (counted && req.clock > bsp_round_ && PushedThisRound(rank)) {
    // A push for a later round from a rank that pushed for this one: the
    // round has not closed here although the worker saw it closed (a
    // backup promoted before it applied the round's last pushes, whose
    // resends are on their way). Held, nothing applied: the client sends
    // it again after retry_ms (its clock waits behind it) and it counts for
    // the next round, as on the shard that went away.
    reply->retry_ms = internal::kRetryMs;
    return Reject(
        RejectReason::kWrongClock,
        Status::Unavailable("push of rank " + std::to_string(rank) +
                            " for clock " + std::to_string(req.clock) +
                            " waits: round " + std::to_string(bsp_round_) +
                            " is still open here; retry"));
  }
  clocks_.Advance(rank, req.clock);
  touched_.clear();
  if (pending_.empty() && rows_->pending.empty()) {
    // Nothing to apply: no update, no version, no step of the schedule.
    return FinishPush(req);
  }
  if (counted && (req.clock < bsp_round_ || PushedThisRound(rank))) {
    // A worker that fell behind the round (evicted, late, restarted), or a
    // second push of one rank for this round: acknowledged, not counted.
    // The worker reads the round in its next pull reply and catches up.
    ++counters_.skipped_pushes;
    LOG_EVERY_N(INFO, 100) << "BSP: push of rank " << rank << " for clock "
                           << req.clock << " not counted (round " << bsp_round_
                           << ", "
                           << (req.clock < bsp_round_ ? "behind"
                                                      : "already pushed")
                           << ")";
    return FinishPush(req);
  }
  // Refused before anything of the push is applied or counted.
  if (bsp && !options_.transport_only)
    RETURN_IF_ERROR(sparse_requests_->ChargeRound());
  if ((!bsp || options_.sparse_async) && !options_.transport_only)
    RETURN_IF_ERROR(sparse_requests_->HoldPush());

  uint64_t bytes = 0;
  for (const ByteView& f : data) bytes += f.size;
  ++counters_.pushes;
  counters_.bytes_in += bytes;
  for (const PendingGrad& p : pending_) {
    counters_.bytes_in_raw += p.chunk->n * sizeof(float);
  }
  for (const PendingRows& p : rows_->pending) {
    counters_.bytes_in_raw +=
        p.n *
        (sizeof(uint64_t) + sparse_->specs()[p.table].dim * sizeof(float));
  }
  if (options_.transport_only) return FinishPush(req);
  const uint64_t read = last_read_[rank];
  const uint64_t staleness = shard_version_ >= read ? shard_version_ - read : 0;
  staleness_.Add(staleness);
  reply->staleness = static_cast<int64_t>(staleness);
  if (bsp) {
    // A clock past the round (the shard restarted from an older state)
    // counts for the round the shard is in.
    BeginWork();
    for (const PendingGrad& p : pending_) {
      Chunk& c = *p.chunk;
      if (p.dense != nullptr) AddWork(&c, p.dense);  // none when replayed
      ++c.contributors;
      c.pushed_round[rank] = bsp_round_;
      touched_.push_back(&c);
    }
    RunWork([](WorkPiece& w) {
      AddInto(w.chunk->acc.data() + w.begin, w.g + w.begin, w.end - w.begin);
    });
    if (!rows_only_async) bsp_pushed_round_[rank] = bsp_round_;
  }
  TakeWorkerLr(req);
  const float lr_scale =
      ScheduleScale() * StalenessLrScale(options_.staleness_lr, staleness);
  if (!bsp) {
    if (options_.delay_compensation.enabled()) CompensatePending(req);
    ApplyPending(rank, lr_scale);
    ++shard_version_;
  }
  // Rows: applied (BSP: summed) after the chunks; only write-backs can fail.
  Status rows = sparse_requests_->ApplyPush(req.rank, req.clock, lr_scale);
  if (!rows.ok()) {
    LOG(ERROR) << "push " << req.id << " from rank " << rank
               << ": sparse rows: " << rows.ToString();
    sparse_->CommitDurable(false);  // unpin: the rows stay dirty in memory
    // Applied in memory: a resend is a duplicate. Nothing is written now:
    // the record reaches the store only with the rows, in the checkpoint
    // that ends the degraded state (pushes are refused until then).
    RecordPush(req);
    EnterDegraded(rows);
    return Reject(RejectReason::kStore,
                  Status::Unavailable("push applied in memory but a row "
                                      "write-back failed: " +
                                      rows.ToString()));
  }
  return FinishPush(req);
}

bool Shard::PushedThisRound(int rank) const {
  if (bsp_pushed_round_[rank] != bsp_round_) return false;
  // This rank pushed for the round already. Another push of it is a second
  // one unless it carries only chunks the first did not (the pieces of one
  // push that an elastic layout change re-routed), and only rows of keys it
  // did not push (likewise: a push of rows split by their new owners).
  for (const PendingGrad& p : pending_) {
    if (p.chunk->pushed_round[rank] == bsp_round_) return true;
  }
  for (const PendingRows& p : rows_->pending) {
    if (sparse_->PushedInRound(rank, p.table, rows_->keys.data() + p.keys_at,
                               p.n))
      return true;
  }
  return false;
}

void Shard::RecordPush(const RequestHeader& req) {
  dedup_->RaiseFloor(req.rank, req.incarnation, req.done_below);
  dedup_->Record(req.rank, req.incarnation, req.id);
}

Status Shard::FinishPush(const RequestHeader& req) {
  // Recorded before the durable write, so the write holds it with the
  // weights it changed (a resend after a crash is then a duplicate).
  RecordPush(req);
  if (!options_.durable || store_ == nullptr) return Status::OK();
  Status s = WriteDurable(options_.durable_sync == SyncMode::kSync);
  if (s.ok()) return s;
  LOG(ERROR) << "durable write of push " << req.id << " from rank " << req.rank
             << " failed: " << s.ToString();
  EnterDegraded(s);
  return Reject(
      RejectReason::kStore,
      Status::Unavailable("push applied in memory but not persisted: " +
                          s.ToString()));
}

Status Shard::ValidatePushFrames(const RequestHeader& req,
                                 const std::vector<ByteView>& data) {
  pending_.clear();
  ++stamp_;
  if (data.size() != req.chunks.size() + 2 * req.rows.size()) {
    return Reject(RejectReason::kSizeMismatch,
                  Status::InvalidArgument(
                      "push carries " + std::to_string(data.size()) +
                      " data frames for " + std::to_string(req.chunks.size()) +
                      " chunk refs and " + std::to_string(req.rows.size()) +
                      " row refs (2 frames each)"));
  }
  if (frame_stamp_.size() < data.size()) frame_stamp_.resize(data.size(), 0);
  const size_t num_chunks = layout_->chunks().size();
  for (const ChunkRef& ref : req.chunks) {
    if (ref.frame < 1 || ref.frame > data.size()) {
      return Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument("frame index " + std::to_string(ref.frame) +
                                  " out of range [1, " +
                                  std::to_string(data.size()) + "]"));
    }
    if (frame_stamp_[ref.frame - 1] == stamp_) {
      return Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument("frame " + std::to_string(ref.frame) +
                                  " referenced twice"));
    }
    frame_stamp_[ref.frame - 1] = stamp_;
    if (ref.chunk >= num_chunks) {
      return Reject(
          RejectReason::kUnknownChunk,
          Status::NotFound("unknown " + ChunkName(ref.chunk) + " (layout has " +
                           std::to_string(num_chunks) + ")"));
    }
    if (local_index_[ref.chunk] < 0) {
      return Reject(RejectReason::kWrongShard,
                    Status::InvalidArgument(
                        ChunkName(ref.chunk) + " belongs to shard " +
                        std::to_string(layout_->chunks()[ref.chunk].shard) +
                        ", not " + std::to_string(options_.shard_id)));
    }
    Chunk& c = *chunks_[local_index_[ref.chunk]];
    if (c.stamp == stamp_) {
      return Reject(RejectReason::kOther,
                    Status::InvalidArgument(ChunkName(ref.chunk) +
                                            " pushed twice in one push"));
    }
    c.stamp = stamp_;
    if (ref.num_elems != c.n) {
      return Reject(RejectReason::kSizeMismatch,
                    Status::InvalidArgument(ChunkName(ref.chunk) + " has " +
                                            std::to_string(c.n) +
                                            " elements, the push says " +
                                            std::to_string(ref.num_elems)));
    }
    const ByteView& f = data[ref.frame - 1];
    if (ref.byte_size != f.size) {
      return Reject(RejectReason::kSizeMismatch,
                    Status::InvalidArgument(
                        ChunkName(ref.chunk) + ": header says " +
                        std::to_string(ref.byte_size) + " bytes, frame has " +
                        std::to_string(f.size)));
    }
    PendingGrad p;
    p.chunk = &c;
    p.bytes = f.size;
    if (ref.codec == 0) {
      if (f.size != c.n * sizeof(float)) {
        return Reject(RejectReason::kSizeMismatch,
                      Status::InvalidArgument(
                          ChunkName(ref.chunk) + ": raw fp32 payload of " +
                          std::to_string(f.size) + " bytes, expected " +
                          std::to_string(c.n * sizeof(float))));
      }
      if (reinterpret_cast<uintptr_t>(f.data) % alignof(float) == 0) {
        p.dense = reinterpret_cast<const float*>(f.data);
      } else {
        // Small frames may sit unaligned inside the zmq message: realign.
        if (c.scratch.size() != c.n) c.scratch.resize(c.n);
        std::memcpy(c.scratch.data(), f.data, f.size);
        p.dense = c.scratch.data();
      }
    } else {
      namespace cz = compression;
      if (ref.codec >= cz::kNumCodecs) {
        return Reject(RejectReason::kBadCodec,
                      Status::InvalidArgument(ChunkName(ref.chunk) +
                                              ": unknown codec id " +
                                              std::to_string(ref.codec)));
      }
      const cz::Codec& codec =
          cz::CodecForId(static_cast<cz::CodecId>(ref.codec));
      if (codec.IsSparse() && optimizer_->exact_sparse() &&
          options_.consistency != Consistency::kBsp &&
          !options_.delay_compensation.enabled()) {
        StatusOr<cz::SparseView> view = cz::ParseSparse(f.data, f.size, c.n);
        if (!view.ok()) {
          return Reject(RejectReason::kBadCodec,
                        view.status().WithContext(ChunkName(ref.chunk)));
        }
        uint32_t bad = 0;
        view->ForEach([&bad](uint32_t, float v) { bad |= !std::isfinite(v); });
        if (bad) {
          return Reject(
              RejectReason::kNonFinite,
              Status::InvalidArgument(ChunkName(ref.chunk) +
                                      ": gradient contains NaN or Inf"));
        }
        p.sparse = f.data;
      } else {
        if (c.scratch.size() != c.n) c.scratch.resize(c.n);
        Status s = codec.Decode(f.data, f.size, c.n, c.scratch.data());
        if (!s.ok())
          return Reject(RejectReason::kBadCodec,
                        s.WithContext(ChunkName(ref.chunk)));
        p.dense = c.scratch.data();
      }
    }
    pending_.push_back(p);
  }
  return sparse_requests_->ValidatePush(req, data);
}

Status Shard::ValidatePush(const RequestHeader& req,
                           const std::vector<ByteView>& data) {
  Status s = ValidatePushFrames(req, data);
  // transport_only applies nothing, so there are no weights to protect:
  // skipping the scan leaves the transport alone in the measurement.
  if (options_.transport_only) return s;
  // The dense gradients that passed (all of them, or those before the
  // chunk that failed) are scanned for NaN/Inf, in pieces on the apply
  // threads; the first bad chunk in request order is the answer, as if the
  // chunks had been checked one by one.
  BeginWork();
  for (const PendingGrad& p : pending_) {
    if (p.dense != nullptr) AddWork(p.chunk, p.dense);
  }
  RunWork([](WorkPiece& w) {
    w.bad = !internal::AllFinite(w.g + w.begin, w.end - w.begin);
  });
  for (const WorkPiece& w : work_) {
    if (w.bad) {
      return Reject(RejectReason::kNonFinite,
                    Status::InvalidArgument(ChunkName(w.chunk->id) +
                                            ": gradient contains NaN or Inf"));
    }
  }
  return s;
}

void Shard::BeginWork() {
  work_.clear();
  work_elems_ = 0;
}

void Shard::AddWork(Chunk* c, const float* g) {
  for (size_t b = 0; b < c->n; b += kPieceElems) {
    WorkPiece w;
    w.chunk = c;
    w.g = g;
    w.begin = b;
    w.end = std::min<size_t>(c->n, b + kPieceElems);
    work_.push_back(w);
  }
  work_elems_ += c->n;
}

void Shard::RunWork(const std::function<void(WorkPiece&)>& fn) {
  if (apply_pool_ && work_elems_ >= options_.parallel_apply_min_elems) {
    apply_pool_->Run(work_.size(), [&](size_t i) { fn(work_[i]); });
  } else {
    for (WorkPiece& w : work_) fn(w);
  }
}

void Shard::ApplyPending(int rank, float lr_scale) {
  // Phase 2: everything was validated, so nothing below can fail. Sparse
  // payloads are scattered here; dense gradients are cut into pieces that
  // the apply threads update in any order (element-wise rules: the result
  // does not depend on who updated which piece).
  BeginWork();
  for (const PendingGrad& p : pending_) {
    Chunk& c = *p.chunk;
    ++c.step;
    if (p.sparse != nullptr) {
      StatusOr<compression::SparseView> view =
          compression::ParseSparse(p.sparse, p.bytes, c.n);
      CHECK(view.ok()) << "payload validated in phase 1";
      sparse_idx_.clear();
      sparse_val_.clear();
      view->ForEach([this](uint32_t i, float v) {
        sparse_idx_.push_back(i);
        sparse_val_.push_back(v);
      });
      optimizer_->ApplySparse(c.w.data(), sparse_idx_.data(),
                              sparse_val_.data(), sparse_idx_.size(), lr_scale);
    } else {
      AddWork(&c, p.dense);
    }
    ++c.version;
    touched_.push_back(&c);
  }
  const Optimizer& opt = *optimizer_;
  RunWork([&opt, lr_scale](WorkPiece& w) {
    Chunk& c = *w.chunk;
    opt.ApplyRange(c.w.data(), c.state.data(), w.g, c.n, w.begin, w.end,
                   lr_scale, c.step);
  });
}

float Shard::ScheduleScale() const {
  // A worker-set lr (CheckWorkerLr above) replaces the flags' lr and schedule.
  if (worker_lr_ > 0.0f) return worker_lr_ / options_.optimizer.lr;
  return schedule_.Scale(shard_version_);
}

Status Shard::ApplyBspRound(int64_t next, bool* applied) {
  *applied = false;
  const bool rows = sparse_ && sparse_->HasRoundSums();
  if (rows) {
    // Every row of the round is read before anything of it is applied.
    Status h = sparse_->HoldRound();
    if (!h.ok()) {
      sparse_->ReleaseHeld();
      return h.WithContext("reading the rows of BSP round " +
                           std::to_string(bsp_round_));
    }
  }
  *applied = true;
  // A replicating primary hands its backups these sums, not the pushes.
  if (capture_rounds_ && AggregatesRounds()) {
    LOG_IF(ERROR, captured_.has_value())
        << "BSP round " << bsp_round_ << " closed before the last one's sums "
        << "were handed on";
    captured_ = CaptureSums();
    captured_->round = next;
  }
  const int64_t applied_round = bsp_round_;
  bsp_round_ = next;
  touched_.clear();
  BeginWork();
  for (auto& cp : chunks_) {
    Chunk& c = *cp;
    if (c.contributors == 0) continue;
    ++c.step;
    AddWork(&c, c.acc.data());
    touched_.push_back(&c);
  }
  // Average of this round's gradients, then one optimizer step, then the
  // accumulator is cleared for the next round; piece by piece.
  const Optimizer& opt = *optimizer_;
  const float lr_scale = ScheduleScale();
  const bool apply = !options_.transport_only;
  RunWork([&opt, lr_scale, apply](WorkPiece& w) {
    Chunk& c = *w.chunk;
    float* acc = c.acc.data();
    DivideBy(acc + w.begin, static_cast<float>(c.contributors),
             w.end - w.begin);
    if (apply) {
      opt.ApplyRange(c.w.data(), c.state.data(), acc, c.n, w.begin, w.end,
                     lr_scale, c.step);
    }
    std::fill(acc + w.begin, acc + w.end, 0.0f);
  });
  for (Chunk* c : touched_) {
    c->contributors = 0;
    ++c->version;
  }
  if (touched_.empty() && !rows) return Status::OK();
  ++shard_version_;
  if (rows) {
    Status s = sparse_->ApplyRound(applied_round, ScheduleScale(),
                                   options_.durable && store_ != nullptr);
    sparse_->ReleaseHeld();
    sparse_requests_->ReleaseRoundCharge();
    if (!s.ok()) {
      sparse_->CommitDurable(false);  // unpin: the rows stay dirty in memory
      return s;
    }
  }
  if (options_.durable && store_ != nullptr) {
    // Written before any pull of the next round is answered.
    return WriteDurable(options_.durable_sync == SyncMode::kSync);
  }
  return Status::OK();
}

}  // namespace asyncps::server
