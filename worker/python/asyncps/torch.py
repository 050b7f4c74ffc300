"""PyTorch on the asyncps parameter server.

    import torch, asyncps.torch as apt
    model = Net()
    ps = apt.ParameterServer(model, codec="topk:ratio=0.01,ef=1")   # servers, rank: from psrun
    opt = apt.DistributedOptimizer(ps)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()              # push the gradients + clock, pull fresh weights
    ps.close()

What lives where
  - Parameters (requires_grad=True, float32) are the shards' tensors, named
    as in model.named_parameters(). Worker 0, or whoever comes first,
    registers them (idempotent; another model on the same shards is
    asyncps.AlreadyExists naming the tensor). Their initial values are
    drawn by the shards with PyTorch's default distribution for the layer
    (Linear/Conv: U(+-1/sqrt(fan_in)); norm layers: weight 1, bias 0;
    Embedding: N(0, 1); RNN: U(+-1/sqrt(hidden_size))), so every worker
    starts from the same weights; pass init={name: (kind, param)} to choose
    another (kinds of asyncps.TensorSpec). The constructor pulls them into
    the model. init="model" (fine-tuning) uploads the worker's current
    values instead: exactly one worker's upload wins (the first to claim
    shard 0), the others wait until it is complete and pull it; shards that
    were already trained keep their weights (worker/upload.h).
  - The update rule runs on the shards (ps_server --optimizer, --lr,
    --momentum, --lr_decay_updates, ...): the worker only computes
    gradients. DistributedOptimizer is a torch.optim.Optimizer whose step()
    pushes and pulls; it has no learning rate of its own.
  - Buffers (BatchNorm running_mean / running_var / num_batches_tracked) are
    not parameters and stay local to each worker, as with DDP without
    broadcast_buffers and with Horovod: in train mode BatchNorm normalises
    with batch statistics, and every forward pass updates this worker's
    running averages with the freshly pulled weights, so a worker that
    evaluates (eval mode) uses statistics of the shared model over its own
    recent batches. To evaluate with statistics over more data, run
    torch.optim.swa_utils.update_bn(loader, model) after a pull.
  - Parameters with requires_grad=False are not managed (every worker must
    build them identically).
  - SparseEmbedding modules are embeddings whose rows live in a sparse
    table on the shards (uint64 ids, tables larger than memory: RocksDB
    behind a row cache): ParameterServer registers their tables with the
    model; forward() pulls the rows of the batch's unique ids, push() sends
    their gradients (repeats summed); the table's own optimizer (sgd,
    adagrad, adam) applies them on the shards.

Steps follow the C++ worker: pull(c) -> forward/backward -> push(c) ->
clock(c + 1); ParameterServer.clock is c. Gradients of parameters that got
none (unused in this step) are sent as zeros.

Checks, each raising an asyncps exception that names the parameter and
changing nothing on the shards: parameters that are not float32, not
contiguous or on an unsupported device (a CUDA tensor with a CPU-only build
or a CPU-only torch), and a model whose parameters changed (added, removed,
replaced or reshaped) after registration (asyncps.FailedPrecondition).

GPU: with asyncps built with CUDA and a CUDA torch, CUDA parameters are
pulled into pinned host buffers and copied to the device; gradients are
compressed on the device (Store.push_device, worker/ps_store.h PushDevice)
when a codec is set, else copied to the host and pushed.
"""
import json
import math
import time
import warnings

import numpy as np

from ._torch_required import torch
from . import _asyncps
from . import torch_update as _update
from .env import worker_env
from .errors import FailedPrecondition, InvalidArgument

_NORM = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)
_FAN_IN = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.modules.conv._ConvNd)
_RNN = (torch.nn.RNNBase, torch.nn.RNNCellBase)


def _fan_in(shape):
    if len(shape) < 2:
        return shape[0] if shape else 1
    return shape[1] * int(np.prod(shape[2:], dtype=np.int64))


