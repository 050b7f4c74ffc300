// PsParameterStore: the ParameterStore backed by the parameter-server shards.
//
// Push compresses each chunk of the gradient with the configured codec (raw
// fp32 when the codec is "none" or the chunk is below the codec's minimum
// size) and sends it without waiting; Clock announces the new clock and, in
// the same burst on each connection, starts the next pull, so one step costs
// one round trip per shard; Pull waits for that prefetched pull (blocking as
// the shard's consistency mode requires) and for the step's push and clock
// acknowledgements, reporting any error they carried.
//
// The clock on the wire is the trainer's step plus an offset: when a pull
// reply shows that every live worker (this one too, as the shards see it) is
// past the clock it asked for, this worker was evicted, started late or was
// restarted while the others went on, and it skips ahead to them (logged);
// under BSP that is the round it can still contribute to.
//
// With options.device_compression, PushDevice takes gradients in GPU memory
// and compresses each chunk on the device (compression::DeviceCompressor),
// copying only the payloads to the host; accounting is the same as Push's.
//
// Thread safety: traffic() may be called from any thread; everything else
// from the trainer's thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/mutex.h"
#include "worker/client.h"
#include "worker/parameter_store.h"

namespace asyncps::compression {
class Compressor;
class DeviceCompressor;
}  // namespace asyncps::compression

namespace asyncps::worker {

struct PsStoreOptions {
  // Push codec spec (compression::CodecSpec::Parse). Default: "none".
  std::string push_codec = "none";
  // Pull codec spec; "" = raw fp32. Default: "".
  std::string pull_codec;
  // Seed of stochastic codecs (mixed with the rank). Default: 1.
  uint64_t seed = 1;
  // Steps per epoch, for the codec's sparsity warm-up. Default: 1000.
  int64_t steps_per_epoch = 1000;
  // Longest wait for any one pull, push or clock. Default: 120 s.
  std::chrono::milliseconds timeout{120000};
  // Chunking of the model. Default: LayoutOptions defaults.
  LayoutOptions layout;
  // Start the pull of step c+1 as soon as step c's weights are handed out,
  // so the transfer overlaps this step's compute. The weights of step c+1
  // may then lack this worker's own update of step c (one more step of
  // staleness for its own updates; other workers' updates keep the SSP
  // bound, see docs/consistency.md "SSP bound"). Under BSP the pull waits for
  // the round and so gains nothing. Default: false (the pull follows the push
  // and the clock on each connection).
  bool prefetch_ahead = false;
  // Accept gradients in device memory (PushDevice) and compress them on the
  // GPU. Takes effect only with a push codec other than "none" and a visible
  // CUDA device (else AcceptsDeviceGradients() is false and a warning is
  // logged). Default: false.
  bool device_compression = false;
  // Register the model (idempotent) on creation. Default: true.
  bool register_model = true;
};

class PsParameterStore : public ParameterStore {
 public:
  // `client` must outlive the store.
  static StatusOr<std::unique_ptr<PsParameterStore>> Create(
      Client* client, const std::vector<TensorSpec>& specs,
      const PsStoreOptions& options);
  ~PsParameterStore() override;

  Status Pull(int64_t clock, const std::vector<float*>& tensors) override;
  Status Push(int64_t clock, const std::vector<const float*>& grads) override;
  // One set of Buffers per tensor, taken from a few sets that the
  // transport has released (a set still being sent, or kept for a resend
  // until acknowledged, is skipped; a new one is made when every set is
  // busy). Push sends the chunks of a set's tensors as views of it.
  bool NextGradientBuffers(std::vector<float*>* grads) override;
  // True when options.device_compression took effect.
  bool AcceptsDeviceGradients() const override {
    return device_compressor_ != nullptr;
  }
  // As Push, with device pointers; FailedPrecondition unless
  // AcceptsDeviceGradients().
  Status PushDevice(int64_t clock,
                    const std::vector<const float*>& device_grads) override;
  Status Clock(int64_t new_clock) override;
  TrafficStats traffic() const override;

