// OverlapScheduler: the LayeredStep (worker/layered_step.h) over the
// parameter-server shards, for ps_worker --overlap. The C++ counterpart of
// worker/python/asyncps/overlap.py, built on the same PsParameterStore calls:
//
//  - Pushes during backward. Once a layer's gradients are complete, what is
//    ready goes out at once (PsParameterStore::PushSubset), on the trainer's
//    thread, while backward goes on with the layers below. Buckets:
//    kPerShard (required under BSP, where a shard counts one push per worker
//    and round): a shard's chunks go in one push as soon as every tensor
//    with a chunk on that shard is ready; kPerLayer (ASP/SSP): each layer's
//    chunks as soon as the layer is done. The values pushed are those of
//    the plain step, so BSP results are bitwise equal.
//  - Per-shard clocks. As soon as every chunk of a shard was pushed, that
//    shard gets clock + 1 and, behind it on its connection, its part of
//    each pull group (PsParameterStore::ClockShardsAndPullGroups), so its
//    round can close and its weights come down while the next shard's push
//    goes up. With pipeline_shards = k > 0, once k shards were clocked the
//    next push first waits until the pushes sent since the last wait have
//    arrived (PsParameterStore::StartReceipts right behind each push,
//    WaitReceipts): pushes started together share the link and all arrive
//    at the end. It waits for their arrival, not their acknowledgement,
//    which a replicated primary holds until the round closed and its
//    backups have it.
//    EndStep clocks the shards left
//    (ClockAndPullGroups).
//  - Pulls by layer groups in forward order (P3): consecutive layers merged
//    until a group holds min_pull_group_bytes (a smaller rest joins the
//    last group); WaitLayer(l) waits only for the groups up to layer l's.
//
//  - A sender thread (OverlapOptions::sender_thread): the pushes above
//    (compression with a push codec, the stage waits and the per-shard
//    clocks) run on a thread of the scheduler's own, as asyncps.overlap's
//    sender does, so a bucket is compressed and sent while backward goes
//    on with the layers below instead of between them. Buckets go in the
//    order they were ready; EndStep waits until the last one left.
//
// Needs raw pulls, prefetch_ahead off and a fixed layout (no elastic fleet):
// the store refuses otherwise (FailedPrecondition), ps_worker checks first.
//
// Ownership: borrows the store, which must outlive the scheduler.
// Thread safety: the trainer's thread only. With a sender thread the store
// is used by that thread between BeginBackward and the end of EndStep's
// wait for it, and by the trainer's thread otherwise, never by both.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "common/layout.h"
#include "common/mutex.h"
#include "worker/layered_step.h"
#include "worker/ps_store.h"

namespace asyncps::worker {

enum class PushBuckets {
  kPerShard,  // one push per shard and step (BSP)
  kPerLayer,  // each layer's chunks once the layer is done (ASP, SSP)
};

struct OverlapOptions {
  // The tensors of each layer, layers in forward order (MLP: {{0, 1},
  // {2, 3}, ...}); every tensor of the layout in exactly one layer.
  // Required.
  std::vector<std::vector<uint32_t>> layers;
  // How gradients are cut into pushes. Default: kPerShard.
  PushBuckets buckets = PushBuckets::kPerShard;
  // Pull groups: consecutive layers merged until a group holds at least
  // this many bytes (a smaller rest joins the last group). Default: 64 KiB.
  size_t min_pull_group_bytes = size_t{64} << 10;
  // Shards clocked before the next push waits for the acknowledgements of
  // those in flight (see above); 0 = never wait. Default: 0.
  int pipeline_shards = 0;
  // Pushes from a thread of the scheduler's own (see above). Default: false.
  bool sender_thread = false;
};

// Counters since creation.
struct OverlapStats {
  int64_t steps = 0;          // EndStep calls
  int64_t pushes = 0;         // PushSubset calls
  int64_t shard_clocks = 0;   // ClockShardsAndPullGroups calls
  int64_t stage_waits = 0;    // WaitReceipts calls (pipeline_shards)
  int64_t stage_wait_ns = 0;  // time in them
  // sender_thread: EndStep's waits for the sender, and their time (the
  // trainer's thread blocked; the stage waits are the sender's then).
  int64_t sender_waits = 0;
  int64_t sender_wait_ns = 0;
  int64_t pull_groups = 0;  // groups pulled
};

class OverlapScheduler final : public LayeredStep {
 public:
  // `layout` is the client's (Client::layout()), read only here.
  // InvalidArgument when options.layers do not cover the layout's tensors
  // once each or pipeline_shards < 0.
  static StatusOr<std::unique_ptr<OverlapScheduler>> Create(
      PsParameterStore* store, const Layout& layout,
      const OverlapOptions& options);

  Status BeginBackward(int64_t clock,
                       const std::vector<const float*>& grads) override;
  Status LayerGradientsReady(int layer) override;
  Status EndStep() override;
  bool pull_pending() const override { return pull_pending_; }
  Status WaitLayer(int layer, const std::vector<float*>& tensors) override;
  int64_t uncounted_wait_ns() const override {
    return options_.sender_thread ? stats_.sender_wait_ns
                                  : stats_.stage_wait_ns;
  }
  ~OverlapScheduler() override;

  // The pull groups (chunk ids), in forward order.
  const std::vector<std::vector<uint32_t>>& pull_groups() const {
    return groups_;
  }
  const OverlapStats& stats() const { return stats_; }

 private:
  OverlapScheduler() = default;
  // Pushes `chunks` (pipeline wait first) and clocks the shards whose
  // chunks were then all pushed.
  Status SendBucket(const std::vector<uint32_t>& chunks);
  // SendBucket now, or on the sender thread (`chunks` must outlive the
  // step: a member's). An error of an earlier bucket is returned here.
  Status Dispatch(const std::vector<uint32_t>* chunks);
  // Waits until the sender thread sent every bucket handed to it; the
  // first error of this step's buckets.
  Status WaitForSender();
  void SenderLoop();

  PsParameterStore* store_ = nullptr;
  OverlapOptions options_;
  int num_shards_ = 0;
  std::vector<int> chunk_shard_;                     // by chunk id
  std::vector<std::vector<uint32_t>> layer_chunks_;  // by layer
  std::vector<std::vector<uint32_t>> shard_chunks_;  // by shard
  std::vector<int> tensor_layer_;                    // by tensor
  // Per shard: the layers holding a tensor with a chunk on it.
  std::vector<std::vector<int>> shard_layers_;
  std::vector<std::vector<uint32_t>> groups_;  // pull groups, forward order
  std::vector<size_t> layer_group_;            // group holding each layer
  // The step in progress.
  int64_t clock_ = -1;
  bool in_step_ = false;
  std::vector<const float*> grads_;
  std::vector<bool> layer_ready_;
  std::vector<bool> layer_sent_;      // kPerLayer
  std::vector<bool> shard_sent_;      // kPerShard
  std::vector<size_t> shard_unsent_;  // chunks of each shard not pushed
  int stage_clocked_ = 0;      // shards clocked since the last stage wait
  std::vector<bool> in_push_;  // per shard: scratch of SendBucket
  // The pull by groups in flight.
  bool pull_pending_ = false;
  size_t groups_waited_ = 0;
  OverlapStats stats_;
  // The sender thread (sender_thread): buckets in order, the one it is
  // sending, and the first error of the step; all under mu_.
  std::thread sender_;
  Mutex mu_;
  CondVar cv_;
  std::deque<const std::vector<uint32_t>*> queue_ GUARDED_BY(mu_);
  bool sending_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  Status send_error_ GUARDED_BY(mu_);
};

}  // namespace asyncps::worker
