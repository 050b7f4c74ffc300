// LayeredStep: the store calls of a training step that overlaps
// communication with backward (ps_worker --overlap), layer by layer.
//
// Step c of the Trainer then runs
//   BeginBackward(c, grads)
//   Backend::ForwardBackwardLayered with hooks:
//     before layer l's forward:  WaitLayer(l, weights) if a pull is pending
//     after layer l's backward:  LayerGradientsReady(l)  (l = L-1, ..., 0)
//   EndStep()
// so gradients leave while the layers below are still computed, and the
// next step's forward waits for each layer's weights on first use instead
// of for the whole pull. Layer l holds the tensors an implementation was
// built with (for the MLP: 2l and 2l+1, model.h). The implementation over
// the parameter-server shards is worker/overlap.h; the first step's weights
// come from ParameterStore::Pull as without overlap.
//
// Thread safety: used from the trainer's thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace asyncps::worker {

class LayeredStep {
 public:
  virtual ~LayeredStep() = default;

  // Starts step `clock`'s pushes (before its forward); `grads` (one host
  // buffer per tensor) is where backward writes the gradients, read by
  // LayerGradientsReady and EndStep until EndStep returns.
  [[nodiscard]] virtual Status BeginBackward(
      int64_t clock, const std::vector<const float*>& grads) = 0;

  // Layer `layer`'s gradients are complete in the buffers: pushes what is
  // ready (each gradient is pushed once per step). FailedPrecondition
  // while the pull by layers is pending (forward waits for every layer
  // first).
  [[nodiscard]] virtual Status LayerGradientsReady(int layer) = 0;

  // Pushes what LayerGradientsReady did not, announces clock + 1 and starts
  // the pull of its weights, layer groups in forward order.
  [[nodiscard]] virtual Status EndStep() = 0;

  // True between EndStep and the WaitLayer of the last layer.
  virtual bool pull_pending() const = 0;

  // Nanoseconds spent blocked on the store so far that its TrafficStats do
  // not count (waits for acknowledgements between pushes), so the trainer
  // can leave them out of its compute time.
  virtual int64_t uncounted_wait_ns() const = 0;

  // Waits (with the store's deadline) until the weights of layers 0..layer
  // of the pending pull are written into `tensors` (one host buffer per
  // tensor; only those layers' tensors are written). No-op for layers
  // already written or when no pull is pending.
  [[nodiscard]] virtual Status WaitLayer(
      int layer, const std::vector<float*>& tensors) = 0;
};

}  // namespace asyncps::worker
