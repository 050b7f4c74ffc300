// asyncps.Client and asyncps.Store: worker::Client and
// worker::PsParameterStore for Python.
//
// Every call that may wait (register, pull, push, clock, flush, admin
// requests) releases the GIL, takes the client's mutex (a Client serves one
// thread at a time; Python threads may share it) and stays interruptible
// through the Interrupter hook (see errors.h). Compression runs inside
// Push, so it too runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>

#include "common/etcd_security.h"
#include "common/transport.h"
#include "worker/client.h"
#include "worker/ps_store.h"
#include "worker/python/src/arrays.h"
#include "worker/python/src/bindings.h"
#include "worker/python/src/errors.h"
#include "worker/python/src/py_client.h"

namespace py = pybind11;

namespace asyncps::python {

namespace {

using worker::Client;
using worker::ClientOptions;
using worker::PsParameterStore;
using worker::PsStoreOptions;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// The layout options a registration names (the shard count is the client's);
// ValueError for an unknown placement.
LayoutOptions LayoutFor(size_t chunk_elems, size_t min_chunk_elems,
                        const std::string& placement) {
  LayoutOptions lo;
  lo.chunk_elems = chunk_elems;
  lo.min_chunk_elems = min_chunk_elems;
  StatusOr<Placement> p = ParsePlacement(placement);
  if (!p.ok()) Raise(p.status());
  lo.placement = *p;
  return lo;
}

class PyStore {
 public:
  PyStore(std::shared_ptr<PyClient> client, std::vector<TensorSpec> specs,
          PsStoreOptions o)
      : client_(std::move(client)), specs_(std::move(specs)) {
    if (o.register_model) {
      client_->Register(specs_, o.layout, client_->tables());
      o.register_model = false;  // done, under Python's view of the client
    } else if (!client_->registered()) {
      Raise(Status::FailedPrecondition(
          "the model is not registered on this client: call "
          "Client.register() first or create the Store with register=True"));
    } else if (client_->specs() != specs_) {
      Raise(Status::InvalidArgument(
          "the store's tensors differ from those the client registered"));
    }
    ThrowIfError(client_->Run([&]() -> Status {
      ASSIGN_OR_RETURN(store_,
                       PsParameterStore::Create(client_->get(), specs_, o));
      return Status::OK();
    }));
  }

  ~PyStore() {
    if (!store_) return;
    // Flushes outstanding acknowledgements (PsParameterStore's destructor),
    // under the client's lock and without the GIL.
    client_->RunQuietly([&] {
      store_.reset();
      return Status::OK();
    });
  }

