// Data helpers shared with ps_worker: the IDX/MNIST reader
// (worker/idx_reader.h) and the rank partition with per-epoch shuffling
// (worker/data_partition.h), so a Python worker sees exactly the examples a
// C++ worker of the same rank would.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "worker/data_partition.h"
#include "worker/idx_reader.h"
#include "worker/python/src/bindings.h"
#include "worker/python/src/errors.h"

namespace py = pybind11;

namespace asyncps::python {

namespace {

using worker::PartitionKind;
using worker::PartitionOptions;

// A numpy array owning `v` (no copy).
template <typename T>
py::array_t<T> Adopt(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free(owned,
                   [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), free);
}

PartitionOptions MakePartition(int rank, int num_workers,
                               const std::string& kind, uint64_t seed) {
  PartitionOptions o;
  o.rank = rank;
  o.num_workers = num_workers;
  o.seed = seed;
  if (kind == "strided") {
    o.kind = PartitionKind::kStrided;
  } else if (kind == "contiguous") {
    o.kind = PartitionKind::kContiguous;
  } else {
    Raise(
        Status::InvalidArgument("partition kind must be strided or "
                                "contiguous, got '" +
                                kind + "'"));
  }
  return o;
}

}  // namespace

void BindData(py::module_& m) {
  m.attr("FASHION_MNIST_MEAN") = worker::kFashionMnistMean;
  m.attr("FASHION_MNIST_STDDEV") = worker::kFashionMnistStddev;
  m.def(
      "load_mnist",
      [](const std::string& dir, const std::string& split, float mean,
         float stddev) {
        worker::Split sp;
        if (split == "train") {
          sp = worker::Split::kTrain;
        } else if (split == "test") {
          sp = worker::Split::kTest;
        } else {
          Raise(Status::InvalidArgument("split must be train or test"));
        }
        if (!(stddev > 0)) Raise(Status::InvalidArgument("stddev must be > 0"));
        worker::MnistOptions o;
        o.mean = mean;
        o.stddev = stddev;
        StatusOr<worker::Dataset> d = Status::OK();
        {
          py::gil_scoped_release nogil;
          d = worker::LoadMnist(dir, sp, o);
        }
        worker::Dataset ds = ValueOrThrow(std::move(d));
        const py::ssize_t n = ds.num_examples;
        return py::make_tuple(
            Adopt(std::move(ds.images), {n, ds.rows, ds.cols}),
            Adopt(std::move(ds.labels), {n}));
      },
      py::arg("data_dir"), py::arg("split"), py::arg("mean") = 0.0f,
      py::arg("stddev") = 1.0f,
      R"doc(Reads <split>-images-idx3-ubyte[.gz] and <split>-labels-idx1-ubyte[.gz]
from data_dir as ps_worker does: (images float32 [N, rows, cols] with pixels
(p / 255 - mean) / stddev, labels uint8 [N]). Errors name the file.)doc");
  m.def(
      "epoch_order",
      [](int64_t n, int rank, int num_workers, uint64_t seed, int64_t epoch,
         const std::string& kind) {
        PartitionOptions o = MakePartition(rank, num_workers, kind, seed);
        ThrowIfError(worker::ValidatePartition(n, o));
        if (epoch < 0) Raise(Status::InvalidArgument("epoch must be >= 0"));
        std::vector<int64_t> order = worker::PartitionIndices(n, o);
        worker::ShuffleForEpoch(seed, rank, epoch, &order);
        order.resize(
            static_cast<size_t>(worker::PartitionSize(n, num_workers)));
        const py::ssize_t size = static_cast<py::ssize_t>(order.size());
        return Adopt(std::move(order), {size});
      },
      py::arg("num_examples"), py::arg("rank"), py::arg("num_workers"),
      py::arg("seed"), py::arg("epoch"), py::arg("kind") = "strided",
      R"doc(The example indices worker `rank` trains on in `epoch`, in order
(its partition shuffled for the epoch, cut to floor(N / W)): exactly the order
of ps_worker's batches.)doc");
}

}  // namespace asyncps::python
