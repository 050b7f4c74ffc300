#include "worker/ps_store.h"

#include <glog/logging.h>

#include <cstring>

#include "compression/codec.h"
#include "compression/compressor.h"
#include "compression/device_compressor.h"

namespace asyncps::worker {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {
int64_t Nanos(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}
}  // namespace

StatusOr<std::unique_ptr<PsParameterStore>> PsParameterStore::Create(
    Client* client, const std::vector<TensorSpec>& specs,
    const PsStoreOptions& options) {
  std::unique_ptr<PsParameterStore> s(new PsParameterStore());
  s->options_ = options;
  s->client_ = client;
  s->specs_ = specs;
  if (options.register_model) {
    RETURN_IF_ERROR(
        client->Register(specs, options.layout).WithContext("register model"));
  }
  ASSIGN_OR_RETURN(compression::CodecSpec spec,
                   compression::CodecSpec::Parse(options.push_codec));
  if (!options.pull_codec.empty()) {
    RETURN_IF_ERROR(compression::CodecSpec::Parse(options.pull_codec)
                        .status()
                        .WithContext("--pull_codec"));
  }
  s->raw_push_ = spec.id == compression::CodecId::kNone;
  s->min_elems_ = spec.min_elems;
  if (!s->raw_push_) {
    std::vector<size_t> sizes;
    for (const ChunkSpec& c : client->layout().chunks())
      sizes.push_back(c.num_elems);
    compression::CompressorOptions co;
    co.spec = spec;
    co.seed = options.seed * 1000003 +
              static_cast<uint64_t>(client->options().rank + 1);
    ASSIGN_OR_RETURN(s->compressor_,
                     compression::Compressor::Create(co, sizes));
    if (options.device_compression) {
      auto dc = compression::DeviceCompressor::Create(co, sizes);
      if (dc.ok()) {
        s->device_compressor_ = std::move(dc).value();
      } else {
        LOG(WARNING) << "device compression unavailable, compressing on the "
                        "host: "
                     << dc.status().ToString();
      }
    }
  }
  s->push_buffers_.resize(client->layout().chunks().size());
  {
    MutexLock l(&s->mu_);  // not shared yet: for the analysis
    for (const TensorSpec& t : specs)
      s->tensor_bytes_.push_back({t.name, 0, 0});
  }
  // The pull target lives in the client's shared memory when it has some
  // (shards on this host then write the weights there themselves).
  for (const TensorSpec& t : specs) {
    const size_t n = static_cast<size_t>(t.num_elements());
    float* shared = client->AllocateShared(n);
    s->pulled_.emplace_back(shared != nullptr ? 0 : n);
    s->pulled_ptrs_.push_back(shared != nullptr ? shared
                                                : s->pulled_.back().data());
    s->pulled_elems_.push_back(n);
  }
  return s;
}

PsParameterStore::~PsParameterStore() { (void)Flush(); }

Status PsParameterStore::Flush() {
  Status first = WaitReceipts();
  for (auto& [t, sent_at] : acks_) {
    Status s = client_->Wait(t, options_.timeout);
    if (first.ok()) first = s;
  }
  acks_.clear();
  if (prefetch_) {
    Status s = client_->Wait(*prefetch_, options_.timeout);
    if (first.ok()) first = s;
    prefetch_.reset();
  }
  // A layered pull's groups not waited for (their chunks are dropped): the
  // client must not write into pulled_ once the store is gone.
  for (std::vector<Client::Ticket>& ts : group_tickets_) {
    for (Client::Ticket t : ts) {
      Status s = client_->Wait(t, options_.timeout);
      if (first.ok()) first = s;
    }
    ts.clear();
  }
  group_waited_.assign(group_waited_.size(), true);
  groups_pending_ = 0;
  return first;
}

Status PsParameterStore::Pull(int64_t clock,
                              const std::vector<float*>& tensors) {
  if (tensors.size() != specs_.size())
    return Status::InvalidArgument("pull: wrong number of tensors");
  if (groups_pending_ > 0) {
    return Status::FailedPrecondition(
        "pull while a pull by groups is in flight (WaitPullGroup each group)");
  }
  const auto start = SteadyClock::now();
  if (!prefetch_ || prefetch_clock_ != clock) {
    if (prefetch_)
      (void)client_->Wait(*prefetch_,
                          options_.timeout);  // discard the stale one
    ASSIGN_OR_RETURN(Client::Ticket t,
                     client_->StartPull(WireClock(clock), pulled_ptrs_,
                                        options_.pull_codec));
    prefetch_ = t;
  }
  TicketResult r;
  Status s = client_->Wait(*prefetch_, options_.timeout, &r);
  prefetch_.reset();
  if (s.ok()) SkipAheadIfBehind(clock, r);
  // With prefetch_ahead the pull left before the latest push: that push's
  // acknowledgement is collected one step later, off the critical path.
  int64_t staleness = -1;
  Status as =
      CollectAcks(options_.prefetch_ahead ? clock - 1 : clock + 1, &staleness);
  if (s.ok()) s = as;
  RETURN_IF_ERROR(s);
  const auto copy_start = SteadyClock::now();
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::memcpy(tensors[i], pulled_ptrs_[i], pulled_elems_[i] * sizeof(float));
  }
  const auto copy_end = SteadyClock::now();
  if (options_.prefetch_ahead) {
    // pulled_ is free again: fetch the next step's weights during compute.
    ASSIGN_OR_RETURN(Client::Ticket next,
                     client_->StartPull(WireClock(clock + 1), pulled_ptrs_,
                                        options_.pull_codec));
    prefetch_ = next;
    prefetch_clock_ = clock + 1;
  }
  CountPull(r, staleness, start, copy_start, copy_end);
  return Status::OK();
}