  void Pull(int64_t clock, const py::sequence& arrays) {
    std::vector<float*> ptrs = CheckedBuffers(arrays, specs_, true, "pull");
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.Pull(clock, ptrs)
            .WithContext("pull at clock " + std::to_string(clock));
      });
    }));
  }

  void Push(int64_t clock, const py::sequence& arrays) {
    std::vector<float*> ptrs = CheckedBuffers(arrays, specs_, false, "push");
    std::vector<const float*> cptrs(ptrs.begin(), ptrs.end());
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.Push(clock, cptrs)
            .WithContext("push at clock " + std::to_string(clock));
      });
    }));
  }

  void PushChunks(int64_t clock, const std::vector<uint32_t>& chunk_ids,
                  const py::sequence& arrays) {
    std::vector<float*> ptrs = CheckedBuffers(arrays, specs_, false, "push");
    std::vector<const float*> cptrs(ptrs.begin(), ptrs.end());
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.PushSubset(clock, chunk_ids, cptrs)
            .WithContext("push of " + std::to_string(chunk_ids.size()) +
                         " chunks at clock " + std::to_string(clock));
      });
    }));
  }

  void ClockAndPullGroups(int64_t new_clock,
                          const std::vector<std::vector<uint32_t>>& groups) {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.ClockAndPullGroups(new_clock, groups)
            .WithContext("clock " + std::to_string(new_clock) +
                         " and pull by groups");
      });
    }));
  }

  void ClockShardsAndPullGroups(
      int64_t new_clock, const std::vector<int>& shards,
      const std::vector<std::vector<uint32_t>>& groups) {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.ClockShardsAndPullGroups(new_clock, shards, groups)
            .WithContext("clock " + std::to_string(new_clock) + " to " +
                         std::to_string(shards.size()) +
                         " shards and pull by groups");
      });
    }));
  }

  void WaitAcks() {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.WaitAcks().WithContext("acknowledgements of pushes");
      });
    }));
  }

  void StartReceipts(const std::vector<int>& shards) {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.StartReceipts(shards).WithContext(
            "receipt from " + std::to_string(shards.size()) + " shards");
      });
    }));
  }

  void WaitReceipts() {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.WaitReceipts().WithContext("receipts of pushes");
      });
    }));
  }

  void WaitPullGroup(size_t group, const py::sequence& arrays) {
    std::vector<float*> ptrs = CheckedBuffers(arrays, specs_, true, "pull");
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.WaitPullGroup(group, ptrs)
            .WithContext("pull group " + std::to_string(group));
      });
    }));
  }

  size_t PullGroupsPending() {
    return store_ ? store_->pull_groups_pending() : 0;
  }

  // Device pointers (one per tensor, num_elements floats each, complete):
  // FailedPrecondition unless the store compresses on the device.
  void PushDevice(int64_t clock, const std::vector<uintptr_t>& pointers) {
    if (pointers.size() != specs_.size()) {
      Raise(Status::InvalidArgument(
          "push_device: the model has " + std::to_string(specs_.size()) +
          " tensors, got " + std::to_string(pointers.size()) + " pointers"));
    }
    std::vector<const float*> ptrs;
    for (uintptr_t p : pointers)
      ptrs.push_back(reinterpret_cast<const float*>(p));
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.PushDevice(clock, ptrs)
            .WithContext("device push at clock " + std::to_string(clock));
      });
    }));
  }

  bool AcceptsDeviceGradients() {
    return store_ && store_->AcceptsDeviceGradients();
  }

  void Clock(int64_t new_clock) {
    ThrowIfError(client_->Run([&] {
      return WithStore([&](PsParameterStore& st) {
        return st.Clock(new_clock).WithContext("clock " +
                                               std::to_string(new_clock));
      });
    }));
  }

  void Flush() {
    ThrowIfError(client_->Run([&] {
      return WithStore([](PsParameterStore& st) { return st.Flush(); });
    }));
  }

  // Counters stay readable after Close().
  void Close() {
    if (!store_) return;
    Status s = client_->Run([&] {
      Status f = store_->Flush();
      closed_traffic_ = store_->traffic();
      closed_tensor_bytes_ = store_->tensor_bytes();
      store_.reset();
      return f;
    });
    ThrowIfError(s);
  }

  py::dict Traffic() {
    worker::TrafficStats t = store_ ? store_->traffic() : closed_traffic_;
    py::dict d;
    d["bytes_pushed_raw"] = t.bytes_pushed_raw;
    d["bytes_pushed_wire"] = t.bytes_pushed_wire;
    d["bytes_pulled"] = t.bytes_pulled;
    d["pull_wait_ns"] = t.pull_wait_ns;
    d["encode_ns"] = t.encode_ns;
    d["pull_copy_ns"] = t.pull_copy_ns;
    d["push_ns"] = t.push_ns;
    d["push_copy_ns"] = t.push_copy_ns;
    d["clock_ns"] = t.clock_ns;
    d["last_staleness"] = t.last_staleness;
    d["resends"] = client_->get()->resends();
    return d;
  }

  py::list TensorBytes() {
    py::list out;
    for (const auto& t :
         store_ ? store_->tensor_bytes() : closed_tensor_bytes_) {
      py::dict d;
      d["name"] = t.name;
      d["raw"] = t.raw;
      d["wire"] = t.wire;
      out.append(d);
    }
    return out;
  }

  const std::vector<TensorSpec>& specs() const { return specs_; }
  bool closed() const { return store_ == nullptr; }

 private:
  // For code running without the GIL (under the client's lock).
  template <typename F>
  Status WithStore(F&& f) {
    if (!store_) return Status::FailedPrecondition("the store is closed");
    return f(*store_);
  }

  std::shared_ptr<PyClient> client_;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<PsParameterStore> store_;
  worker::TrafficStats closed_traffic_;  // at Close()
  std::vector<PsParameterStore::TensorBytes> closed_tensor_bytes_;
};