def default_init(module, short_name, param):
    """The shards' initialiser (kind, param) reproducing PyTorch's default
    initialisation of `param` (attribute `short_name` of `module`), or None
    when it is not known."""
    shape = tuple(param.shape)
    if isinstance(module, _NORM):
        return ("constant", 1.0) if short_name == "weight" else ("zeros", 0.0)
    if isinstance(module, torch.nn.Embedding):
        return ("normal", 1.0)
    if isinstance(module, _RNN):
        return ("uniform", 1.0 / math.sqrt(module.hidden_size))
    if isinstance(module, _FAN_IN):
        weight = getattr(module, "weight", None)
        fan = _fan_in(tuple(weight.shape)) if weight is not None else _fan_in(shape)
        return ("uniform", 1.0 / math.sqrt(fan)) if fan > 0 else ("zeros", 0.0)
    return None


def tensor_specs(model, seed=1, init=None):
    """(names, params, TensorSpecs) of the model's trainable parameters, in
    named_parameters() order."""
    init = init or {}
    owner = {}
    for mod_name, mod in model.named_modules():
        for short, p in mod.named_parameters(recurse=False):
            owner[id(p)] = (mod, short)
    names, params, specs, guessed = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        _check_param(name, p)
        if name in init:
            kind, arg = init[name]
        else:
            mod, short = owner[id(p)]
            got = default_init(mod, short, p)
            if got is None:
                guessed.append(name)
                got = ("uniform", 1.0 / math.sqrt(_fan_in(tuple(p.shape)))) if p.dim() >= 2 \
                    else ("zeros", 0.0)
            kind, arg = got
        names.append(name)
        params.append(p)
        specs.append(_asyncps.TensorSpec(name, list(p.shape), kind, float(arg), seed))
    if not params:
        raise InvalidArgument("the model has no trainable parameters")
    unknown = [n for n in init if n not in names]
    if unknown:
        raise InvalidArgument("init names unknown parameters: %s" % ", ".join(unknown))
    if guessed:
        warnings.warn("asyncps: no known PyTorch default initialiser for %s: using "
                      "U(+-1/sqrt(fan_in)) for matrices and zeros for vectors (pass init=)"
                      % ", ".join(guessed))
    return names, params, specs


def _check_param(name, p):
    if p.dtype != torch.float32:
        raise InvalidArgument("parameter '%s' is %s; asyncps trains float32 parameters "
                              "(model.float())" % (name, p.dtype))
    if p.device.type == "cuda":
        if not _asyncps.built_with_cuda:
            raise InvalidArgument("parameter '%s' is on %s, but this asyncps build has no CUDA "
                                  "support (built without the CUDA toolkit): keep the model on "
                                  "the CPU" % (name, p.device))
        if not torch.cuda.is_available():
            raise InvalidArgument("parameter '%s' is on %s, but this torch has no CUDA"
                                  % (name, p.device))
    elif p.device.type != "cpu":
        raise InvalidArgument("parameter '%s' is on %s: asyncps takes CPU (or CUDA) tensors"
                              % (name, p.device))
    if not p.is_contiguous():
        raise InvalidArgument("parameter '%s' is not contiguous" % name)


def _host_view(t):
    """The numpy array sharing a CPU tensor's memory."""
    return t.detach().numpy()