void PsParameterStore::CountPull(const TicketResult& r, int64_t staleness,
                                 SteadyClock::time_point start,
                                 SteadyClock::time_point copy_start,
                                 SteadyClock::time_point copy_end) {
  MutexLock l(&mu_);
  traffic_.bytes_pulled += r.bytes_received;
  traffic_.pull_wait_ns += Nanos(start, SteadyClock::now());
  traffic_.pull_copy_ns += Nanos(copy_start, copy_end);
  if (staleness >= 0) traffic_.last_staleness = staleness;
}

void PsParameterStore::SkipAheadIfBehind(int64_t clock, const TicketResult& r) {
  if (r.min_clock == INT64_MAX || r.min_clock <= WireClock(clock)) return;
  // Every live worker, this one included as the shards see it, is past
  // the clock this pull was for: this worker was evicted, started late or
  // is a restarted process, and the others went on (a BSP round it can no
  // longer contribute to). Skip ahead to them.
  LOG(WARNING) << "rank " << client_->options().rank << ": the shards are "
               << "at clock " << r.min_clock << ", this worker at "
               << WireClock(clock) << ": skipping ahead "
               << r.min_clock - WireClock(clock) << " clocks";
  clock_offset_ = r.min_clock - clock;
}

Status PsParameterStore::WaitAcks() {
  int64_t staleness = -1;
  Status s = CollectAcks(INT64_MAX, &staleness);
  acked_staleness_ = staleness;
  return s;
}

Status PsParameterStore::StartReceipts(const std::vector<int>& shards) {
  if (shards.empty()) return Status::OK();
  ASSIGN_OR_RETURN(Client::Ticket t, client_->StartHeartbeatShards(shards));
  receipts_.push_back(t);
  return Status::OK();
}

Status PsParameterStore::WaitReceipts() {
  Status first;
  for (Client::Ticket t : receipts_) {
    Status s = client_->Wait(t, options_.timeout, nullptr);
    if (first.ok()) first = s;
  }
  receipts_.clear();
  return first;
}

Status PsParameterStore::CollectAcks(int64_t horizon, int64_t* staleness) {
  *staleness = std::max(*staleness, acked_staleness_);
  acked_staleness_ = -1;
  // The step's push and clock were sent before the pull on every connection,
  // so their acknowledgements have arrived by now.
  Status first;
  size_t kept = 0;
  for (auto& [t, sent_at] : acks_) {
    if (sent_at >= horizon) {
      acks_[kept++] = {t, sent_at};
      continue;
    }
    TicketResult ar;
    Status as = client_->Wait(t, options_.timeout, &ar);
    if (first.ok() && !as.ok()) first = as;
    *staleness = std::max(*staleness, ar.max_staleness);
  }
  acks_.resize(kept);
  return first;
}

