#include "worker/overlap.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace asyncps::worker {

StatusOr<std::unique_ptr<OverlapScheduler>> OverlapScheduler::Create(
    PsParameterStore* store, const Layout& layout,
    const OverlapOptions& options) {
  if (store == nullptr)
    return Status::InvalidArgument("OverlapScheduler needs a store");
  if (options.pipeline_shards < 0) {
    return Status::InvalidArgument("pipeline_shards must be >= 0, got " +
                                   std::to_string(options.pipeline_shards));
  }
  if (options.layers.empty())
    return Status::InvalidArgument("OverlapScheduler needs the layers");
  std::unique_ptr<OverlapScheduler> s(new OverlapScheduler());
  s->store_ = store;
  s->options_ = options;
  const size_t tensors = layout.tensors().size();
  s->tensor_layer_.assign(tensors, -1);
  for (size_t l = 0; l < options.layers.size(); ++l) {
    for (uint32_t t : options.layers[l]) {
      if (t >= tensors || s->tensor_layer_[t] >= 0) {
        return Status::InvalidArgument(
            "layer " + std::to_string(l) + " lists tensor " +
            std::to_string(t) +
            (t >= tensors ? ", not in the layout" : ", listed before"));
      }
      s->tensor_layer_[t] = static_cast<int>(l);
    }
  }
  for (size_t t = 0; t < tensors; ++t) {
    if (s->tensor_layer_[t] < 0) {
      return Status::InvalidArgument("tensor " + layout.tensors()[t].name +
                                     " is in no layer");
    }
  }
  s->num_shards_ = layout.num_shards();
  s->layer_chunks_.resize(options.layers.size());
  s->shard_chunks_.resize(s->num_shards_);
  s->shard_layers_.resize(s->num_shards_);
  std::vector<uint64_t> layer_bytes(options.layers.size());
  for (const ChunkSpec& c : layout.chunks()) {
    const int l = s->tensor_layer_[c.tensor];
    s->chunk_shard_.push_back(c.shard);
    s->layer_chunks_[l].push_back(c.id);
    s->shard_chunks_[c.shard].push_back(c.id);
    layer_bytes[l] += c.num_elems * sizeof(float);
    std::vector<int>& ls = s->shard_layers_[c.shard];
    if (ls.empty() || ls.back() != l) ls.push_back(l);
  }
  // Pull groups: consecutive layers until the group is large enough; a
  // smaller rest at the end joins the last group (each group is one more
  // request and reply per shard).
  std::vector<uint32_t> current;
  uint64_t bytes = 0;
  s->layer_group_.resize(options.layers.size());
  for (size_t l = 0; l < options.layers.size(); ++l) {
    current.insert(current.end(), s->layer_chunks_[l].begin(),
                   s->layer_chunks_[l].end());
    bytes += layer_bytes[l];
    s->layer_group_[l] = s->groups_.size();
    if (bytes >= options.min_pull_group_bytes) {
      s->groups_.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  if (!current.empty() && !s->groups_.empty()) {
    s->groups_.back().insert(s->groups_.back().end(), current.begin(),
                             current.end());
    for (size_t& g : s->layer_group_) g = std::min(g, s->groups_.size() - 1);
  } else if (!current.empty()) {
    s->groups_.push_back(std::move(current));
  }
  if (options.sender_thread) {
    OverlapScheduler* raw = s.get();
    s->sender_ = std::thread([raw] { raw->SenderLoop(); });
  }
  return s;
}

OverlapScheduler::~OverlapScheduler() {
  if (!sender_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  sender_.join();
}

void OverlapScheduler::SenderLoop() {
  mu_.lock();
  while (true) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (stop_) break;  // what is left belongs to a step that failed
    const std::vector<uint32_t>* chunks = queue_.front();
    queue_.pop_front();
    // After a failed bucket the step's later ones are dropped: EndStep
    // returns the error and the trainer stops.
    if (send_error_.ok()) {
      sending_ = true;
      mu_.unlock();
      Status st = SendBucket(*chunks);
      mu_.lock();
      sending_ = false;
      if (send_error_.ok() && !st.ok()) send_error_ = st;
    }
    cv_.SignalAll();
  }
  mu_.unlock();
}

Status OverlapScheduler::Dispatch(const std::vector<uint32_t>* chunks) {
  if (!options_.sender_thread) return SendBucket(*chunks);
  {
    MutexLock lock(&mu_);
    if (!send_error_.ok()) return send_error_;
    queue_.push_back(chunks);
  }
  cv_.SignalAll();
  return Status::OK();
}

Status OverlapScheduler::WaitForSender() {
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  while (!queue_.empty() || sending_) cv_.Wait(&mu_);
  ++stats_.sender_waits;
  stats_.sender_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - start)
                               .count();
  return send_error_;
}

Status OverlapScheduler::BeginBackward(int64_t clock,
                                       const std::vector<const float*>& grads) {
  if (grads.size() != tensor_layer_.size()) {
    return Status::InvalidArgument(
        "overlap: expected " + std::to_string(tensor_layer_.size()) +
        " gradient buffers, got " + std::to_string(grads.size()));
  }
  if (options_.sender_thread) {
    // A step that failed may have left buckets (skipped) and its error.
    MutexLock lock(&mu_);
    while (!queue_.empty() || sending_) cv_.Wait(&mu_);
    send_error_ = Status::OK();
  }
  clock_ = clock;
  in_step_ = true;
  grads_ = grads;
  layer_ready_.assign(options_.layers.size(), false);
  layer_sent_.assign(options_.layers.size(), false);
  shard_sent_.assign(num_shards_, false);
  shard_unsent_.assign(num_shards_, 0);
  for (int s = 0; s < num_shards_; ++s)
    shard_unsent_[s] = shard_chunks_[s].size();
  stage_clocked_ = 0;
  in_push_.assign(num_shards_, false);
  // The last stage's receipts (long back by now).
  if (options_.pipeline_shards > 0) RETURN_IF_ERROR(store_->WaitReceipts());
  return Status::OK();
}

Status OverlapScheduler::SendBucket(const std::vector<uint32_t>& chunks) {
  if (chunks.empty()) return Status::OK();
  if (options_.pipeline_shards > 0 &&
      stage_clocked_ >= options_.pipeline_shards) {
    // The shards just clocked get the link to themselves: their rounds
    // close and their pulls come down while this push goes up.
    stage_clocked_ = 0;
    ++stats_.stage_waits;
    const auto start = std::chrono::steady_clock::now();
    Status s = store_->WaitReceipts();
    stats_.stage_wait_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - start)
            .count();
    RETURN_IF_ERROR(s);
  }
  RETURN_IF_ERROR(store_->PushSubset(clock_, chunks, grads_));
  ++stats_.pushes;
  std::vector<int> pushed, done;
  for (uint32_t id : chunks) {
    const int s = chunk_shard_[id];
    if (!in_push_[s]) {
      in_push_[s] = true;
      pushed.push_back(s);
    }
    if (--shard_unsent_[s] == 0) done.push_back(s);
  }
  for (int s : pushed) in_push_[s] = false;
  // The receipt goes right behind the push, before the clock and pulls.
  if (options_.pipeline_shards > 0)
    RETURN_IF_ERROR(store_->StartReceipts(pushed));
  if (done.empty()) return Status::OK();
  RETURN_IF_ERROR(store_->ClockShardsAndPullGroups(clock_ + 1, done, groups_));
  ++stats_.shard_clocks;
  stage_clocked_ += static_cast<int>(done.size());
  return Status::OK();
}

