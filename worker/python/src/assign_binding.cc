// asyncps.Client.upload and Client.lr: fine-tuning from a worker's values
// (worker/upload.h) and the learning rate carried by pushes and clocks.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "worker/python/src/arrays.h"
#include "worker/python/src/errors.h"
#include "worker/python/src/py_client.h"
#include "worker/upload.h"

namespace py = pybind11;

namespace asyncps::python {

namespace {

using KeysArray =
    py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using RowsArray = py::array_t<float, py::array::c_style>;

using StepsArray =
    py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

// The optimizer state of n rows of `table` in an upload's rows entry:
// (row optimizer name, float32 (n, dim x k) state, uint64 (n,) steps)
// pointed to by `out` (shapes checked here, values by UploadValues), the
// arrays kept alive in `keep`.
void CheckedRowState(const TableSpec& table, size_t n, const py::tuple& t,
                     worker::RowsValues* out, std::vector<py::object>* keep) {
  out->optimizer = t[3].cast<std::string>();
  const size_t k = table.dim * table.optimizer.state_per_elem();
  py::array state = py::reinterpret_borrow<py::array>(t[4]);
  RowsArray s = RowsArray::ensure(state);
  if (!s || !state.dtype().is(py::dtype::of<float>()) || s.ndim() != 2 ||
      static_cast<size_t>(s.shape(0)) != n ||
      static_cast<size_t>(s.shape(1)) != k) {
    Raise(Status::InvalidArgument(
        "optimizer state of the rows of '" + table.name + "': float32 (" +
        std::to_string(n) + ", " + std::to_string(k) + ")"));
  }
  StepsArray steps = StepsArray::ensure(t[5]);
  if (!steps || steps.ndim() != 1 || static_cast<size_t>(steps.shape(0)) != n) {
    Raise(Status::InvalidArgument("optimizer steps of the rows of '" +
                                  table.name + "': uint64 (" +
                                  std::to_string(n) + ",)"));
  }
  keep->push_back(s);
  keep->push_back(steps);
  out->state = s.data();
  out->steps = steps.data();
  if (t.size() < 8) return;
  using KindsArray =
      py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;
  using ClocksArray =
      py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
  KindsArray kinds = KindsArray::ensure(t[6]);
  ClocksArray clocks = ClocksArray::ensure(t[7]);
  if (!kinds || !clocks || kinds.ndim() != 1 || clocks.ndim() != 1 ||
      static_cast<size_t>(kinds.shape(0)) != n ||
      static_cast<size_t>(clocks.shape(0)) != n) {
    Raise(Status::InvalidArgument(
        "saved kinds and clocks of the rows of '" + table.name + "': uint32 (" +
        std::to_string(n) + ",) and int64 (" + std::to_string(n) + ",)"));
  }
  keep->push_back(kinds);
  keep->push_back(clocks);
  out->kinds = kinds.data();
  out->clocks = clocks.data();
}

// A table index or name of an upload argument -> the table's index.
uint32_t TableIndex(PyClient& self, py::handle t, const char* what) {
  const std::vector<TableSpec>& tables = self.tables();
  if (py::isinstance<py::str>(t)) {
    const std::string name = t.cast<std::string>();
    size_t i = 0;
    while (i < tables.size() && tables[i].name != name) ++i;
    if (i == tables.size()) {
      Raise(Status::NotFound(std::string(what) + ": no registered table '" +
                             name + "'"));
    }
    return static_cast<uint32_t>(i);
  }
  const uint32_t table = t.cast<uint32_t>();
  if (table >= tables.size()) {
    Raise(Status::NotFound(std::string(what) + ": no table " +
                           std::to_string(table)));
  }
  return table;
}

// (table index or name, keys, values[, optimizer, state, steps]) ->
// RowsValues pointing into the arrays, kept alive in `keep`.
std::vector<worker::RowsValues> CheckedRows(PyClient& self,
                                            const py::sequence& rows,
                                            std::vector<py::object>* keep) {
  std::vector<worker::RowsValues> out;
  const std::vector<TableSpec>& tables = self.tables();
  for (py::handle item : rows) {
    py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
    if (t.size() != 3 && t.size() != 6 && t.size() != 8) {
      Raise(Status::InvalidArgument(
          "rows: each entry is (table, keys, values), (table, keys, values, "
          "optimizer, state, steps) or (..., steps, kinds, clocks)"));
    }
    const uint32_t table = TableIndex(self, t[0], "rows");
    KeysArray keys = KeysArray::ensure(t[1]);
    if (!keys || keys.ndim() != 1)
      Raise(Status::InvalidArgument("rows of '" + tables[table].name +
                                    "': keys must be a 1-d uint64 array"));
    py::array values = py::reinterpret_borrow<py::array>(t[2]);
    RowsArray v = RowsArray::ensure(values);
    const size_t n = static_cast<size_t>(keys.shape(0));
    if (!v || !values.dtype().is(py::dtype::of<float>()) || v.ndim() != 2 ||
        static_cast<size_t>(v.shape(0)) != n ||
        static_cast<size_t>(v.shape(1)) != tables[table].dim) {
      Raise(Status::InvalidArgument(
          "rows of '" + tables[table].name + "': values must be float32 (" +
          std::to_string(n) + ", " + std::to_string(tables[table].dim) + ")"));
    }
    keep->push_back(keys);
    keep->push_back(v);
    worker::RowsValues r;
    r.table = table;
    r.keys = keys.data();
    r.n = n;
    r.values = v.data();
    if (t.size() >= 6) CheckedRowState(tables[table], n, t, &r, keep);
    out.push_back(std::move(r));
  }
  return out;
}

// Client.read_rows: (values (n, dim), state (n, dim x k), steps (n,)) of
// `keys` of table index `table`.
py::tuple ReadRows(PyClient& self, uint32_t table, const KeysArray& keys,
                   double timeout_s) {
  const TableSpec& spec = self.tables()[table];
  const size_t n = static_cast<size_t>(keys.shape(0));
  const size_t dim = spec.dim;
  const size_t k = dim * spec.optimizer.state_per_elem();
  const size_t bytes = worker::RowRecordBytes(spec);
  std::vector<uint8_t> records(n * bytes);
  ThrowIfError(self.Run([&] {
    return self.get()->ReadRowRecords(
        table, keys.data(), n, records.data(),
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  }));
  py::array_t<float> values({n, dim});
  py::array_t<float> state({n, k});
  py::array_t<uint64_t> steps(static_cast<py::ssize_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* rec = records.data() + i * bytes;
    std::memcpy(steps.mutable_data() + i, rec, sizeof(uint64_t));
    rec += sizeof(uint64_t);
    std::memcpy(values.mutable_data() + i * dim, rec, dim * sizeof(float));
    std::memcpy(state.mutable_data() + i * k, rec + dim * sizeof(float),
                k * sizeof(float));
  }
  return py::make_tuple(values, state, steps);
}

// Client.scan_rows: every saved entry of table index `table` (ScanTable):
// (keys (m,), kinds (m,), counts (m,), clocks (m,), values (m, dim), state
// (m, dim x k)).
py::tuple ScanRows(PyClient& self, uint32_t table, size_t page_rows,
                   double timeout_s) {
  const TableSpec& spec = self.tables()[table];
  const size_t dim = spec.dim;
  const size_t k = dim * spec.optimizer.state_per_elem();
  const size_t bytes = SavedRecordBytes(spec);
  worker::SavedRows saved;
  ThrowIfError(self.Run([&] {
    return worker::ScanTable(
        self.get(), table, page_rows, &saved,
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  }));
  const size_t m = saved.keys.size();
  py::array_t<uint64_t> keys(static_cast<py::ssize_t>(m));
  py::array_t<uint32_t> kinds(static_cast<py::ssize_t>(m));
  py::array_t<uint64_t> counts(static_cast<py::ssize_t>(m));
  py::array_t<int64_t> clocks(static_cast<py::ssize_t>(m));
  py::array_t<float> values({m, dim});
  py::array_t<float> state({m, k});
  if (m > 0)
    std::memcpy(keys.mutable_data(), saved.keys.data(), m * sizeof(uint64_t));
  for (size_t i = 0; i < m; ++i) {
    const uint8_t* rec = saved.records.data() + i * bytes;
    std::memcpy(kinds.mutable_data() + i, rec, sizeof(uint32_t));
    std::memcpy(counts.mutable_data() + i, rec + 8, sizeof(uint64_t));
    std::memcpy(clocks.mutable_data() + i, rec + 16, sizeof(int64_t));
    rec += kSavedHeaderBytes;
    std::memcpy(values.mutable_data() + i * dim, rec, dim * sizeof(float));
    std::memcpy(state.mutable_data() + i * k, rec + dim * sizeof(float),
                k * sizeof(float));
  }
  return py::make_tuple(keys, kinds, counts, clocks, values, state);
}

// For each tensor, its chunk ids in offset order (ids are tensor-major).
std::vector<std::vector<uint32_t>> TensorChunks(const Layout& l) {
  std::vector<std::vector<uint32_t>> out(l.tensors().size());
  for (const ChunkSpec& c : l.chunks()) out[c.tensor].push_back(c.id);
  return out;
}

// (optimizer name, k lists of one float32 array per tensor, one uint64 array
// per tensor of its chunks' steps in offset order, or of one step for all of
// them) -> StateValues pointing into the arrays (kept alive by `state`).
worker::StateValues CheckedState(PyClient& self, const py::object& state) {
  py::tuple t = state.cast<py::tuple>();
  if (t.size() != 3) {
    Raise(Status::InvalidArgument(
        "state: (optimizer name, slots, steps per tensor)"));
  }
  worker::StateValues out;
  out.optimizer = t[0].cast<std::string>();
  for (py::handle slot : t[1].cast<py::sequence>()) {
    std::vector<float*> ptrs =
        CheckedBuffers(py::reinterpret_borrow<py::sequence>(slot), self.specs(),
                       false, "upload of optimizer state");
    out.slots.emplace_back(ptrs.begin(), ptrs.end());
  }
  const Layout& l = self.get()->layout();
  const auto chunks = TensorChunks(l);
  py::sequence steps = t[2].cast<py::sequence>();
  if (steps.size() != chunks.size()) {
    Raise(Status::InvalidArgument(
        "state: steps of " + std::to_string(steps.size()) + " tensors, " +
        std::to_string(chunks.size()) + " registered"));
  }
  out.chunk_steps.assign(l.chunks().size(), 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    using Steps =
        py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
    Steps a = Steps::ensure(steps[i]);
    const size_t n = a ? static_cast<size_t>(a.size()) : 0;
    if (!a || a.ndim() > 1 || (n != chunks[i].size() && n != 1)) {
      Raise(Status::InvalidArgument(
          "optimizer state of '" + self.specs()[i].name +
          "': give one step count or one per chunk (" +
          std::to_string(chunks[i].size()) + "), got " + std::to_string(n)));
    }
    for (size_t j = 0; j < chunks[i].size(); ++j)
      out.chunk_steps[chunks[i][j]] = a.data()[n == 1 ? 0 : j];
  }
  return out;
}

// Client.upload: see its docstring in AddAssignMethods.
bool Upload(PyClient& self, const py::sequence& arrays, bool overwrite,
            uint64_t max_request_bytes, double timeout_s,
            const py::sequence& rows, const py::object& state,
            const py::sequence& clear) {
  if (!self.registered()) {
    Raise(Status::FailedPrecondition(
        "upload before register(): register the model first"));
  }
  std::vector<float*> ptrs =
      CheckedBuffers(arrays, self.specs(), false, "upload");
  std::vector<const float*> values(ptrs.begin(), ptrs.end());
  std::vector<py::object> keep;
  std::vector<worker::RowsValues> row_values = CheckedRows(self, rows, &keep);
  // Tables cleared first (kAssign phase 8): their rows entry, or an
  // entry of no rows.
  for (py::handle item : clear) {
    const uint32_t table = TableIndex(self, item, "clear");
    auto it = std::find_if(
        row_values.begin(), row_values.end(),
        [&](const worker::RowsValues& r) { return r.table == table; });
    if (it == row_values.end()) {
      row_values.emplace_back();
      row_values.back().table = table;
      it = row_values.end() - 1;
    } else if (it->clear) {
      Raise(Status::InvalidArgument(
          "clear: table '" + self.tables()[table].name + "' named twice"));
    }
    it->clear = true;
  }
  worker::UploadOptions o;
  o.overwrite = overwrite;
  o.max_request_bytes = max_request_bytes;
  o.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  worker::StateValues st;
  if (!state.is_none()) st = CheckedState(self, state);
  bool uploaded = false;
  ThrowIfError(self.Run([&] {
    return worker::UploadValues(self.get(), values, o, &uploaded, row_values,
                                state.is_none() ? nullptr : &st);
  }));
  return uploaded;
}

// Client.optimizer_state: (k, k lists of arrays, steps, chunk steps).
py::tuple OptimizerState(PyClient& self, double timeout_s) {
  if (!self.registered()) {
    Raise(Status::FailedPrecondition("optimizer_state before register()"));
  }
  worker::OptimizerState st;
  ThrowIfError(self.Run([&] {
    return self.get()->ReadOptimizerState(
        &st,
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  }));
  py::list slots;
  for (auto& slot : st.slots) {
    py::list tensors;
    for (size_t t = 0; t < slot.size(); ++t) {
      const auto& shape = self.specs()[t].shape;
      std::vector<py::ssize_t> dims(shape.begin(), shape.end());
      py::array_t<float> a(dims);
      std::memcpy(a.mutable_data(), slot[t].data(),
                  slot[t].size() * sizeof(float));
      tensors.append(a);
    }
    slots.append(tensors);
  }
  py::list steps;
  for (const auto& ids : TensorChunks(self.get()->layout())) {
    py::array_t<uint64_t> a(static_cast<py::ssize_t>(ids.size()));
    for (size_t j = 0; j < ids.size(); ++j)
      a.mutable_data()[j] =
          ids[j] < st.chunk_steps.size() ? st.chunk_steps[ids[j]] : 0;
    steps.append(a);
  }
  return py::make_tuple(st.per_weight, slots, st.steps, steps);
}

}  // namespace

void AddAssignMethods(py::class_<PyClient, std::shared_ptr<PyClient>>& c) {
  c.def("upload", &Upload, py::arg("values"), py::arg("overwrite") = false,
        py::arg("max_request_bytes") = uint64_t{16} << 20,
        py::arg("timeout_s") = 600.0, py::arg("rows") = py::list(),
        py::arg("state") = py::none(), py::arg("clear") = py::list(),
        "Makes `values` (float32 arrays, one per registered tensor) the "
        "shards' weights, unless another worker's upload wins the race or "
        "the shards' values are final (trained or uploaded) and not "
        "`overwrite`: then waits until that upload is complete. Returns True "
        "when these values were written (worker/upload.h). `rows`: "
        "(table index or name, uint64 keys, float32 (n, dim) values) per "
        "sparse table, set in the same upload with zero optimizer state, or "
        "(..., row optimizer name, float32 (n, dim x k) state, uint64 (n,) "
        "steps) with that state (as read_rows gives it; a table running "
        "another row optimizer refuses it). `state`: (optimizer name, k "
        "lists of one float32 array per tensor, one uint64 array per tensor "
        "of its chunks' optimizer steps or of one for all) becomes the "
        "shards' optimizer state (kAssign phase 4; a shard running another "
        "optimizer refuses it before any value is written); without it the "
        "shards' optimizer state restarts from zero. `clear`: tables (index "
        "or name) whose every entry each shard drops first (kAssign phase "
        "8), so they hold exactly the rows given (a restore of a table "
        "saved whole); other tables keep the rows of keys not given.")
      .def("optimizer_state", &OptimizerState, py::arg("timeout_s") = 120.0,
           "The shards' optimizer state: (floats per weight k, k lists of "
           "one float32 array per registered tensor -- Adam: m then v; "
           "momentum and AdaGrad: one --, the most optimizer steps of any "
           "chunk, one uint64 array per tensor of its chunks' steps in "
           "offset order).")
      .def(
          "read_rows",
          [](PyClient& self, uint32_t table, const KeysArray& keys,
             double timeout_s) {
            if (!self.registered() || table >= self.tables().size()) {
              Raise(Status::NotFound("read_rows: no registered table " +
                                     std::to_string(table)));
            }
            if (keys.ndim() != 1) {
              Raise(Status::InvalidArgument(
                  "read_rows: keys must be a 1-d uint64 array"));
            }
            return ReadRows(self, table, keys, timeout_s);
          },
          py::arg("table"), py::arg("keys"), py::arg("timeout_s") = 120.0,
          "The shards' rows of `keys` (1-d uint64, each once) of table "
          "index `table` with their optimizer state: (float32 (n, dim) "
          "values, float32 (n, dim x k) state -- per row [slot 0 | slot 1 "
          "...]: adagrad the sum, adam m then v, sgd none --, uint64 (n,) "
          "optimizer steps). A key without a row reads as its initial value "
          "and state, 0 steps. Not clock-bound (a read, as optimizer_state).")
      .def(
          "scan_rows",
          [](PyClient& self, uint32_t table, size_t page_rows,
             double timeout_s) {
            if (!self.registered() || table >= self.tables().size()) {
              Raise(Status::NotFound("scan_rows: no registered table " +
                                     std::to_string(table)));
            }
            if (page_rows < 1) {
              Raise(
                  Status::InvalidArgument("scan_rows: page_rows must be >= 1"));
            }
            return ScanRows(self, table, page_rows, timeout_s);
          },
          py::arg("table"), py::arg("page_rows") = 4096,
          py::arg("timeout_s") = 600.0,
          "Every entry the shards hold of table index `table`, rows and "
          "admission counters (not expired), read in pages of page_rows per "
          "shard (kAssign phase 6): (uint64 (m,) keys in increasing order, "
          "uint32 (m,) kinds -- 1 row, 2 admission counter --, uint64 (m,) "
          "counts -- a row's optimizer steps, a counter's pushes counted --, "
          "int64 (m,) clock of each entry's last push, float32 (m, dim) "
          "values, float32 (m, dim x k) optimizer state, as read_rows; a "
          "counter's are 0). upload(rows=[(table, keys, values, optimizer, "
          "state, counts, kinds, clocks)]) restores them.")
      .def_property(
          "lr", [](PyClient& self) { return self.get()->lr(); },
          [](PyClient& self, float lr) {
            if (!(lr >= 0.0f)) {
              Raise(Status::InvalidArgument("lr must be >= 0 (0: not set)"));
            }
            self.get()->set_lr(lr);
          },
          "Learning rate carried by every later push and clock (> 0: the "
          "shards apply it instead of ps_server --lr and its schedule, up to "
          "--max_lr; 0: not carried).");
}

}  // namespace asyncps::python
