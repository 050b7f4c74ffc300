// ParameterStore: the trainer's view of the model's weights.
//
// The trainer runs   Pull(c) -> compute -> Push(c, grads) -> Clock(c + 1)
// for c = 0, 1, 2, ... . Implementations: LocalParameterStore (in-process
// weights and optimizer, used by ps_train_local and tests) and the
// parameter-server client store (worker/ps_store.h), whose Pull blocks as the
// consistency mode (BSP / SSP / ASP) requires.
//
// Tensors are passed as one host buffer per tensor, in the order of the
// TensorSpec list the store was built from (for the MLP: worker/model.h).
// A store may also accept gradients in device memory (PushDevice), so a GPU
// worker compresses them on the device.
//
// Thread safety: implementations must allow traffic() from any thread; the
// other methods are called from the trainer's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace asyncps::worker {

// Cumulative counters since the store was created.
struct TrafficStats {
  uint64_t bytes_pushed_raw = 0;   // dense fp32 gradient bytes given to Push
  uint64_t bytes_pushed_wire = 0;  // bytes sent after compression
  uint64_t bytes_pulled = 0;       // weight bytes received
  int64_t pull_wait_ns = 0;        // time spent blocked in Pull
  int64_t encode_ns = 0;           // time spent compressing gradients
  // Where a step's time goes besides compute (a store that does not know
  // leaves them 0). pull_wait_ns includes pull_copy_ns; push_ns includes
  // encode_ns and push_copy_ns.
  int64_t pull_copy_ns = 0;  // copying pulled weights into the tensors
  int64_t push_ns = 0;       // in Push/PushDevice: encode, copy, hand-off
  int64_t push_copy_ns = 0;  // copying uncompressed gradients to send
  int64_t clock_ns = 0;      // in Clock (with its prefetch start or wait)
  // Staleness of the latest applied push; -1 when unknown.
  int64_t last_staleness = -1;
};

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  // Fills `tensors` (one host buffer per tensor, each num_elements floats)
  // with weights at least as fresh as the consistency mode requires for a
  // worker at clock `clock`. May block (with a deadline of its own).
  [[nodiscard]] virtual Status Pull(int64_t clock,
                                    const std::vector<float*>& tensors) = 0;

  // Host buffers for the next step's gradients, one per tensor (each
  // num_elements floats, contents undefined), valid until the next call:
  // a store that offers them pushes gradients written there without
  // copying them (they go to the transport as they are). Returns false
  // when the store has none to offer: the caller keeps its own buffers.
  // Default: false.
  virtual bool NextGradientBuffers(std::vector<float*>* grads) {
    (void)grads;
    return false;
  }

  // Sends the gradients (of the mean loss over this worker's minibatch)
  // computed from the weights pulled at `clock`. The buffers may be reused
  // as soon as this returns (those of NextGradientBuffers are the store's:
  // they are not written again before that call hands them out again).
  [[nodiscard]] virtual Status Push(int64_t clock,
                                    const std::vector<const float*>& grads) = 0;

  // True when PushDevice may be called: the store compresses gradients that
  // stay in device memory (Backend::device_grad) and copies only payloads to
  // the host. Default: false (host gradients only).
  virtual bool AcceptsDeviceGradients() const { return false; }

  // As Push, but device_grads are device pointers (one per tensor, same
  // order and sizes), complete when called and read only during the call.
  // Use either Push or PushDevice for a whole run: they may keep separate
  // compression state. Default: Unimplemented.
  [[nodiscard]] virtual Status PushDevice(
      int64_t clock, const std::vector<const float*>& device_grads) {
    (void)clock;
    (void)device_grads;
    return Status::Unimplemented("this store takes host gradients only");
  }

  // Announces that this worker has finished iteration new_clock - 1.
  [[nodiscard]] virtual Status Clock(int64_t new_clock) = 0;

  virtual TrafficStats traffic() const = 0;
};

}  // namespace asyncps::worker