Status OverlapScheduler::LayerGradientsReady(int layer) {
  if (!in_step_)
    return Status::FailedPrecondition("gradients ready outside a step");
  if (pull_pending_) {
    return Status::FailedPrecondition(
        "layer " + std::to_string(layer) +
        "'s gradients while the pull by layers is pending (WaitLayer every "
        "layer in forward first)");
  }
  if (layer < 0 || static_cast<size_t>(layer) >= layer_ready_.size() ||
      layer_ready_[layer]) {
    return Status::FailedPrecondition(
        "layer " + std::to_string(layer) +
        (layer >= 0 && static_cast<size_t>(layer) < layer_ready_.size()
             ? " got a second gradient in one step"
             : " does not exist"));
  }
  layer_ready_[layer] = true;
  if (options_.buckets == PushBuckets::kPerLayer) {
    layer_sent_[layer] = true;
    return Dispatch(&layer_chunks_[layer]);
  }
  for (int s = 0; s < num_shards_; ++s) {
    if (shard_sent_[s]) continue;
    bool ready = true;
    for (int l : shard_layers_[s]) ready = ready && layer_ready_[l];
    if (!ready) continue;
    shard_sent_[s] = true;
    RETURN_IF_ERROR(Dispatch(&shard_chunks_[s]));
  }
  return Status::OK();
}

Status OverlapScheduler::EndStep() {
  if (!in_step_) return Status::FailedPrecondition("EndStep outside a step");
  in_step_ = false;
  // Whatever the hooks did not send (a backward that reported no layers).
  if (options_.buckets == PushBuckets::kPerLayer) {
    for (size_t l = 0; l < layer_sent_.size(); ++l) {
      if (!layer_sent_[l]) RETURN_IF_ERROR(Dispatch(&layer_chunks_[l]));
    }
  } else {
    for (int s = 0; s < num_shards_; ++s) {
      if (!shard_sent_[s]) RETURN_IF_ERROR(Dispatch(&shard_chunks_[s]));
    }
  }
  if (options_.sender_thread) RETURN_IF_ERROR(WaitForSender());
  RETURN_IF_ERROR(store_->ClockAndPullGroups(clock_ + 1, groups_));
  ++stats_.steps;
  stats_.pull_groups += static_cast<int64_t>(groups_.size());
  pull_pending_ = true;
  groups_waited_ = 0;
  return Status::OK();
}

Status OverlapScheduler::WaitLayer(int layer,
                                   const std::vector<float*>& tensors) {
  if (layer < 0 || static_cast<size_t>(layer) >= layer_group_.size())
    return Status::InvalidArgument("WaitLayer: no layer " +
                                   std::to_string(layer));
  if (!pull_pending_) return Status::OK();
  while (groups_waited_ <= layer_group_[layer]) {
    RETURN_IF_ERROR(store_->WaitPullGroup(groups_waited_, tensors));
    ++groups_waited_;
  }
  if (groups_waited_ == groups_.size()) pull_pending_ = false;
  return Status::OK();
}

}  // namespace asyncps::worker