std::shared_ptr<PyClient> MakeClient(
    std::vector<std::string> servers, int rank, double timeout_s,
    double attempt_timeout_s, double max_backoff_s, double heartbeat_s,
    const std::string& curve_server_key, const std::string& curve_secret_key,
    const std::string& curve_public_key, size_t max_in_flight,
    double interrupt_poll_s, size_t shared_memory_mb,
    std::vector<std::string> etcd, const std::string& etcd_prefix,
    int64_t send_buffer_kb, const std::string& etcd_ca_file,
    const std::string& etcd_cert_file, const std::string& etcd_key_file,
    const std::string& etcd_user, const std::string& etcd_password_file) {
  ClientOptions o;
  o.etcd_security.ca_file = etcd_ca_file;
  o.etcd_security.cert_file = etcd_cert_file;
  o.etcd_security.key_file = etcd_key_file;
  o.etcd_security.user = etcd_user;
  if (etcd_user.empty() != etcd_password_file.empty()) {
    Raise(Status::InvalidArgument(
        "etcd_user and etcd_password_file go together"));
  }
  if (!etcd_password_file.empty()) {
    ThrowIfError(
        LoadEtcdPassword(etcd_password_file, &o.etcd_security.password));
  }
  ThrowIfError(CheckSendBufferKb(send_buffer_kb, "send_buffer_kb"));
  o.transport.send_buffer_bytes = static_cast<int>(send_buffer_kb * 1024);
  o.etcd_endpoints = std::move(etcd);
  o.etcd_prefix = etcd_prefix;
  if (shared_memory_mb > (size_t{1} << 20)) {
    Raise(Status::InvalidArgument("shared_memory_mb must be in [0, 2^20]"));
  }
  o.shared_memory_bytes = shared_memory_mb << 20;
  o.servers = std::move(servers);
  o.rank = rank;
  if (timeout_s <= 0 || attempt_timeout_s <= 0 || max_backoff_s <= 0 ||
      heartbeat_s < 0 || interrupt_poll_s <= 0) {
    Raise(Status::InvalidArgument(
        "timeouts and intervals must be > 0 (heartbeat_s >= 0)"));
  }
  o.deadline = Millis(timeout_s);
  o.attempt_timeout = Millis(attempt_timeout_s);
  o.max_backoff = Millis(max_backoff_s);
  o.heartbeat_interval = Millis(heartbeat_s);
  o.max_in_flight = max_in_flight;
  o.interrupt_poll =
      std::max(Millis(interrupt_poll_s), std::chrono::milliseconds(1));
  if (!curve_server_key.empty()) {
    o.transport.curve_server_key = ValueOrThrow(LoadCurveKey(curve_server_key));
    if (!curve_secret_key.empty())
      o.transport.curve_secret_key =
          ValueOrThrow(LoadCurveKey(curve_secret_key));
    if (!curve_public_key.empty())
      o.transport.curve_public_key =
          ValueOrThrow(LoadCurveKey(curve_public_key));
  } else if (!curve_secret_key.empty() || !curve_public_key.empty()) {
    Raise(Status::InvalidArgument(
        "CURVE keys need curve_server_key (the shards' public key)"));
  }
  return std::make_shared<PyClient>(std::move(o));
}

