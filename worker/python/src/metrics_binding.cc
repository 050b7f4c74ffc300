// asyncps._asyncps.MetricsExporter: a Python worker's Prometheus endpoint.
//
// The same families as ps_worker's (worker::WorkerMetrics, plus the process
// metrics), served by metrics::MetricsServer on threads of its own: a scrape
// needs neither the GIL nor the training loop. asyncps.metrics.TrainingLog
// feeds it after every step and evaluation.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "common/metrics_http.h"
#include "worker/python/src/bindings.h"
#include "worker/python/src/errors.h"
#include "worker/worker_metrics.h"

namespace py = pybind11;

namespace asyncps::python {
namespace {

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

class PyMetrics {
 public:
  // port: 0 any free port; port_file: where the bound port is written.
  PyMetrics(int port, const std::string& bind, const std::string& port_file) {
    metrics::AddProcessMetrics(&registry_);
    worker_ = std::make_unique<worker::WorkerMetrics>(
        &registry_, [this] { return resends_; });
    metrics::MetricsServerOptions o;
    o.port = port;
    o.bind = bind;
    o.port_file = port_file;
    server_ = ValueOrThrow(metrics::MetricsServer::Start(o, &registry_));
  }

  void OnStep(double loss, int64_t samples, double compute_s,
              const py::object& traffic) {
    worker::TrafficStats t;
    if (!traffic.is_none()) {
      const py::dict d = traffic.cast<py::dict>();
      t.bytes_pushed_raw = Get<uint64_t>(d, "bytes_pushed_raw", 0);
      t.bytes_pushed_wire = Get<uint64_t>(d, "bytes_pushed_wire", 0);
      t.bytes_pulled = Get<uint64_t>(d, "bytes_pulled", 0);
      t.pull_wait_ns = Get<int64_t>(d, "pull_wait_ns", 0);
      t.encode_ns = Get<int64_t>(d, "encode_ns", 0);
      t.last_staleness = Get<int64_t>(d, "last_staleness", -1);
      resends_ = Get<uint64_t>(d, "resends", resends_);
    }
    worker_->OnStep(loss, samples, compute_s, t);
  }

  void OnEval(double accuracy, double loss) { worker_->OnEval(accuracy, loss); }
  int port() const { return server_->port(); }
  std::string endpoint() const { return server_->endpoint(); }
  std::string Render() const { return registry_.Render(); }

 private:
  // Declared first: destroyed after the server and the worker metrics.
  metrics::Registry registry_;
  uint64_t resends_ = 0;
  std::unique_ptr<worker::WorkerMetrics> worker_;
  std::unique_ptr<metrics::MetricsServer> server_;
};

}  // namespace

void BindMetrics(py::module_& m) {
  py::class_<PyMetrics>(m, "MetricsExporter",
                        "Prometheus endpoint of a Python worker (see "
                        "asyncps.metrics)")
      .def(py::init<int, const std::string&, const std::string&>(),
           py::arg("port") = 0, py::arg("bind") = "127.0.0.1",
           py::arg("port_file") = "")
      .def("on_step", &PyMetrics::OnStep, py::arg("loss"), py::arg("samples"),
           py::arg("compute_s"), py::arg("traffic") = py::none(),
           "After a step: its loss, examples, compute seconds and the "
           "store's traffic() dict (cumulative counters)")
      .def("on_eval", &PyMetrics::OnEval, py::arg("accuracy"),
           py::arg("loss") = -1.0)
      .def_property_readonly("port", &PyMetrics::port)
      .def_property_readonly("endpoint", &PyMetrics::endpoint)
      .def("render", &PyMetrics::Render,
           "The exposition text a scrape would get");
}

}  // namespace asyncps::python