  // As Push, for only the chunks `chunk_ids` (layout ids, each at most
  // once); `grads` holds one pointer per tensor, read only for the tensors
  // of those chunks. Several calls at one clock send a step's gradient in
  // parts as it becomes ready (the overlap scheduler,
  // worker/python/asyncps/overlap.py); under BSP a shard counts one push per
  // worker and round, so all chunks of one shard must go in one call.
  Status PushSubset(int64_t clock, const std::vector<uint32_t>& chunk_ids,
                    const std::vector<const float*>& grads);

  // Layered pulls (the overlap scheduler): Clock(new_clock), then the pull
  // of new_clock's weights as one request per group of chunks (and shard),
  // sent in group order -- list the groups in the order the forward pass
  // needs them, and the first layers' weights arrive first (P3). Replaces
  // the pull Clock() would prefetch. Raw pulls and prefetch_ahead off only
  // (else FailedPrecondition). Every group must then be waited for with
  // WaitPullGroup before the next Pull or ClockAndPullGroups. After
  // ClockShardsAndPullGroups calls for new_clock it does the same for the
  // shards they did not clock (none left: sends nothing), with the same
  // groups.
  Status ClockAndPullGroups(int64_t new_clock,
                            const std::vector<std::vector<uint32_t>>& groups);
  // Per-shard clocks (the overlap pipeline): as ClockAndPullGroups for the
  // shards `shards` only -- new_clock to each of them
  // (Client::StartClockShards) and, behind it on their connections, one
  // request per group for the group's chunks they hold. Call it for a shard
  // as soon as every push of step new_clock - 1 to it was started (a later
  // push to it at that step is refused: its clock would overtake it), then
  // ClockAndPullGroups(new_clock, groups) for the rest; so one shard's
  // round closes and its pull comes down while pushes to the next shard go
  // up. Each shard once per clock; `groups` the same in every call of a
  // clock. FailedPrecondition (nothing sent) with a pull codec,
  // prefetch_ahead, groups of the previous clock not waited for, or an
  // elastic fleet (its chunks may move between shards during a step).
  Status ClockShardsAndPullGroups(
      int64_t new_clock, const std::vector<int>& shards,
      const std::vector<std::vector<uint32_t>>& groups);
  // Waits for group `group` of the layered pull and writes its chunks into
  // `tensors` (one pointer per tensor; only the group's chunks are
  // written); FailedPrecondition while a shard holding some of them has
  // not been clocked. The last group waited for also collects the step's
  // push and clock acknowledgements; each skips ahead as Pull does.
  Status WaitPullGroup(size_t group, const std::vector<float*>& tensors);
  // Groups of the layered pull not yet waited for.
  size_t pull_groups_pending() const { return groups_pending_; }

  // Pushed bytes per tensor, dense fp32 vs on the wire (payload headers and
  // sparse indices included), in layout order.
  struct TensorBytes {
    std::string name;
    uint64_t raw = 0;
    uint64_t wire = 0;
  };
  std::vector<TensorBytes> tensor_bytes() const;

  // Waits for the acknowledgements of every push and clock started so far
  // (their staleness is reported with the next pull); first error. The
  // overlap pipeline calls it before the next shard's push, so that the
  // worker's link carries one shard's push at a time and that shard's
  // round closes (and its pull comes down) while the next one goes up,
  // instead of every shard's push sharing the link and all of them
  // arriving at the end.
  Status WaitAcks();
  // Receipts, the overlap pipeline's stage wait. StartReceipts sends the
  // shards `shards` (indices, each once) a heartbeat behind the requests
  // started to them so far (Client::StartHeartbeatShards): a shard handles
  // what arrives in order, so its reply says those requests arrived.
  // WaitReceipts waits for every receipt started since its last call; first
  // error. Unlike WaitAcks this does not wait for replies a shard holds,
  // such as a replicated primary's acknowledgement of a push (until the
  // round closed and its backups have it). Started right behind a push,
  // before the clock and pulls that follow it, a receipt does not queue
  // behind the pull replies a closing round sends down the same link.
  Status StartReceipts(const std::vector<int>& shards);
  Status WaitReceipts();

  // Waits for every request still in flight.
  Status Flush();