Status PsParameterStore::BeginGroups(
    int64_t new_clock, const std::vector<std::vector<uint32_t>>& groups) {
  if (groups_open_) {
    if (group_clock_ != new_clock) {
      return Status::FailedPrecondition("clock " + std::to_string(new_clock) +
                                        " while shards are clocked "
                                        "at " +
                                        std::to_string(group_clock_) +
                                        " (finish it with ClockAndPullGroups)");
    }
    if (groups != group_chunks_) {
      return Status::InvalidArgument(
          "the pull groups changed within the per-shard clocks of clock " +
          std::to_string(new_clock));
    }
    return Status::OK();
  }
  if (options_.prefetch_ahead ||
      !(options_.pull_codec.empty() || options_.pull_codec == "none")) {
    return Status::FailedPrecondition(
        "pulls by group need raw pulls (no pull codec) and prefetch_ahead off");
  }
  if (groups_pending_ > 0) {
    return Status::FailedPrecondition(
        "the previous pull by groups was not waited for");
  }
  const Layout& layout = client_->layout();
  const int shards = client_->num_shards();
  group_unclocked_.assign(groups.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<bool> holds(shards);
    for (uint32_t id : groups[g]) {
      if (id >= layout.chunks().size()) {
        return Status::InvalidArgument("pull of chunk " + std::to_string(id) +
                                       ", not in the layout");
      }
      const int s = layout.chunks()[id].shard;
      if (s >= 0 && s < shards && !holds[s]) {
        holds[s] = true;
        ++group_unclocked_[g];
      }
    }
  }
  if (prefetch_) {
    (void)client_->Wait(*prefetch_, options_.timeout);
    prefetch_.reset();
  }
  group_clock_ = new_clock;
  group_chunks_ = groups;
  group_tickets_.assign(groups.size(), {});
  group_waited_.assign(groups.size(), false);
  shard_clocked_.assign(shards, false);
  groups_pending_ = groups.size();
  return Status::OK();
}

Status PsParameterStore::ClockGroupsOn(const std::vector<int>& shards) {
  ASSIGN_OR_RETURN(Client::Ticket t,
                   client_->StartClockShards(WireClock(group_clock_), shards));
  acks_.push_back({t, group_clock_ - 1});
  std::vector<bool> on(client_->num_shards());
  for (int s : shards) {
    on[s] = true;
    shard_clocked_[s] = true;
  }
  const Layout& layout = client_->layout();
  for (size_t g = 0; g < group_chunks_.size(); ++g) {
    std::vector<uint32_t> part;
    std::vector<bool> counted(on.size());
    for (uint32_t id : group_chunks_[g]) {
      const int s = layout.chunks()[id].shard;
      if (!on[s]) continue;
      part.push_back(id);
      if (!counted[s]) {
        counted[s] = true;
        --group_unclocked_[g];
      }
    }
    if (part.empty()) continue;
    ASSIGN_OR_RETURN(
        Client::Ticket p,
        client_->StartPullChunks(WireClock(group_clock_), part, pulled_ptrs_));
    group_tickets_[g].push_back(p);
  }
  return Status::OK();
}

Status PsParameterStore::ClockAndPullGroups(
    int64_t new_clock, const std::vector<std::vector<uint32_t>>& groups) {
  const auto start = SteadyClock::now();
  const bool open = groups_open_;
  RETURN_IF_ERROR(BeginGroups(new_clock, groups));
  groups_open_ = false;
  if (open) {
    // The shards the per-shard clocks did not reach (those holding none of
    // the chunks pushed early among them).
    std::vector<int> rest;
    for (int s = 0; s < client_->num_shards(); ++s) {
      if (!shard_clocked_[s]) rest.push_back(s);
    }
    if (!rest.empty()) RETURN_IF_ERROR(ClockGroupsOn(rest));
  } else {
    // Every shard at once (the elastic fleet's active ones): one clock, then
    // one request per group and shard.
    ASSIGN_OR_RETURN(Client::Ticket t,
                     client_->StartClock(WireClock(new_clock)));
    acks_.push_back({t, new_clock - 1});
    shard_clocked_.assign(shard_clocked_.size(), true);
    for (size_t g = 0; g < groups.size(); ++g) {
      group_unclocked_[g] = 0;
      ASSIGN_OR_RETURN(Client::Ticket p,
                       client_->StartPullChunks(WireClock(new_clock), groups[g],
                                                pulled_ptrs_));
      group_tickets_[g].push_back(p);
    }
  }
  MutexLock l(&mu_);
  traffic_.clock_ns += Nanos(start, SteadyClock::now());
  return Status::OK();
}

