#include "worker/data_partition.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/hash.h"

namespace asyncps::worker {
namespace {

// How long Next() waits for the producer before reporting a stuck loader.
constexpr auto kBatchDeadline = std::chrono::seconds(120);

}  // namespace

Status ValidatePartition(int64_t n, const PartitionOptions& o) {
  if (o.num_workers < 1) {
    return Status::InvalidArgument("num_workers must be >= 1, got " +
                                   std::to_string(o.num_workers));
  }
  if (o.rank < 0 || o.rank >= o.num_workers) {
    return Status::InvalidArgument("rank must be in [0, " +
                                   std::to_string(o.num_workers) + "), got " +
                                   std::to_string(o.rank));
  }
  if (PartitionSize(n, o.num_workers) < 1) {
    return Status::InvalidArgument("dataset of " + std::to_string(n) +
                                   " examples is too small for " +
                                   std::to_string(o.num_workers) + " workers");
  }
  return Status::OK();
}

int64_t PartitionSize(int64_t n, int num_workers) {
  return num_workers < 1 ? 0 : n / num_workers;
}

int64_t BatchesPerEpoch(int64_t n, int num_workers, int batch, bool drop_last) {
  if (batch < 1 || num_workers < 1) return 0;
  const int64_t per = PartitionSize(n, num_workers);
  return drop_last ? per / batch : (per + batch - 1) / batch;
}

std::vector<int64_t> PartitionIndices(int64_t n, const PartitionOptions& o) {
  std::vector<int64_t> out;
  if (o.num_workers < 1 || o.rank < 0 || o.rank >= o.num_workers) return out;
  if (o.kind == PartitionKind::kContiguous) {
    const int64_t begin = n * o.rank / o.num_workers;
    const int64_t end = n * (o.rank + 1) / o.num_workers;
    out.reserve(end - begin);
    for (int64_t i = begin; i < end; ++i) out.push_back(i);
  } else {
    out.reserve(n / o.num_workers + 1);
    for (int64_t i = o.rank; i < n; i += o.num_workers) out.push_back(i);
  }
  return out;
}

void ShuffleForEpoch(uint64_t seed, int rank, int64_t epoch,
                     std::vector<int64_t>* indices) {
  uint64_t state =
      SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(rank)) ^
                 static_cast<uint64_t>(epoch));
  auto& v = *indices;
  for (size_t i = v.size(); i > 1; --i) {
    state = SplitMix64(state);
    // Multiply-shift maps 64 random bits onto [0, i) without modulo bias worth
    // noting.
    const size_t j =
        static_cast<size_t>((static_cast<unsigned __int128>(state) * i) >> 64);
    std::swap(v[i - 1], v[j]);
  }
}

BatchIterator::BatchIterator(const Dataset* data, const BatchOptions& options)
    : data_(data), options_(options) {}

StatusOr<std::unique_ptr<BatchIterator>> BatchIterator::Create(
    const Dataset* data, const BatchOptions& options) {
  if (data == nullptr || data->num_examples < 1) {
    return Status::InvalidArgument("BatchIterator needs a non-empty dataset");
  }
  if (options.batch_size < 1) {
    return Status::InvalidArgument("batch size must be >= 1, got " +
                                   std::to_string(options.batch_size));
  }
  RETURN_IF_ERROR(ValidatePartition(data->num_examples, options.partition));
  const int64_t per_epoch =
      PartitionSize(data->num_examples, options.partition.num_workers);
  if (options.drop_last && per_epoch < options.batch_size) {
    return Status::InvalidArgument(
        "drop_last: a partition of " + std::to_string(per_epoch) +
        " examples is shorter than one batch of " +
        std::to_string(options.batch_size) + ": nothing would be trained");
  }
  std::unique_ptr<BatchIterator> it(new BatchIterator(data, options));
  it->partition_ = PartitionIndices(data->num_examples, options.partition);
  it->per_epoch_ = per_epoch;
  it->batches_per_epoch_ =
      BatchesPerEpoch(data->num_examples, options.partition.num_workers,
                      options.batch_size, options.drop_last);
  const size_t dim = static_cast<size_t>(data->dim());
  for (Batch& b : it->slots_) {
    b.x.resize(static_cast<size_t>(options.batch_size) * dim);
    b.y.resize(options.batch_size);
  }
  if (options.prefetch) {
    it->producer_ = std::thread([p = it.get()] { p->ProducerLoop(); });
  }
  return it;
}

BatchIterator::~BatchIterator() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (producer_.joinable()) producer_.join();
}

void BatchIterator::Fill(int64_t seq, Batch* out) {
  const int64_t epoch = seq / batches_per_epoch_;
  const int64_t index = seq % batches_per_epoch_;
  if (epoch != order_epoch_) {
    order_ = partition_;
    ShuffleForEpoch(options_.partition.seed, options_.partition.rank, epoch,
                    &order_);
    order_epoch_ = epoch;
  }
  const int64_t begin = index * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, per_epoch_);
  const size_t dim = static_cast<size_t>(data_->dim());
  out->epoch = epoch;
  out->index = index;
  out->size = static_cast<int>(end - begin);
  for (int64_t k = begin; k < end; ++k) {
    const int64_t ex = order_[k];
    std::memcpy(out->x.data() + (k - begin) * dim, data_->image(ex),
                dim * sizeof(float));
    out->y[k - begin] = data_->labels[ex];
  }
}

void BatchIterator::ProducerLoop() {
  int64_t seq = 0;
  for (;;) {
    const int slot = static_cast<int>(seq & 1);
    {
      MutexLock lock(&mu_);
      while (!stop_ && ready_[slot]) cv_.Wait(&mu_);
      if (stop_) return;
    }
    Fill(seq, &slots_[slot]);
    {
      MutexLock lock(&mu_);
      ready_[slot] = true;
    }
    cv_.SignalAll();
    ++seq;
  }
}

StatusOr<const Batch*> BatchIterator::Next() {
  const int slot = static_cast<int>(consumed_ & 1);
  if (!options_.prefetch) {
    Fill(consumed_++, &slots_[slot]);
    return &slots_[slot];
  }
  const auto until = std::chrono::steady_clock::now() + kBatchDeadline;
  MutexLock lock(&mu_);
  if (consumed_ > 0) {
    // Hand the previous batch's slot back to the producer.
    ready_[slot ^ 1] = false;
    cv_.SignalAll();
  }
  while (!ready_[slot] && cv_.WaitUntil(&mu_, until)) {
  }
  if (!ready_[slot]) {
    return Status::TimedOut("batch loader produced no batch within 120 s");
  }
  ++consumed_;
  return &slots_[slot];
}

}  // namespace asyncps::worker
