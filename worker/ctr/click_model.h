// ClickModel: a factorization machine (Rendle 2010) over Criteo examples,
// the worker side of a model whose embeddings live in a sparse table.
//
// Parameters:
//   a dense tensor "ctr.dense" of kDenseParams floats: the bias, then one
//     weight per integer feature (input CriteoDense(ex, i));
//   one sparse table "ctr.emb" with a row per categorical key
//     (CriteoKey(field, ex)) of 1 + factor_dim floats: a linear weight w and
//     factors v.
//   logit = bias + sum_i d_i x_i + sum_f w_f
//           + 1/2 sum_k [ (sum_f v_fk)^2 - sum_f v_fk^2 ]
// (the pairwise interactions sum_{f<g} <v_f, v_g> in O(fields x k)).
//
// A batch of n examples uses n x kCriteoCats keys in example-major order
// (Keys()); rows[] and row_grads[] follow the same order, one row per key
// occurrence (the parameter-server client merges repeated keys). Gradients
// are those of the mean log loss over the batch.
//
// Thread safety: const methods are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/layout.h"
#include "common/sparse_table.h"
#include "worker/ctr/criteo.h"

namespace asyncps::worker::ctr {

class ClickModel {
 public:
  static constexpr int kDenseParams = 1 + kCriteoInts;

  // REQUIRES: factor_dim in [0, kMaxRowDim - 1].
  explicit ClickModel(int factor_dim) : k_(factor_dim) {}

  int factor_dim() const { return k_; }
  uint32_t row_dim() const { return static_cast<uint32_t>(1 + k_); }

  // The dense tensor (zeros).
  static TensorSpec DenseSpec();
  // The embedding table: rows N(0, init_scale^2), the given optimizer.
  TableSpec EmbeddingTable(const RowOptimizerOptions& optimizer,
                           float init_scale, uint64_t seed) const;

  // keys[i * kCriteoCats + f] = CriteoKey(f, ex[i]).
  static void Keys(const CriteoExample* ex, size_t n, uint64_t* keys);

  // Logits of n examples.
  void Forward(const CriteoExample* ex, size_t n, const float* dense,
               const float* rows, float* logits) const;

  // Mean log loss of the batch; writes its gradients (dense_grad:
  // kDenseParams floats; row_grads: n x kCriteoCats x row_dim floats).
  double ForwardBackward(const CriteoExample* ex, size_t n, const float* dense,
                         const float* rows, float* dense_grad,
                         float* row_grads) const;

 private:
  double Logit(const CriteoExample& ex, const float* dense, const float* rows,
               float* sums) const;
  int k_;
};

// Mean log loss of logits against 0/1 labels (numerically stable).
double MeanLogLoss(const float* logits, const CriteoExample* ex, size_t n);

}  // namespace asyncps::worker::ctr
