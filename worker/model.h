// The MLP model definition shared by backends, parameter stores and servers.
//
// An MLP with layer sizes {d0, d1, ..., dL} has L fully connected layers;
// layer i (0-based) maps d_i -> d_{i+1} as y = x W + b with ReLU after every
// layer but the last, whose outputs are logits for softmax cross-entropy.
// Its parameters, in order, are
//   fc<i>.weight  shape {d_i, d_{i+1}} (row-major, in x out), He-normal init
//   fc<i>.bias    shape {d_{i+1}}, zeros
// so tensor 2i is layer i's weight and tensor 2i+1 its bias.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/status.h"

namespace asyncps::worker {

// Checks that there are at least two sizes, all in [1, 1<<20].
Status ValidateLayers(const std::vector<int>& layers);

// The parameter tensors of the MLP (see above). Initial values come from
// InitializeTensorRange(spec, ...), seeded by `seed`, so every process that
// builds the same specs starts from the same weights.
std::vector<TensorSpec> MlpTensorSpecs(const std::vector<int>& layers,
                                       uint64_t seed);

// Parses "784,256,128,10". InvalidArgument on malformed input.
StatusOr<std::vector<int>> ParseLayers(const std::string& text);

// "784-256-128-10".
std::string LayersToString(const std::vector<int>& layers);

// Fills freshly allocated host tensors with the specs' initial values.
std::vector<std::vector<float>> InitializeTensors(
    const std::vector<TensorSpec>& specs);

}  // namespace asyncps::worker
