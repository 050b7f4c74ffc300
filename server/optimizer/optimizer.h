// Server-side optimizers: the update rule a shard applies to one chunk.
//
// An Optimizer is stateless apart from its options: the per-element state
// (momentum buffer, Adam moments, AdaGrad sums) lives with the chunk it
// belongs to and is passed in on every call, so one Optimizer serves every
// chunk of a shard. state_per_elem() tells how many floats of state a chunk
// of n elements needs (n * state_per_elem()).
//
// Hot path: every rule is one branch-free loop over restrict pointers,
// compiled twice (baseline x86-64 and AVX2, picked at load time from the
// CPU); both use the same IEEE single-precision operations in the same order
// (no fused multiply-add, correctly rounded sqrt and division), so the
// result is bitwise the same on any CPU. It allocates nothing.
//
// Every rule is element-wise: ApplyRange() updates elements [begin, end) of
// a chunk exactly as Apply() would, so disjoint ranges of one chunk may be
// updated by different threads and the result is bitwise independent of
// how the chunk was split.
//
// Sparse gradients (top-k / random-k payloads): ApplySparse() is exact only
// when exact_sparse() is true (plain SGD without weight decay: a scatter of
// -lr * value). Every stateful rule (momentum, Nesterov, Adam, AdaGrad) and
// weight decay touch every element on every step, so the shard densifies a
// sparse payload into its per-chunk preallocated scratch buffer and calls
// Apply() instead.
//
// Thread safety: all methods are const; distinct chunks, and disjoint
// ranges of one chunk, may be updated from different threads concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace asyncps::server {

enum class OptimizerKind : uint8_t {
  kSgd = 0,
  kMomentum = 1,  // heavy ball; Nesterov when OptimizerOptions::nesterov
  kAdam = 2,
  kAdaGrad = 3,
};

// "sgd", "momentum", "adam", "adagrad".
const char* OptimizerKindName(OptimizerKind kind);
// Parses one of the names above (also "nesterov" = momentum + nesterov is
// handled by the caller via OptimizerOptions::nesterov).
StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);

struct OptimizerOptions {
  // Update rule. Default: kSgd.
  OptimizerKind kind = OptimizerKind::kSgd;
  // Learning rate, > 0. Default: 0.01.
  float lr = 0.01f;
  // Momentum coefficient mu in [0, 1) (kMomentum). Default: 0.9.
  float momentum = 0.9f;
  // Nesterov momentum (kMomentum). Default: false.
  bool nesterov = false;
  // L2 weight decay lambda >= 0: the gradient becomes g + lambda * w.
  // Default: 0.
  float weight_decay = 0.0f;
  // Adam first/second moment decay in [0, 1). Default: 0.9 / 0.999.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // Adam/AdaGrad denominator epsilon, > 0. Default: 1e-8.
  float eps = 1e-8f;

  // Range checks; InvalidArgument naming the bad field.
  Status Validate() const;
  // One-line description for logs.
  std::string ToString() const;
};

class Optimizer {
 public:
  // Validates `options` and builds the matching rule.
  static StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerOptions& options);
  virtual ~Optimizer() = default;

  const OptimizerOptions& options() const { return options_; }

  // Floats of state per weight element: SGD 0, momentum 1, Adam 2,
  // AdaGrad 1.
  virtual size_t state_per_elem() const = 0;

  // One update of n elements: w, g have n floats, state has
  // n * state_per_elem() floats (zero-initialised before the first step).
  // `step` is the 1-based count of updates this chunk has received,
  // including this one (Adam's bias correction). The effective learning
  // rate is lr * lr_scale. Buffers must not overlap.
  void Apply(float* w, float* state, const float* g, size_t n, float lr_scale,
             uint64_t step) const {
    ApplyRange(w, state, g, n, 0, n, lr_scale, step);
  }

  // The part of Apply() that updates elements [begin, end) of a chunk of n
  // elements (w, g and state as for Apply(); state keeps its layout for n,
  // e.g. Adam's second moment starts at state + n). REQUIRES: begin <= end
  // <= n.
  virtual void ApplyRange(float* w, float* state, const float* g, size_t n,
                          size_t begin, size_t end, float lr_scale,
                          uint64_t step) const = 0;

  // True when ApplySparse() equals Apply() on the densified gradient.
  virtual bool exact_sparse() const { return false; }

  // w[idx[i]] -= lr * lr_scale * vals[i] for i < k. REQUIRES: exact_sparse()
  // and every idx[i] < the chunk's length (the caller validated them).
  virtual void ApplySparse(float* w, const uint32_t* idx, const float* vals,
                           size_t k, float lr_scale) const;

 protected:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}
  OptimizerOptions options_;
};

}  // namespace asyncps::server