Status PsParameterStore::ClockShardsAndPullGroups(
    int64_t new_clock, const std::vector<int>& shards,
    const std::vector<std::vector<uint32_t>>& groups) {
  if (!client_->options().etcd_endpoints.empty()) {
    return Status::FailedPrecondition(
        "per-shard clocks need a fixed layout (an elastic fleet moves chunks "
        "between shards)");
  }
  const auto start = SteadyClock::now();
  RETURN_IF_ERROR(BeginGroups(new_clock, groups));
  std::vector<bool> seen(client_->num_shards());
  for (int s : shards) {
    if (s < 0 || s >= client_->num_shards() || seen[s] || shard_clocked_[s]) {
      const bool range = s < 0 || s >= client_->num_shards();
      if (!groups_open_) groups_pending_ = 0;  // nothing started
      return Status::InvalidArgument("clock " + std::to_string(new_clock) +
                                     " to shard " + std::to_string(s) +
                                     (range     ? ", not a shard"
                                      : seen[s] ? ", listed twice"
                                                : ", which already has it"));
    }
    seen[s] = true;
  }
  groups_open_ = true;
  if (!shards.empty()) RETURN_IF_ERROR(ClockGroupsOn(shards));
  MutexLock l(&mu_);
  traffic_.clock_ns += Nanos(start, SteadyClock::now());
  return Status::OK();
}

Status PsParameterStore::WaitPullGroup(size_t group,
                                       const std::vector<float*>& tensors) {
  if (tensors.size() != specs_.size())
    return Status::InvalidArgument("pull: wrong number of tensors");
  if (group >= group_tickets_.size() || group_waited_[group]) {
    return Status::FailedPrecondition(
        "pull group " + std::to_string(group) +
        " is not in flight (ClockAndPullGroups first, each group once)");
  }
  if (group_unclocked_[group] > 0) {
    return Status::FailedPrecondition(
        "pull group " + std::to_string(group) + ": " +
        std::to_string(group_unclocked_[group]) +
        " shards holding its chunks were not clocked yet");
  }
  const auto start = SteadyClock::now();
  TicketResult r;
  r.min_clock = INT64_MAX;
  Status s;
  for (Client::Ticket t : group_tickets_[group]) {
    TicketResult one;
    Status st = client_->Wait(t, options_.timeout, &one);
    if (s.ok()) s = st;
    r.bytes_received += one.bytes_received;
    r.min_clock = std::min(r.min_clock, one.min_clock);
  }
  group_tickets_[group].clear();
  group_waited_[group] = true;
  --groups_pending_;
  if (s.ok()) SkipAheadIfBehind(group_clock_, r);
  int64_t staleness = -1;
  if (groups_pending_ == 0) {
    // The step's pushes and clocks went out before every group's request on
    // their connections, so their acknowledgements are in by now; collected
    // with the last group so that none waits for the slowest shard's.
    Status as = CollectAcks(group_clock_ + 1, &staleness);
    if (s.ok()) s = as;
  }
  RETURN_IF_ERROR(s);
  const auto copy_start = SteadyClock::now();
  const Layout& layout = client_->layout();
  for (uint32_t id : group_chunks_[group]) {
    const ChunkSpec& c = layout.chunks()[id];
    std::memcpy(tensors[c.tensor] + c.offset, pulled_ptrs_[c.tensor] + c.offset,
                c.num_elems * sizeof(float));
  }
  const auto copy_end = SteadyClock::now();
  CountPull(r, staleness, start, copy_start, copy_end);
  return Status::OK();
}

Status PsParameterStore::Push(int64_t clock,
                              const std::vector<const float*>& grads) {
  return PushChunks(clock, grads, /*on_device=*/false);
}