 private:
  // Push, PushDevice and PushSubset: grads are device pointers when
  // on_device; `subset` (chunk ids) or null for every chunk.
  Status PushChunks(int64_t clock, const std::vector<const float*>& grads,
                    bool on_device,
                    const std::vector<uint32_t>* subset = nullptr);
  // After a pull for trainer step `clock` returned `r`: moves the clock
  // offset when the shards are past that clock (see the file comment).
  void SkipAheadIfBehind(int64_t clock, const TicketResult& r);
  // Waits for the acknowledgements of pushes and clocks sent at steps before
  // `horizon`; raises *staleness to the largest reported. First error.
  // Also takes the staleness WaitAcks collected.
  Status CollectAcks(int64_t horizon, int64_t* staleness);
  // Adds a completed pull (started at `start`, copied out between
  // copy_start and copy_end) to traffic_.
  void CountPull(const TicketResult& r, int64_t staleness,
                 std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point copy_start,
                 std::chrono::steady_clock::time_point copy_end);
  // Clock() without its timing.
  Status StartClockAndPrefetch(int64_t new_clock);
  // The clock sent to the shards for trainer step `clock`.
  int64_t WireClock(int64_t clock) const { return clock + clock_offset_; }
  // Starts the layered pull of new_clock (no shard clocked yet) unless it
  // is the one in progress; FailedPrecondition as ClockAndPullGroups.
  Status BeginGroups(int64_t new_clock,
                     const std::vector<std::vector<uint32_t>>& groups);
  // Clocks `shards` (none clocked yet at group_clock_) and starts their
  // part of every group's pull.
  Status ClockGroupsOn(const std::vector<int>& shards);

  PsStoreOptions options_;
  Client* client_;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<compression::Compressor> compressor_;
  // Set when device compression is on; its own EF/momentum state.
  std::unique_ptr<compression::DeviceCompressor> device_compressor_;
  bool raw_push_ = true;
  size_t min_elems_ = 0;
  // Prefetch target, one per tensor: pulled_ptrs_ point into pulled_ or,
  // when the client has shared memory, into it (pulled_ then empty).
  std::vector<std::vector<float>> pulled_;
  std::vector<float*> pulled_ptrs_;
  std::vector<size_t> pulled_elems_;
  std::optional<Client::Ticket> prefetch_;
  int64_t prefetch_clock_ = -1;
  int64_t clock_offset_ = 0;  // wire clock - trainer step (skips ahead)
  // Pushes and clocks not yet confirmed, with the clock they were sent at.
  std::vector<std::pair<Client::Ticket, int64_t>> acks_;
  std::vector<Client::Ticket> receipts_;  // StartReceipts, not waited for
  std::vector<uint8_t> scratch_;
  // Per chunk: the buffer of its last raw push, reused once the transport
  // has released it (no allocation or page faults per push).
  std::vector<BufferPtr> push_buffers_;
  // NextGradientBuffers: up to kGradSets sets of one Buffer per tensor,
  // and the set handed out last (-1: none; Push then copies as before).
  static constexpr int kGradSets = 4;
  std::vector<std::vector<BufferPtr>> grad_sets_;
  int grad_set_ = -1;
  int grad_set_next_ = 0;            // the set replaced when every set is busy
  std::vector<uint64_t> step_wire_;  // wire bytes per tensor of one push
  std::vector<uint64_t> step_raw_;   // fp32 bytes per tensor of one push
  // The layered pull in flight: its clock, the chunks of each group, its
  // tickets (one per ClockGroupsOn call that asked for some of its chunks)
  // and the shards holding its chunks not clocked yet; whether each group
  // was waited for, and which shards were clocked at group_clock_.
  int64_t group_clock_ = -1;
  std::vector<std::vector<uint32_t>> group_chunks_;
  std::vector<std::vector<Client::Ticket>> group_tickets_;
  std::vector<size_t> group_unclocked_;
  std::vector<bool> group_waited_;
  std::vector<bool> shard_clocked_;
  size_t groups_pending_ = 0;
  // Per-shard clocks of group_clock_ started, ClockAndPullGroups not yet.
  bool groups_open_ = false;
  int64_t acked_staleness_ = -1;  // largest staleness WaitAcks saw
  mutable Mutex mu_;
  TrafficStats traffic_ GUARDED_BY(mu_);
  std::vector<TensorBytes> tensor_bytes_ GUARDED_BY(mu_);
};

}  // namespace asyncps::worker
