// asyncps.TableSpec and the sparse-row methods of asyncps.Client:
// worker::Client::StartPullRows / StartPushRows for numpy arrays.
//
// Keys are a 1-d array of uint64 (other integer arrays are converted; a
// negative int64 key is its two's complement), repeats allowed: the client
// sends each shard the unique keys it owns, sums the gradients of repeated
// keys and scatters pulled rows back to every position. Rows are float32
// (n, dim). pull_rows allocates its result before the GIL is released;
// push_rows reads the gradients in place. Both wait (GIL released,
// interruptible) for every shard's reply.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common/sparse_table.h"
#include "worker/python/src/errors.h"
#include "worker/python/src/py_client.h"

namespace py = pybind11;

namespace asyncps::python {
namespace {

using Keys = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using Rows = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The index of `table` (an index or a registered table's name).
uint32_t TableIndex(PyClient& c, const py::object& table) {
  const std::vector<TableSpec>& tables = c.get()->tables();
  if (py::isinstance<py::str>(table)) {
    const std::string name = table.cast<std::string>();
    for (size_t i = 0; i < tables.size(); ++i) {
      if (tables[i].name == name) return static_cast<uint32_t>(i);
    }
    Raise(Status::NotFound("no sparse table '" + name +
                           "' registered on this client"));
  }
  const int64_t i = table.cast<int64_t>();
  if (i < 0 || static_cast<size_t>(i) >= tables.size()) {
    Raise(Status::NotFound("sparse table " + std::to_string(i) + " of " +
                           std::to_string(tables.size()) +
                           " registered on this client"));
  }
  return static_cast<uint32_t>(i);
}

void CheckKeys(const Keys& keys, const char* what) {
  if (keys.ndim() != 1) {
    Raise(Status::InvalidArgument(std::string(what) +
                                  ": keys must be a 1-d array, not " +
                                  std::to_string(keys.ndim()) + "-d"));
  }
}

py::array_t<float> PullRows(PyClient& c, const py::object& table,
                            const Keys& keys, int64_t clock) {
  CheckKeys(keys, "pull_rows");
  const uint32_t t = TableIndex(c, table);
  const size_t n = static_cast<size_t>(keys.shape(0));
  const size_t dim = c.get()->tables()[t].dim;
  py::array_t<float> out({n, dim});
  worker::RowsPull p{t, keys.data(), n, out.mutable_data()};
  if (n == 0) return out;
  ThrowIfError(c.Run([&]() -> Status {
    ASSIGN_OR_RETURN(worker::Client::Ticket ticket,
                     c.get()->StartPullRows(clock, {}, {p}));
    return c.get()->Wait(ticket, c.get()->options().deadline);
  }));
  return out;
}

void PushRows(PyClient& c, const py::object& table, const Keys& keys,
              const Rows& grads, int64_t clock) {
  CheckKeys(keys, "push_rows");
  const uint32_t t = TableIndex(c, table);
  const TableSpec& spec = c.get()->tables()[t];
  const size_t n = static_cast<size_t>(keys.shape(0));
  const bool shaped = grads.ndim() == 2 &&
                      static_cast<size_t>(grads.shape(0)) == n &&
                      static_cast<size_t>(grads.shape(1)) == spec.dim;
  if (!shaped && !(grads.ndim() == 1 &&
                   static_cast<size_t>(grads.shape(0)) == n * spec.dim)) {
    std::string shape;
    for (py::ssize_t i = 0; i < grads.ndim(); ++i)
      shape += (i ? ", " : "") + std::to_string(grads.shape(i));
    Raise(Status::InvalidArgument(
        "push_rows: table '" + spec.name + "' needs gradients of shape (" +
        std::to_string(n) + ", " + std::to_string(spec.dim) + "), got (" +
        shape + ")"));
  }
  if (n == 0) return;
  worker::RowsPush p{t, keys.data(), n, grads.data()};
  ThrowIfError(c.Run([&]() -> Status {
    ASSIGN_OR_RETURN(worker::Client::Ticket ticket,
                     c.get()->StartPushRows(clock, {}, {p}));
    return c.get()->Wait(ticket, c.get()->options().deadline);
  }));
}

}  // namespace

void BindTables(py::module_& m) {
  py::class_<TableSpec>(m, "TableSpec", R"doc(
A sparse table: rows of `dim` floats by uint64 key, stored by the shards
(RocksDB behind a row cache) with a per-row optimizer applied there.

init: zeros | constant | uniform (U(-param, param)) | normal (N(0, param^2));
a row never pushed is its initial value, a function of (seed, name, key).
optimizer: sgd | adagrad | adam (lr, beta1, beta2, eps, initial_accumulator).
admit_after: a key is stored from its N-th push on; expire_after: a row not
pushed for N clocks reads as its initial value again (0: never).)doc")
      .def(py::init([](std::string name, uint32_t dim, const std::string& init,
                       float param, uint64_t seed, const std::string& optimizer,
                       float lr, float beta1, float beta2, float eps,
                       float initial_accumulator, uint32_t admit_after,
                       int64_t expire_after) {
             TableSpec t;
             t.name = std::move(name);
             t.dim = dim;
             t.init = ValueOrThrow(ParseInit(init));
             t.init_param = param;
             t.seed = seed;
             t.optimizer.kind = ValueOrThrow(ParseRowOptimizerKind(optimizer));
             t.optimizer.lr = lr;
             t.optimizer.beta1 = beta1;
             t.optimizer.beta2 = beta2;
             t.optimizer.eps = eps;
             t.optimizer.initial_accumulator = initial_accumulator;
             t.admit_after_pushes = admit_after;
             t.expire_after_clocks = expire_after;
             ThrowIfError(t.Validate());
             return t;
           }),
           py::arg("name"), py::arg("dim"), py::arg("init") = "zeros",
           py::arg("param") = 0.0f, py::arg("seed") = 0,
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01f,
           py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
           py::arg("eps") = 1e-8f, py::arg("initial_accumulator") = 0.0f,
           py::arg("admit_after") = 0, py::arg("expire_after") = 0)
      .def_readonly("name", &TableSpec::name)
      .def_readonly("dim", &TableSpec::dim)
      .def_property_readonly(
          "init", [](const TableSpec& t) { return InitName(t.init); })
      .def_readonly("param", &TableSpec::init_param)
      .def_readonly("seed", &TableSpec::seed)
      .def_property_readonly("optimizer",
                             [](const TableSpec& t) {
                               return RowOptimizerKindName(t.optimizer.kind);
                             })
      .def_property_readonly("lr",
                             [](const TableSpec& t) { return t.optimizer.lr; })
      .def_readonly("admit_after", &TableSpec::admit_after_pushes)
      .def_readonly("expire_after", &TableSpec::expire_after_clocks)
      .def(
          "initial_rows",
          [](const TableSpec& t, const Keys& keys) {
            CheckKeys(keys, "initial_rows");
            const size_t n = static_cast<size_t>(keys.shape(0));
            py::array_t<float> out({n, static_cast<size_t>(t.dim)});
            for (size_t i = 0; i < n; ++i)
              InitializeRow(t, keys.data()[i], out.mutable_data() + i * t.dim);
            return out;
          },
          py::arg("keys"), "The rows of `keys` before any push, (n, dim).")
      .def("__eq__",
           [](const TableSpec& a, const TableSpec& b) { return a == b; })
      .def("__repr__", [](const TableSpec& t) {
        return "TableSpec('" + t.name + "', " + std::to_string(t.dim) + ", '" +
               InitName(t.init) + "', optimizer='" +
               RowOptimizerKindName(t.optimizer.kind) + "')";
      });
}

void AddRowMethods(py::class_<PyClient, std::shared_ptr<PyClient>>& c) {
  c.def_property_readonly(
       "tables", [](PyClient& pc) { return pc.get()->tables(); },
       "The sparse tables registered by this client.")
      .def("pull_rows", &PullRows, py::arg("table"), py::arg("keys"),
           py::arg("clock") = 0,
           "Rows of `keys` (1-d uint64, repeats allowed) of `table` (index or "
           "name) as float32 (n, dim), as fresh as the consistency mode "
           "requires for a worker at `clock`.")
      .def("push_rows", &PushRows, py::arg("table"), py::arg("keys"),
           py::arg("grads"), py::arg("clock") = 0,
           "Pushes gradients (float32 (n, dim)) of the rows of `keys` (repeats "
           "summed) made at `clock`; the table's optimizer applies them on "
           "the shards. Returns once every shard acknowledged.");
}

}  // namespace asyncps::python
