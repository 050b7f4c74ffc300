// PyClient: a worker::Client owned by Python, with the lock and the Ctrl-C
// hook around it (see errors.h), shared by the Client and Store bindings
// (client_binding.cc) and the sparse-row methods (rows_binding.cc).
//
// Thread safety: every call that may wait releases the GIL and holds mu_, so
// Python threads may share one PyClient; registered_/specs_/tables_ change
// only with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/sparse_table.h"
#include "worker/client.h"
#include "worker/python/src/errors.h"

namespace asyncps::python {

// Initialiser names of TensorSpec and TableSpec: zeros, constant, uniform,
// normal, he_normal, xavier_uniform.
inline StatusOr<InitKind> ParseInit(const std::string& s) {
  if (s == "zeros") return InitKind::kZeros;
  if (s == "constant") return InitKind::kConstant;
  if (s == "uniform") return InitKind::kUniform;
  if (s == "normal") return InitKind::kNormal;
  if (s == "he_normal") return InitKind::kHeNormal;
  if (s == "xavier_uniform") return InitKind::kXavierUniform;
  return Status::InvalidArgument(
      "unknown initialiser '" + s +
      "' (zeros, constant, uniform, normal, he_normal, xavier_uniform)");
}

inline const char* InitName(InitKind k) {
  switch (k) {
    case InitKind::kConstant:
      return "constant";
    case InitKind::kUniform:
      return "uniform";
    case InitKind::kNormal:
      return "normal";
    case InitKind::kHeNormal:
      return "he_normal";
    case InitKind::kXavierUniform:
      return "xavier_uniform";
    default:
      return "zeros";
  }
}

class PyClient {
 public:
  explicit PyClient(worker::ClientOptions o)
      : interrupter_(std::make_shared<Interrupter>()) {
    std::shared_ptr<Interrupter> hook = interrupter_;
    o.interrupt = [hook]() { return hook->Check(); };
    client_ = ValueOrThrow(worker::Client::Create(o));
  }

  // Runs f() without the GIL, under the client's lock; raises a pending
  // KeyboardInterrupt first, else returns f's status.
  template <typename F>
  Status Run(F&& f) {
    Status s = RunWithoutGil(std::forward<F>(f));
    interrupter_->RethrowIfInterrupted();
    return s;
  }

  // As Run, for destructors: never throws (an interrupt is deferred).
  template <typename F>
  void RunQuietly(F&& f) {
    (void)RunWithoutGil(std::forward<F>(f));
    interrupter_->DeferIfInterrupted();
  }

  // Registers the tensors and sparse tables (worker::Client::RegisterModel).
  // Of `lo`, the cut (chunk_elems, min_chunk_elems) and the placement count;
  // the shard count is the client's.
  void Register(const std::vector<TensorSpec>& specs, const LayoutOptions& lo,
                const std::vector<TableSpec>& tables) {
    ThrowIfError(Run([&] {
      return client_->RegisterModel(specs, lo, tables).WithContext("register");
    }));
    specs_ = specs;
    tables_ = tables;
    registered_ = true;
  }

  worker::Client* get() { return client_.get(); }
  bool registered() const { return registered_; }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  const std::vector<TableSpec>& tables() const { return tables_; }

 private:
  template <typename F>
  Status RunWithoutGil(F&& f) {
    pybind11::gil_scoped_release nogil;
    std::lock_guard<std::mutex> l(mu_);
    return f();
  }

  std::shared_ptr<Interrupter> interrupter_;
  std::unique_ptr<worker::Client> client_;
  std::mutex mu_;
  bool registered_ = false;        // by the Python thread holding the GIL
  std::vector<TensorSpec> specs_;  // what was registered
  std::vector<TableSpec> tables_;
};

// rows_binding.cc: asyncps.TableSpec, and Client.tables, pull_rows and
// push_rows.
void BindTables(pybind11::module_& m);
void AddRowMethods(pybind11::class_<PyClient, std::shared_ptr<PyClient>>& c);
// assign_binding.cc: Client.upload and Client.lr.
void AddAssignMethods(pybind11::class_<PyClient, std::shared_ptr<PyClient>>& c);

}  // namespace asyncps::python