// TensorSpec: a tensor's name, shape and initialiser.
void BindTensorSpec(py::module_& m) {
  py::class_<TensorSpec>(m, "TensorSpec", R"doc(
One named tensor of a model: its shape and the shards' initialiser.

init: zeros | constant (every element = param) | uniform (U(-param, param))
| normal (N(0, param^2)) | he_normal (N(0, 2/shape[0])) | xavier_uniform.
Initial values depend only on (seed, name, index).)doc")
      .def(py::init([](std::string name, std::vector<int64_t> shape,
                       const std::string& init, float param, uint64_t seed) {
             TensorSpec t;
             t.name = std::move(name);
             t.shape = shape.empty() ? std::vector<int64_t>{1} : shape;
             t.init = ValueOrThrow(ParseInit(init));
             t.init_param = param;
             t.seed = seed;
             return t;
           }),
           py::arg("name"), py::arg("shape"), py::arg("init") = "zeros",
           py::arg("param") = 0.0f, py::arg("seed") = 0)
      .def_readonly("name", &TensorSpec::name)
      .def_readonly("shape", &TensorSpec::shape)
      .def_property_readonly(
          "init", [](const TensorSpec& t) { return InitName(t.init); })
      .def_readonly("param", &TensorSpec::init_param)
      .def_readonly("seed", &TensorSpec::seed)
      .def_property_readonly("num_elements", &TensorSpec::num_elements)
      .def(
          "initial_values",
          [](const TensorSpec& t) {
            py::array_t<float> a(t.shape);
            InitializeTensorRange(t, 0, t.num_elements(), a.mutable_data());
            return a;
          },
          "The tensor's initial value, as the shards compute it.")
      .def("__eq__",
           [](const TensorSpec& a, const TensorSpec& b) { return a == b; })
      .def("__repr__", [](const TensorSpec& t) {
        return "TensorSpec('" + t.name + "', " + ShapeString(t.shape) + ", '" +
               InitName(t.init) + "', " + std::to_string(t.init_param) + ", " +
               std::to_string(t.seed) + ")";
      });
}

