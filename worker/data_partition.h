// Data partitioning by worker rank, per-epoch shuffling and a prefetching
// batch iterator.
//
// Worker `rank` of `num_workers` owns a fixed partition of the training set
// (a contiguous block or every num_workers-th example). Every epoch the
// partition is shuffled with a permutation that is a pure function of
// (seed, rank, epoch), and the first PartitionSize() examples of the
// shuffled order are cut into batches. PartitionSize() is floor(N / W) for
// every rank, so all workers run the same number of steps per epoch (which
// lock-step consistency modes rely on); the at most one surplus example of a
// partition is simply used in other epochs.
//
// BatchIterator prepares the next batch on a background thread (double
// buffering) while the caller computes on the current one. The Dataset must
// outlive the iterator. A BatchIterator is used from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "worker/idx_reader.h"

namespace asyncps::worker {

enum class PartitionKind {
  kContiguous,  // rank r owns [r*N/W, (r+1)*N/W)
  kStrided,     // rank r owns r, r+W, r+2W, ...
};

struct PartitionOptions {
  int rank = 0;         // This worker, in [0, num_workers). Default: 0.
  int num_workers = 1;  // Default: 1.
  PartitionKind kind = PartitionKind::kStrided;  // Default: strided.
  uint64_t seed = 0;                             // Shuffle seed. Default: 0.
};

// Example indices owned by options.rank, in ascending order. Partitions of
// different ranks are disjoint and together cover [0, n).
Status ValidatePartition(int64_t n, const PartitionOptions& options);
std::vector<int64_t> PartitionIndices(int64_t n,
                                      const PartitionOptions& options);

// Examples each rank uses per epoch: floor(n / num_workers).
int64_t PartitionSize(int64_t n, int num_workers);

// Batches per epoch of each rank: ceil(PartitionSize / batch), or with
// drop_last floor(PartitionSize / batch) (the short last batch is not
// trained on; its examples come up in other epochs' batches, since each
// epoch shuffles the partition anew). 0 for invalid arguments.
int64_t BatchesPerEpoch(int64_t n, int num_workers, int batch, bool drop_last);

// Shuffles `indices` in place with a Fisher-Yates permutation drawn from
// (seed, rank, epoch). Platform-independent (no std::shuffle).
void ShuffleForEpoch(uint64_t seed, int rank, int64_t epoch,
                     std::vector<int64_t>* indices);

// One minibatch, copied out of the dataset.
struct Batch {
  int64_t epoch = 0;  // 0-based epoch
  int64_t index = 0;  // batch index within the epoch
  // Examples in this batch (the last one of an epoch may be short).
  int size = 0;
  std::vector<float> x;    // size x dim floats
  std::vector<uint8_t> y;  // size labels
};

struct BatchOptions {
  PartitionOptions partition;
  int batch_size = 64;  // Examples per batch, >= 1. Default: 64.
  // Drop each epoch's last batch when it is short, so every step sees
  // batch_size examples (a short batch's gradient is noisier, and under BSP
  // it weighs as much as a full one in the round's average). Default: false.
  bool drop_last = false;
  // Prepare the next batch on a background thread. Default: true.
  bool prefetch = true;
};

class BatchIterator {
 public:
  // `data` must outlive the iterator. Fails when the options are invalid or
  // the partition holds fewer than one example (with drop_last: fewer than
  // one batch).
  static StatusOr<std::unique_ptr<BatchIterator>> Create(
      const Dataset* data, const BatchOptions& options);
  ~BatchIterator();
  BatchIterator(const BatchIterator&) = delete;
  BatchIterator& operator=(const BatchIterator&) = delete;

  // Batches per epoch: BatchesPerEpoch(n, num_workers, batch_size,
  // drop_last).
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // Returns the next batch. The pointer stays valid until the next call.
  // Epochs follow each other without end.
  StatusOr<const Batch*> Next();

 private:
  BatchIterator(const Dataset* data, const BatchOptions& options);
  void Fill(int64_t seq, Batch* out);  // seq = global batch number
  void ProducerLoop();

  const Dataset* const data_;
  const BatchOptions options_;
  std::vector<int64_t> partition_;  // owned indices, ascending
  int64_t per_epoch_ = 0;           // PartitionSize
  int64_t batches_per_epoch_ = 0;

  // Producer-side state (touched only by whoever fills: the producer thread
  // or, without prefetch, the caller).
  std::vector<int64_t> order_;  // shuffled partition for order_epoch_
  int64_t order_epoch_ = -1;

  Batch slots_[2];
  int64_t consumed_ = 0;  // batches handed out (caller thread)

  Mutex mu_;
  CondVar cv_;
  bool ready_[2] GUARDED_BY(mu_) = {false, false};
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread producer_;
};

}  // namespace asyncps::worker