bool PsParameterStore::NextGradientBuffers(std::vector<float*>* grads) {
  auto released = [](const std::vector<BufferPtr>& set) {
    for (const BufferPtr& b : set)
      if (b.use_count() > 1) return false;
    return true;
  };
  int pick = -1;
  for (size_t i = 0; i < grad_sets_.size(); ++i) {
    // Not the set of the last push: its gradients may be read again.
    if (static_cast<int>(i) != grad_set_ && released(grad_sets_[i])) {
      pick = static_cast<int>(i);
      break;
    }
  }
  if (pick < 0) {
    std::vector<BufferPtr> set;
    set.reserve(specs_.size());
    for (const TensorSpec& t : specs_)
      set.push_back(Buffer::Allocate(static_cast<size_t>(t.num_elements()) *
                                     sizeof(float)));
    if (grad_sets_.size() < kGradSets) {
      pick = static_cast<int>(grad_sets_.size());
      grad_sets_.push_back(std::move(set));
    } else {
      // Every set busy: a new one takes the place of the next in turn
      // (the transport keeps the old one alive until it lets go).
      if (grad_set_next_ == grad_set_)
        grad_set_next_ = (grad_set_next_ + 1) % kGradSets;
      pick = grad_set_next_;
      grad_set_next_ = (grad_set_next_ + 1) % kGradSets;
      grad_sets_[pick] = std::move(set);
    }
  }
  grad_set_ = pick;
  grads->resize(specs_.size());
  for (size_t t = 0; t < specs_.size(); ++t)
    (*grads)[t] = grad_sets_[pick][t]->floats();
  return true;
}

Status PsParameterStore::PushDevice(
    int64_t clock, const std::vector<const float*>& device_grads) {
  if (!device_compressor_) {
    return Status::FailedPrecondition(
        "device gradients need device_compression, a codec and a GPU");
  }
  return PushChunks(clock, device_grads, /*on_device=*/true);
}

Status PsParameterStore::PushSubset(int64_t clock,
                                    const std::vector<uint32_t>& chunk_ids,
                                    const std::vector<const float*>& grads) {
  const Layout& layout = client_->layout();
  std::vector<bool> seen(layout.chunks().size());
  for (uint32_t id : chunk_ids) {
    if (id >= seen.size() || seen[id]) {
      return Status::InvalidArgument(
          "push: chunk " + std::to_string(id) +
          (id >= seen.size() ? " is not in the layout" : " listed twice"));
    }
    seen[id] = true;
    if (grads.size() == specs_.size() &&
        grads[layout.chunks()[id].tensor] == nullptr) {
      return Status::InvalidArgument("push: no gradient for tensor " +
                                     specs_[layout.chunks()[id].tensor].name);
    }
  }
  return PushChunks(clock, grads, /*on_device=*/false, &chunk_ids);
}