class ParameterServer:
    """The model's parameters on the asyncps shards.

    servers, rank, num_workers: default from the environment psrun sets
    (asyncps.env). codec / pull_codec: as ps_worker --codec / --pull_codec.
    prefetch_ahead: pull step c+1's weights during step c's compute (ASP, or
    SSP with s >= 1). steps_per_epoch drives the codec's sparsity warm-up.
    timeout_s bounds every wait (a shard restart must finish within it);
    heartbeat_s keeps this worker in the shards' clock minimum. CURVE keys
    default from ASYNCPS_CURVE_* (file paths or Z85 text). overlap=True:
    gradients are pushed in buckets of bucket_mb MiB (each step's first one
    closes at first_bucket_mb, as DDP's) while backward runs and
    the next forward waits for the pull on first use (asyncps.overlap);
    pipeline_shards (overlap=True, per-shard clocks): shards clocked whose
    pushes may share the link before the next push waits for them (0: no
    limit; the number of hosts the shards run on is a good value).
    placement: which shard holds each chunk (common/layout.h). "balanced"
    (default): largest chunks first to the least-loaded shard, so every shard
    holds pieces of the large layers. "in_order": contiguous ranges of the
    parameters in registration order, the last layers on the last shards;
    backward finishes those shards' gradients first, so with overlap=True
    under BSP their pushes and rounds go while backward still runs (use it
    with models whose parameters are registered in forward order). Every
    worker of a job must name the same placement (the shards refuse another,
    AlreadyExists), and so must a job that resumes a checkpoint.
    send_buffer_kb: SO_SNDBUF of each shard connection, KiB (4 to 65536; 0,
    the default: the OS's, autotuned). On a link both directions of which
    are busy (a push going up while the prefetched pull comes down) a small
    one, e.g. 64, keeps the push from filling the link's queue ahead of the
    pull's acknowledgements; run the shards with the same ps_server
    --send_buffer_kb. Too small caps a connection at about the buffer per
    round trip (experiments/results/overlap/REPORT.md)."""

    def __init__(self, model, servers=None, rank=None, num_workers=None, codec="none",
                 pull_codec="", prefetch_ahead=False, seed=1, steps_per_epoch=1000,
                 timeout_s=120.0, heartbeat_s=1.0, chunk_elems=1 << 20, init=None,
                 curve_server_key=None, curve_secret_key=None, curve_public_key=None,
                 overlap=False, bucket_mb=25.0, pipeline_shards=0, placement="balanced",
                 first_bucket_mb=1.0, send_buffer_kb=0):
        env = worker_env(servers, rank, num_workers)
        self.rank = env.rank
        self.num_workers = env.num_workers
        self.servers = env.servers
        self.model = model
        upload = isinstance(init, str) and init == "model"
        if isinstance(init, str) and not upload:
            raise InvalidArgument("init must be a dict of initialisers or \"model\", got %r"
                                  % init)
        self.names, self.params, self.specs = tensor_specs(model, seed,
                                                           None if upload else init)
        self.embeddings = [m for m in model.modules() if isinstance(m, SparseEmbedding)]
        self.embedding_names = [n for n, m in model.named_modules()
                                if isinstance(m, SparseEmbedding)]
        self._shapes = [tuple(p.shape) for p in self.params]
        self._structure = _structure(model)
        self._on_cuda = any(p.device.type == "cuda" for p in self.params)
        self.client = _asyncps.Client(
            env.servers, rank=env.rank, timeout_s=timeout_s, heartbeat_s=heartbeat_s,
            curve_server_key=env.curve_server_key if curve_server_key is None else curve_server_key,
            curve_secret_key=env.curve_secret_key if curve_secret_key is None else curve_secret_key,
            curve_public_key=env.curve_public_key if curve_public_key is None else curve_public_key,
            etcd=env.etcd, etcd_prefix=env.etcd_prefix, send_buffer_kb=send_buffer_kb,
            **env.etcd_security())
        if self.embeddings:
            # Under BSP a shard counts one push per worker and round: rows
            # and chunks travel in two pushes here, so BSP would drop one,
            # unless the shards apply rows on arrival (hybrid: BSP dense,
            # ASP sparse, ps_server --sparse_consistency=asp).
            for text in self.client.stats():
                st = json.loads(text)
                if st.get("consistency") == "bsp" and not st.get("sparse_async"):
                    raise FailedPrecondition(
                        "SparseEmbedding needs ps_server --consistency=ssp or asp, or bsp with "
                        "--sparse_consistency=asp (hybrid: dense BSP, sparse ASP; under plain "
                        "bsp the shards count one push per worker and round; ps_ctr_worker "
                        "sends rows and chunks in one push)")
            self.client.register(self.specs, chunk_elems=chunk_elems,
                                 tables=[e.spec for e in self.embeddings], placement=placement)
            for i, e in enumerate(self.embeddings):
                e._attach(self, i)
        self.store = _asyncps.Store(
            self.client, self.specs, push_codec=codec, pull_codec=pull_codec, seed=seed,
            steps_per_epoch=steps_per_epoch, timeout_s=timeout_s, chunk_elems=chunk_elems,
            prefetch_ahead=prefetch_ahead, placement=placement,
            # overlap=True pushes host copies bucket by bucket: compressed on the host.
            device_compression=self._on_cuda and _parse_codec(codec) != "none" and not overlap)
        if self._on_cuda:
            self._host = [torch.empty(s, dtype=torch.float32).pin_memory() for s in self._shapes]
            self._pull_bufs = [_host_view(h) for h in self._host]
        else:
            self._host = None
            self._pull_bufs = [_host_view(p) for p in self.params]
        self._ptrs = [p.data_ptr() for p in self.params]
        self._grads = [None] * len(self.params)  # CPU: (grad tensor, its view, data_ptr)
        self._grad_host = None  # CUDA: pinned host copies of the gradients
        self._zeros = {}
        self.clock = 0
        self._overlap = None
        rows = [(i, np.arange(len(e.rows), dtype=np.uint64), e.rows.numpy())
                for i, e in enumerate(self.embeddings) if e.rows is not None]
        if rows and not upload:
            raise InvalidArgument("SparseEmbedding rows= are uploaded with init=\"model\"")
        self.uploaded = upload and self.client.upload(
            [p.detach().to("cpu").contiguous().numpy() for p in self.params], rows=rows)
        self.pull()
        if overlap:
            from .overlap import OverlapScheduler
            self._overlap = OverlapScheduler(self, bucket_mb, pipeline_shards=pipeline_shards,
                                             first_bucket_mb=first_bucket_mb)

    # ---- the step ----------------------------------------------------------
    def pull(self):
        """Writes the shards' weights for this worker's clock into the model
        (blocking as the consistency mode requires)."""
        if self._overlap is not None and self._overlap.finish_pull():
            return  # the layered pull of asyncps.overlap, now complete
        self._check_model(structure=False)  # push() checked it (step: push then pull)
        with torch.no_grad():
            self.store.pull(self.clock, self._pull_bufs)
            if self._host is not None:
                for p, h in zip(self.params, self._host):
                    p.copy_(h, non_blocking=False)

    def push(self):
        """Pushes the gradients of the weights pulled at `clock`, then
        announces clock + 1 (and advances `clock`)."""
        self._check_model()
        for e in self.embeddings:
            e._push(self.clock)
        if self._overlap is not None:
            self._overlap.push_rest()  # most buckets went during backward
        elif self._on_cuda and self.store.accepts_device_gradients:
            torch.cuda.synchronize()
            self.store.push_device(self.clock, [self._grad_tensor(i).data_ptr()
                                                for i in range(len(self.params))])
        else:
            self.store.push(self.clock, [self._grad_array(i) for i in range(len(self.params))])
        if self._overlap is not None:
            self._overlap.clock(self.clock + 1)  # and the pull, layer by layer
        else:
            self.store.clock(self.clock + 1)
        self.clock += 1

    def step(self):
        """push() then pull(): the weights for the next step are in the model
        (overlap=True: by the next forward pass, which waits for them)."""
        self.push()
        if self._overlap is not None:
            self._overlap.pull_pending = True
        else:
            self.pull()

    # ---- saving (asyncps.torch_update) --------------------------------------
    def state_dict(self):
        """The model's state_dict with the shards' weights (PyTorch format:
        torch.save of it loads into a plain model). Each SparseEmbedding
        with num_embeddings (or rows=) adds '<module path>.weight': the
        shards' rows of ids 0..num_embeddings-1, (num_embeddings, dim), as
        an nn.Embedding of that size at that path holds them."""
        return _update.pulled_state_dict(self)

    def optimizer_state_dict(self):
        """The shards' optimizer state: {"optimizer": ps_server --optimizer,
        "step": the most steps of any chunk, "state": {parameter name: {slot:
        tensor, "step": its most steps (float tensor, as torch.optim's),
        "chunk_steps": int64 tensor of the steps of each of its chunks}}}
        with torch.optim's slot names (adam: exp_avg, exp_avg_sq;
        momentum/nesterov: momentum_buffer; adagrad: sum; sgd: none, and no
        steps). With SparseEmbeddings, "tables": {'<module path>.weight':
        {"optimizer": the table's row optimizer, its slots as (N, dim)
        tensors of the rows of ids 0..num_embeddings-1 (adagrad: sum; adam:
        exp_avg, exp_avg_sq; sgd: none), "step": the most steps of a row
        (float tensor), "row_steps": int64 (N,) each row's steps}}, and for
        every SparseEmbedding "saved": every entry of its table (any uint64
        id; ids, weight, slots, row_steps, admission counts, last-push
        clocks, the saver's clock: asyncps.torch_update). load_optimizer_
        state_dict() writes it back (with "saved": the table then holds
        exactly those entries)."""
        return _update.shard_optimizer_state(self)

    def load_optimizer_state_dict(self, optimizer_state):
        """Writes `optimizer_state` (an optimizer_state_dict(), e.g. through
        torch.save/torch.load) into the shards: every parameter's slots and
        steps (per chunk from "chunk_steps", else its "step" for all of its
        chunks), uploaded with the model's current parameters as their
        values (after a pull: the shards' own). Checked before anything is
        written: asyncps.InvalidArgument naming the parameter for state of
        another optimizer than the shards' --optimizer, missing or unknown
        parameters, shapes, NaN/Inf, negative steps. Plain SGD keeps no
        state: nothing is written. Its "tables" entries (checked the same
        way, against each table's row optimizer) become the rows' state
        and steps, uploaded with the shards' current rows as values; the
        shards check every request whole again (another optimizer's state,
        NaN, negative sums of squares, steps > 2^53) before writing any row
        of it. A "tables" entry with "saved" (every save made by
        optimizer_state_dict()) restores its table exactly: every shard
        drops all the table's entries first, so ids that are not in the
        save (rows trained or admitted after it, or on another fleet) are
        gone and read as the table's initialiser gives them; the saved ids
        get their rows, state, steps, admission counts and clocks back
        bitwise. To keep other ids instead, delete "saved" from the entry
        (only the rows of ids 0..N-1 are then set)."""
        _update.load_shard_optimizer_state(self, optimizer_state)

    def load_state_dict(self, state_dict, strict=True, optimizer_state=None):
        """Loads `state_dict` into the model and uploads its parameters to
        the shards (overwriting them), and each SparseEmbedding's
        '<module path>.weight' (N, dim) as the rows of ids 0..N-1 (N must
        be its num_embeddings; without one it becomes N; other ids keep
        their rows). Their optimizer state (the rows': AdaGrad sums, Adam
        moments and steps) restarts from zero, unless `optimizer_state` (an
        optimizer_state_dict()) is given: then it is written in the same
        upload, as load_optimizer_state_dict would (resuming a checkpoint
        where it stopped; a table with "saved" then equals its save, ids
        not in it gone). Rows of the wrong shape,
        NaN/Inf, or (strict) a missing one: asyncps.InvalidArgument before
        anything is written."""
        return _update.load_and_upload(self, state_dict, strict, optimizer_state)

    # ---- counters and lifetime ---------------------------------------------
    def traffic(self):
        """Cumulative counters (bytes pushed raw / on the wire, bytes pulled,
        pull_wait_ns, encode_ns, pull_copy_ns, push_ns, push_copy_ns, clock_ns,
        last_staleness, resends)."""
        return self.store.traffic()

    def tensor_bytes(self):
        return self.store.tensor_bytes()

    def flush(self):
        self.store.flush()

    def close(self):
        """Waits for outstanding acknowledgements and releases the store."""
        if self._overlap is not None:
            self._overlap.close()
        if not self.store.closed:
            self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- helpers -----------------------------------------------------------
    def _check_model(self, structure=True):
        if structure and _structure(self.model, self._structure) is not self._structure:
            self._structure_changed()
        self._check_tensors()

    def _structure_changed(self):
        current = [p for p in self.model.parameters() if p.requires_grad]
        if len(current) != len(self.params) or any(
                a is not b for a, b in zip(current, self.params)):
            now = {n for n, p in self.model.named_parameters() if p.requires_grad}
            was = set(self.names)
            what = sorted(now ^ was) or [n for n, p, q in zip(
                self.names, self.params, current) if p is not q]
            raise FailedPrecondition(
                "the model's parameters changed after registration (%s): build a new "
                "ParameterServer for a new model" % ", ".join(what[:5]))
        self._structure = _structure(self.model)  # same parameters, rebuilt containers

    def _check_tensors(self):
        for i, p in enumerate(self.params):
            if tuple(p.shape) != self._shapes[i] or p.dtype != torch.float32:
                raise FailedPrecondition(
                    "parameter '%s' is now %s %s, registered as %s float32" % (
                        self.names[i], tuple(p.shape), p.dtype, self._shapes[i]))
            ptr = p.data_ptr()
            if ptr != self._ptrs[i]:  # p.data was replaced by a tensor of the same shape
                _check_param(self.names[i], p)
                self._ptrs[i] = ptr
                if self._host is None:
                    self._pull_bufs[i] = _host_view(p)

    def _grad_tensor(self, i):
        g = self.params[i].grad
        if g is None:
            z = self._zeros.get(i)
            if z is None:
                z = self._zeros[i] = torch.zeros_like(self.params[i])
            return z
        if g.layout != torch.strided:
            raise InvalidArgument("parameter '%s' has a sparse gradient (use dense gradients)"
                                  % self.names[i])
        return g

    def _grad_array(self, i):
        """Parameter i's gradient as a float32 numpy array: a view of a CPU
        gradient, or a CUDA gradient copied (now, every call) into a pinned
        host buffer of its own (not the pull buffer: a pull between two
        pushes would otherwise be pushed as the next gradient)."""
        g = self._grad_tensor(i)
        if g.device.type == "cuda":
            if self._grad_host is None:
                self._grad_host = [None] * len(self.params)
            h = self._grad_host[i]
            if h is None:
                h = self._grad_host[i] = torch.empty(
                    self._shapes[i], dtype=torch.float32).pin_memory()
            h.copy_(g)  # synchronous: the host copy is complete when it returns
            return _host_view(h)
        cached = self._grads[i]
        if cached is not None and cached[0] is g and cached[2] == g.data_ptr():
            return cached[1]  # the view shares g's memory: this step's values
        arr = _host_view(g)
        self._grads[i] = (g, arr, g.data_ptr())
        return arr


