// asyncps.Client.upload and Client.lr: fine-tuning from a worker's values
// (worker/upload.h) and the learning rate carried by pushes and clocks.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <vector>

#include "worker/python/src/arrays.h"
#include "worker/python/src/errors.h"
#include "worker/python/src/py_client.h"
#include "worker/upload.h"

namespace py = pybind11;

namespace asyncps::python {

void AddAssignMethods(py::class_<PyClient, std::shared_ptr<PyClient>>& c) {
  c.def(
       "upload",
       [](PyClient& self, const py::sequence& arrays, bool overwrite,
          uint64_t max_request_bytes, double timeout_s) {
         if (!self.registered()) {
           Raise(Status::FailedPrecondition(
               "upload before register(): register the model first"));
         }
         std::vector<float*> ptrs =
             CheckedBuffers(arrays, self.specs(), false, "upload");
         std::vector<const float*> values(ptrs.begin(), ptrs.end());
         worker::UploadOptions o;
         o.overwrite = overwrite;
         o.max_request_bytes = max_request_bytes;
         o.timeout = std::chrono::milliseconds(
             static_cast<int64_t>(timeout_s * 1000.0));
         bool uploaded = false;
         ThrowIfError(self.Run([&] {
           return worker::UploadValues(self.get(), values, o, &uploaded);
         }));
         return uploaded;
       },
       py::arg("values"), py::arg("overwrite") = false,
       py::arg("max_request_bytes") = uint64_t{16} << 20,
       py::arg("timeout_s") = 600.0,
       "Makes `values` (float32 arrays, one per registered tensor) the "
       "shards' weights, unless another worker's upload wins the race or "
       "the shards' values are final (trained or uploaded) and not "
       "`overwrite`: then waits until that upload is complete. Returns True "
       "when these values were written (worker/upload.h). Resets the "
       "shards' optimizer state.")
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