Status PsParameterStore::PushChunks(int64_t clock,
                                    const std::vector<const float*>& grads,
                                    bool on_device,
                                    const std::vector<uint32_t>* subset) {
  if (grads.size() != specs_.size())
    return Status::InvalidArgument("push: wrong number of tensors");
  const Layout& layout = client_->layout();
  if (groups_open_ && group_clock_ == clock + 1) {
    // A shard clocked at clock + 1 takes no more pushes of step `clock`:
    // its round may have closed without them.
    const size_t n = subset ? subset->size() : layout.chunks().size();
    for (size_t k = 0; k < n; ++k) {
      const int shard = layout.chunks()[subset ? (*subset)[k] : k].shard;
      if (shard_clocked_[shard]) {
        return Status::FailedPrecondition(
            "push at clock " + std::to_string(clock) + " to shard " +
            std::to_string(shard) + ", which was already clocked at " +
            std::to_string(clock + 1));
      }
    }
  }
  const auto start = SteadyClock::now();
  int64_t copy_ns = 0;
  std::vector<ChunkPayload> payloads;
  const size_t count = subset ? subset->size() : layout.chunks().size();
  payloads.reserve(count);
  uint64_t raw = 0, wire = 0;
  step_wire_.assign(specs_.size(), 0);
  step_raw_.assign(specs_.size(), 0);
  const double epoch = static_cast<double>(clock) /
                       std::max<int64_t>(1, options_.steps_per_epoch);
  for (size_t k = 0; k < count; ++k) {
    const ChunkSpec& c = layout.chunks()[subset ? (*subset)[k] : k];
    const float* g = grads[c.tensor] + c.offset;
    const size_t bytes = c.num_elems * sizeof(float);
    raw += bytes;
    step_raw_[c.tensor] += bytes;
    ChunkPayload p;
    p.chunk = c.id;
    const BufferPtr* in_set =
        on_device || grad_set_ < 0 ||
                grads[c.tensor] != grad_sets_[grad_set_][c.tensor]->floats()
            ? nullptr
            : &grad_sets_[grad_set_][c.tensor];
    if ((raw_push_ || c.num_elems < min_elems_) && in_set != nullptr) {
      // Written by the backend into NextGradientBuffers' set: sent as is.
      p.codec = 0;
      p.data = Frame::Ref(g, bytes, *in_set);
    } else if (raw_push_ || c.num_elems < min_elems_) {
      BufferPtr& b = push_buffers_[c.id];
      if (!b || b.use_count() > 1) b = Buffer::Allocate(bytes);
      if (on_device) {
        RETURN_IF_ERROR(device_compressor_->CopyToHost(
            g, c.num_elems, reinterpret_cast<float*>(b->data())));
      } else {
        const auto c0 = SteadyClock::now();
        std::memcpy(b->data(), g, bytes);
        copy_ns += Nanos(c0, SteadyClock::now());
      }
      p.codec = 0;
      p.data = Frame::Ref(b);
    } else {
      const uint64_t step = static_cast<uint64_t>(clock);
      ASSIGN_OR_RETURN(
          compression::CodecId id,
          on_device
              ? device_compressor_->Compress(c.id, g, epoch, step, &scratch_)
              : compressor_->Compress(c.id, g, epoch, step, &scratch_));
      p.codec = static_cast<uint8_t>(id);
      p.data = Frame::Owned(std::move(scratch_));
      scratch_ = std::vector<uint8_t>();
    }
    wire += p.data.size;
    step_wire_[c.tensor] += p.data.size;
    payloads.push_back(std::move(p));
  }
  ASSIGN_OR_RETURN(Client::Ticket t,
                   client_->StartPush(WireClock(clock), std::move(payloads)));
  acks_.push_back({t, clock});
  MutexLock l(&mu_);
  traffic_.bytes_pushed_raw += raw;
  traffic_.bytes_pushed_wire += wire;
  for (size_t t = 0; t < specs_.size(); ++t) {
    tensor_bytes_[t].raw += step_raw_[t];
    tensor_bytes_[t].wire += step_wire_[t];
  }
  uint64_t encode_ns = compressor_ ? compressor_->stats().encode_ns : 0;
  if (device_compressor_) encode_ns += device_compressor_->stats().encode_ns;
  traffic_.encode_ns = static_cast<int64_t>(encode_ns);
  traffic_.push_copy_ns += copy_ns;
  traffic_.push_ns += Nanos(start, SteadyClock::now());
  return Status::OK();
}

Status PsParameterStore::Clock(int64_t new_clock) {
  if (groups_open_) {
    return Status::FailedPrecondition(
        "clock while per-shard clocks of " + std::to_string(group_clock_) +
        " are open (finish them with ClockAndPullGroups)");
  }
  const auto start = SteadyClock::now();
  Status s = StartClockAndPrefetch(new_clock);
  MutexLock l(&mu_);
  traffic_.clock_ns += Nanos(start, SteadyClock::now());
  return s;
}

Status PsParameterStore::StartClockAndPrefetch(int64_t new_clock) {
  ASSIGN_OR_RETURN(Client::Ticket t, client_->StartClock(WireClock(new_clock)));
  acks_.push_back({t, new_clock - 1});
  if (options_.prefetch_ahead) return Status::OK();  // already on its way
  // Prefetch the next step's weights right behind the clock.
  if (prefetch_) (void)client_->Wait(*prefetch_, options_.timeout);
  ASSIGN_OR_RETURN(Client::Ticket p,
                   client_->StartPull(WireClock(new_clock), pulled_ptrs_,
                                      options_.pull_codec));
  prefetch_ = p;
  prefetch_clock_ = new_clock;
  return Status::OK();
}

std::vector<PsParameterStore::TensorBytes> PsParameterStore::tensor_bytes()
    const {
  MutexLock l(&mu_);
  return tensor_bytes_;
}

TrafficStats PsParameterStore::traffic() const {
  MutexLock l(&mu_);
  return traffic_;
}

}  // namespace asyncps::worker