// Client: a worker's connection to every shard, with its row and assign
// methods.
void BindClientClass(py::module_& m) {
  py::class_<PyClient, std::shared_ptr<PyClient>> client(m, "Client", R"doc(
A worker's connection to every shard (worker/client.h). Thread-safe: calls
are serialised. Blocking calls release the GIL and raise KeyboardInterrupt
on Ctrl-C within interrupt_poll_s. shared_memory_mb > 0: shards on this host
write pulled weights (a ParameterStore's) into shared memory of that many MiB
(at least the model's fp32 size) instead of sending them over the socket.
etcd (client URLs) and etcd_prefix: an elastic fleet's layout is read from
etcd before registering, so a worker started after every shard in servers
left still joins (servers stays the fleet's first shards). etcd_ca_file,
etcd_cert_file, etcd_key_file: etcd over TLS (https:// URLs); etcd_user and
etcd_password_file (mode 600, the password on its first line): etcd's
authentication (psrun hands them to workers as ASYNCPS_ETCD_* variables).)doc");
  client
      .def(py::init(&MakeClient), py::arg("servers"), py::arg("rank") = -1,
           py::arg("timeout_s") = 120.0, py::arg("attempt_timeout_s") = 2.0,
           py::arg("max_backoff_s") = 4.0, py::arg("heartbeat_s") = 0.0,
           py::arg("curve_server_key") = "", py::arg("curve_secret_key") = "",
           py::arg("curve_public_key") = "", py::arg("max_in_flight") = 256,
           py::arg("interrupt_poll_s") = 0.05, py::arg("shared_memory_mb") = 0,
           py::arg("etcd") = std::vector<std::string>{},
           py::arg("etcd_prefix") = "/asyncps/default",
           py::arg("send_buffer_kb") = 0, py::arg("etcd_ca_file") = "",
           py::arg("etcd_cert_file") = "", py::arg("etcd_key_file") = "",
           py::arg("etcd_user") = "", py::arg("etcd_password_file") = "")
      .def(
          "register",
          [](PyClient& c, const std::vector<TensorSpec>& tensors,
             size_t chunk_elems, size_t min_chunk_elems,
             const std::vector<TableSpec>& tables,
             const std::string& placement) {
            c.Register(tensors,
                       LayoutFor(chunk_elems, min_chunk_elems, placement),
                       tables);
          },
          py::arg("tensors"), py::arg("chunk_elems") = size_t{1} << 20,
          py::arg("min_chunk_elems") = 4096,
          py::arg("tables") = std::vector<TableSpec>{},
          py::arg("placement") = "balanced",
          "Registers the model (tensors and sparse tables) on every shard "
          "(idempotent; AlreadyExists naming the tensor or table when a "
          "shard holds a different one). placement: 'balanced' (largest "
          "chunks first to the least-loaded shard) or 'in_order' (contiguous "
          "ranges in registration order: the last tensors on the last shard, "
          "so their pushes can leave during backward; common/layout.h).")
      .def_property_readonly("registered", &PyClient::registered)
      .def_property_readonly("num_shards",
                             [](PyClient& c) { return c.get()->num_shards(); })
      .def_property_readonly(
          "servers", [](PyClient& c) { return c.get()->options().servers; })
      .def_property_readonly(
          "rank", [](PyClient& c) { return c.get()->options().rank; })
      .def_property_readonly("resends",
                             [](PyClient& c) { return c.get()->resends(); })
      .def(
          "chunks",
          [](PyClient& c) {
            if (!c.registered())
              Raise(Status::FailedPrecondition("register() first"));
            py::list out;
            for (const ChunkSpec& s : c.get()->layout().chunks()) {
              out.append(py::make_tuple(s.id, s.tensor, s.offset, s.num_elems,
                                        s.shard));
            }
            return out;
          },
          "(id, tensor, offset, num_elems, shard) per chunk.")
      .def(
          "stats",
          [](PyClient& c, double timeout_s) {
            std::vector<std::string> replies;
            ThrowIfError(c.Run(
                [&] { return c.get()->Stats(&replies, Millis(timeout_s)); }));
            return replies;
          },
          py::arg("timeout_s") = 10.0, "One JSON text per shard.")
      .def(
          "checkpoint",
          [](PyClient& c, double timeout_s) {
            ThrowIfError(
                c.Run([&] { return c.get()->Checkpoint(Millis(timeout_s)); }));
          },
          py::arg("timeout_s") = 60.0)
      .def(
          "shutdown",
          [](PyClient& c, double timeout_s) {
            ThrowIfError(
                c.Run([&] { return c.get()->Shutdown(Millis(timeout_s)); }));
          },
          py::arg("timeout_s") = 10.0)
      .def(
          "heartbeat",
          [](PyClient& c, double timeout_s) {
            ThrowIfError(
                c.Run([&] { return c.get()->Heartbeat(Millis(timeout_s)); }));
          },
          py::arg("timeout_s") = 10.0);
  AddRowMethods(client);
  AddAssignMethods(client);
}

// Store: one worker's parameter store.
void BindStore(py::module_& m) {
  py::class_<PyStore>(m, "Store", R"doc(
The parameter-server store of one worker (worker/ps_store.h): per step c,
pull(c, bufs) -> compute -> push(c, grads) -> clock(c + 1).)doc")
      .def(py::init([](std::shared_ptr<PyClient> client,
                       std::vector<TensorSpec> tensors, std::string push_codec,
                       std::string pull_codec, uint64_t seed,
                       int64_t steps_per_epoch, double timeout_s,
                       size_t chunk_elems, size_t min_chunk_elems,
                       bool prefetch_ahead, bool register_model,
                       bool device_compression, const std::string& placement) {
             PsStoreOptions o;
             o.push_codec = std::move(push_codec);
             o.pull_codec = std::move(pull_codec);
             o.seed = seed;
             o.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
             if (timeout_s <= 0)
               Raise(Status::InvalidArgument("timeout_s must be > 0"));
             o.timeout = Millis(timeout_s);
             o.layout = LayoutFor(chunk_elems, min_chunk_elems, placement);
             o.prefetch_ahead = prefetch_ahead;
             o.register_model = register_model;
             o.device_compression = device_compression;
             return std::make_unique<PyStore>(std::move(client),
                                              std::move(tensors), o);
           }),
           py::arg("client"), py::arg("tensors"),
           py::arg("push_codec") = "none", py::arg("pull_codec") = "",
           py::arg("seed") = 1, py::arg("steps_per_epoch") = 1000,
           py::arg("timeout_s") = 120.0,
           py::arg("chunk_elems") = size_t{1} << 20,
           py::arg("min_chunk_elems") = 4096, py::arg("prefetch_ahead") = false,
           py::arg("register") = true, py::arg("device_compression") = false,
           py::arg("placement") = "balanced", py::keep_alive<1, 2>())
      .def("pull", &PyStore::Pull, py::arg("clock"), py::arg("buffers"),
           "Writes weights at least as fresh as the consistency mode requires "
           "for clock `clock` into `buffers` (float32, C-contiguous, one per "
           "tensor).")
      .def("push", &PyStore::Push, py::arg("clock"), py::arg("grads"),
           "Compresses and sends the gradients of the weights pulled at "
           "`clock`; the buffers may be reused once it returns.")
      .def("push_chunks", &PyStore::PushChunks, py::arg("clock"),
           py::arg("chunk_ids"), py::arg("grads"),
           "As push, for only the chunks `chunk_ids` (Client.chunks() ids); "
           "`grads` holds every tensor's buffer, read only for those chunks. "
           "Several calls at one clock send a step's gradient in parts; under "
           "BSP a shard counts one push per worker and round, so each shard's "
           "chunks must go in one call.")
      .def("clock_and_pull_groups", &PyStore::ClockAndPullGroups,
           py::arg("new_clock"), py::arg("groups"),
           "clock(new_clock), then the pull of new_clock's weights as one "
           "request per group of chunk ids, sent in group order (list them "
           "in the order the forward pass needs them). Raw pulls without "
           "prefetch_ahead only. Wait for every group with wait_pull_group.")
      .def("clock_shards_and_pull_groups", &PyStore::ClockShardsAndPullGroups,
           py::arg("new_clock"), py::arg("shards"), py::arg("groups"),
           "Per-shard clocks: clock_and_pull_groups for the shards `shards` "
           "only (new_clock, then their chunks of each group), as soon as the "
           "step's pushes to them were started; clock_and_pull_groups with "
           "the same groups then does the rest. A later push of the step to "
           "a shard clocked so is refused (FailedPrecondition); so are "
           "elastic fleets, pull codecs and prefetch_ahead.")
      .def("wait_acks", &PyStore::WaitAcks,
           "Waits until every push and clock started so far was acknowledged "
           "(the overlap pipeline: one shard's push on the link at a time).")
      .def("start_receipts", &PyStore::StartReceipts, py::arg("shards"),
           "Sends the shards `shards` (indices, each once) a heartbeat behind "
           "the requests started to them so far; wait_receipts waits for it. "
           "A shard handles what arrives in order, so its reply says those "
           "requests arrived (the overlap pipeline's stage wait; call it "
           "right behind a push, before the clock and pulls).")
      .def("wait_receipts", &PyStore::WaitReceipts,
           "Waits for every receipt started since the last call. Unlike "
           "wait_acks it does not wait for acknowledgements a shard holds "
           "(a replicated primary's of a push, until the round closed and "
           "its backups have it).")
      .def("wait_pull_group", &PyStore::WaitPullGroup, py::arg("group"),
           py::arg("buffers"),
           "Waits for one group of clock_and_pull_groups and writes its "
           "chunks into `buffers` (one per tensor; only those chunks); "
           "FailedPrecondition while a shard holding some was not clocked.")
      .def_property_readonly("pull_groups_pending", &PyStore::PullGroupsPending,
                             "Groups of the pull by groups not waited for.")
      .def("push_device", &PyStore::PushDevice, py::arg("clock"),
           py::arg("pointers"),
           "As push, with CUDA device pointers (compressed on the device); "
           "needs device_compression=True, a codec and a GPU.")
      .def_property_readonly("accepts_device_gradients",
                             &PyStore::AcceptsDeviceGradients)
      .def("clock", &PyStore::Clock, py::arg("new_clock"),
           "Announces that iteration new_clock - 1 is done.")
      .def("flush", &PyStore::Flush, "Waits for every request in flight.")
      .def("close", &PyStore::Close, "Flushes and releases the store.")
      .def_property_readonly("closed", &PyStore::closed)
      .def_property_readonly("tensors", &PyStore::specs)
      .def("traffic", &PyStore::Traffic,
           "Cumulative counters: bytes_pushed_raw/wire, bytes_pulled, "
           "pull_wait_ns, encode_ns, last_staleness, resends.")
      .def("tensor_bytes", &PyStore::TensorBytes,
           "Pushed bytes per tensor: [{name, raw, wire}].");
}

}  // namespace

void BindClient(py::module_& m) {
  BindTensorSpec(m);
  BindTables(m);
  BindClientClass(m);
  BindStore(m);
}

}  // namespace asyncps::python