def _structure(model, known=None):
    """The model's module tree and parameter slots as records (kind, module,
    key, object): ('n', module, None, sizes of its containers), ('m', module,
    name, submodule), ('p', module, name, parameter). With `known` (an earlier result),
    returns `known` itself when nothing changed, checking in one pass of
    dict lookups (far cheaper than named_parameters() every step)."""
    if known is not None:
        for kind, owner, key, obj in known:
            if kind == "n":
                if (len(owner._modules), len(owner._parameters)) != obj:
                    return None
            elif (owner._modules if kind == "m" else owner._parameters).get(key) is not obj:
                return None
        return known
    out = []
    for mod in model.modules():
        out.append(("n", mod, None, (len(mod._modules), len(mod._parameters))))
        out += [("m", mod, key, child) for key, child in mod._modules.items()]
        out += [("p", mod, key, p) for key, p in mod._parameters.items()]
    return out


class SparseEmbedding(torch.nn.Module):
    """An embedding lookup whose rows live in a sparse table on the shards:
    ids are any int64 (read as uint64 keys), the table may be far larger
    than memory, a row never pushed is its initial value. Used inside a
    model given to ParameterServer, which registers the table and attaches
    it; forward(ids) returns (*ids.shape, dim) float32 rows that require
    grad, and ParameterServer.push() sends their gradients (one push of the
    unique ids of the step's forward passes) at its clock. The table's
    optimizer runs on the shards: sgd, adagrad or adam with its own lr
    (asyncps.TableSpec). Needs ps_server --consistency=ssp or asp, or bsp with
    --sparse_consistency=asp (hybrid: dense BSP, rows applied on arrival)."""

    def __init__(self, name, dim, init="normal", param=1.0, seed=1, optimizer="adagrad",
                 lr=0.01, rows=None, num_embeddings=None, **table_options):
        super().__init__()
        self.spec = _asyncps.TableSpec(name, dim, init, param, seed, optimizer, lr,
                                       **table_options)
        # rows: a (N, dim) tensor of initial rows for ids 0..N-1, uploaded
        # with ParameterServer(init="model") (other ids keep `init`).
        self.rows = None
        if rows is not None:
            rows = torch.as_tensor(rows).detach().to("cpu", torch.float32).contiguous()
            if rows.dim() != 2 or rows.shape[1] != dim:
                raise InvalidArgument("SparseEmbedding '%s': rows must be (N, %d), got %s"
                                      % (name, dim, tuple(rows.shape)))
            self.rows = rows
        # num_embeddings: the ids 0..num_embeddings-1 that ps.state_dict()
        # saves as '<module path>.weight' (default: len(rows); None: none).
        if num_embeddings is None and rows is not None:
            num_embeddings = len(rows)
        if num_embeddings is not None:
            num_embeddings = int(num_embeddings)
            if num_embeddings < 1 or (rows is not None and len(rows) > num_embeddings):
                raise InvalidArgument("SparseEmbedding '%s': num_embeddings must be >= 1 and "
                                      ">= len(rows), got %d" % (name, num_embeddings))
        self.num_embeddings = num_embeddings
        self._ps = None
        self._index = None
        self._pending = []  # (keys, rows) of this step's forward passes

    def _attach(self, ps, index):
        self._ps, self._index = ps, index

    def forward(self, ids):
        if self._ps is None:
            raise FailedPrecondition(
                "SparseEmbedding '%s' is not attached: give the model to "
                "asyncps.torch.ParameterServer first" % self.spec.name)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise InvalidArgument("SparseEmbedding '%s': ids must be integers, not %s"
                                  % (self.spec.name, ids.dtype))
        flat = ids.detach().reshape(-1).to("cpu", torch.int64).numpy().view(np.uint64)
        keys, inverse = np.unique(flat, return_inverse=True)
        rows = torch.from_numpy(self._ps.client.pull_rows(self._index, keys, self._ps.clock))
        rows = rows.to(ids.device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((keys, rows))
        out = rows[torch.from_numpy(inverse.reshape(-1)).to(ids.device)]
        return out.reshape(*ids.shape, self.spec.dim)

    def _push(self, clock):
        """One push of this step's row gradients (every forward pass's unique
        ids; an id in several passes is summed by the client)."""
        pending, self._pending = self._pending, []
        keys = [k for k, rows in pending if rows.grad is not None]
        if not keys:
            return
        grads = [rows.grad.detach().to("cpu", torch.float32).reshape(len(k), -1).numpy()
                 for k, rows in pending if rows.grad is not None]
        self._ps.client.push_rows(self._index, np.concatenate(keys),
                                  np.ascontiguousarray(np.concatenate(grads)), clock)

    def extra_repr(self):
        return "name=%r, dim=%d, optimizer=%s, num_embeddings=%s" % (
            self.spec.name, self.spec.dim, self.spec.optimizer, self.num_embeddings)


def _parse_codec(spec):
    return _asyncps.parse_codec(spec).split(":")[0]


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer for a ParameterServer (Horovod style): step()
    pushes this worker's gradients (then clock + 1) and pulls fresh weights
    into the model; the update itself runs on the shards. zero_grad() works
    as usual. Without lr the rate is ps_server's; with lr, param_groups[0]
    ['lr'] (which torch.optim.lr_scheduler schedules set) travels with every
    push and clock and the shards apply it (up to ps_server --max_lr). A
    torch.optim optimizer on the worker instead: WorkerOptimizer."""

    def __init__(self, ps, lr=None):
        if not isinstance(ps, ParameterServer):
            raise InvalidArgument(
                "DistributedOptimizer wraps a ParameterServer (the update rule runs on the "
                "shards: ps_server --optimizer/--lr), got %s" % type(ps).__name__)
        if lr is not None and not lr > 0:
            raise InvalidArgument("lr must be > 0 (None: ps_server's --lr)")
        super().__init__(ps.params, {} if lr is None else {"lr": float(lr)})
        self.ps = ps
        self._carry_lr = lr is not None

    def zero_grad(self, set_to_none=True):
        # Set before backward: with overlap=True buckets are pushed during it.
        if self._carry_lr:
            self.ps.client.lr = float(self.param_groups[0]["lr"])
        super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._carry_lr:
            self.ps.client.lr = float(self.param_groups[0]["lr"])
        self.ps.step()
        return loss


def evaluate(model, images, labels, batch=1000):
    """Test accuracy and mean loss of `model` (eval mode, no grad) on numpy
    arrays; returns (accuracy, loss, seconds)."""
    t0 = time.perf_counter()
    was = model.training
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            x = torch.from_numpy(images[i:i + batch])
            y = torch.from_numpy(labels[i:i + batch])
            out = model(x)
            loss += torch.nn.functional.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    model.train(was)
    return correct / len(labels), loss / len(labels), time.perf_counter() - t0


WorkerOptimizer = _update.WorkerOptimizer
