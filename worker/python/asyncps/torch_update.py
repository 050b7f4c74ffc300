"""Where the update runs, and saving: the parts of asyncps.torch for issue 22
items 2-4 (re-exported by asyncps.torch).

Server-side update (the default): the shards run ps_server --optimizer.
DistributedOptimizer(ps, lr=0.01) carries a learning rate that
torch.optim.lr_scheduler schedules drive: step() sends param_groups[0]['lr']
with the step's push and clock, and the shards apply it instead of their
--lr and schedule, up to ps_server --max_lr (a larger one is refused with
asyncps.InvalidArgument, never clamped). Schedulers that also cycle momentum
(OneCycleLR, CyclicLR) need cycle_momentum=False: the shards' momentum and
betas are flags.

Worker-side update (BytePS style): WorkerOptimizer(ps, torch.optim.Adam(...))
runs any torch.optim optimizer on the worker. The shards only sum: each
step pushes the gradient with lr 1 carried (the shards must run plain
--optimizer=sgd without weight decay; WorkerOptimizer checks their stats),
so a shard's tensor is w0 minus the gradients applied so far, and the
difference between two pulls is what arrived in between:
  - BSP: exactly the average gradient of the round, the same on every
    worker, so every worker applies the same update to the same weights and
    the models stay identical (synchronous data parallelism, like DDP).
  - ASP / SSP s: the sum of the gradients that reached the shards since this
    worker's last pull, divided by the number of workers (the average's
    scale). Staleness then means: a gradient was computed on the sender's
    local weights up to s clocks (SSP) or any number (ASP) behind the
    receiver's, and each worker's optimizer sees the gradients grouped
    differently, so the workers' weights drift apart (bounded by the same s
    under SSP); the optimizer state (Adam moments) is per worker.
Every worker must start from the same weights: the ParameterServer's first
pull gives them (the shards' initialisers or init="model"); a worker that
joins after others have pushed under ASP/SSP would start from the sum
instead, so start them together (psrun does).

Saving: ps.state_dict() is the model's state_dict (PyTorch format, plain
tensors: torch.save of it loads into a model built without asyncps) with the
parameters freshly pulled from the shards (worker-side update: the worker's
own weights, which are the model); buffers (BatchNorm statistics) are this
worker's. ps.load_state_dict(sd) loads it into the model and uploads the
parameters to the shards (overwrite: the shards' optimizer state restarts,
as after init="model", unless optimizer_state= is given). A SparseEmbedding
whose size is known (num_embeddings=, or rows=) is in it as
'<module path>.weight', the shards' rows of ids 0..num_embeddings-1 (so the
state_dict loads into a model with an nn.Embedding(num_embeddings, dim)
there, and a plain model's nn.Embedding weights load into it); rows of
other ids are neither saved nor changed by a load.
Optimizer state: WorkerOptimizer.state_dict() is the torch optimizer's;
ps.optimizer_state_dict() reads the shards' (server-side update) with
torch.optim's slot names and each parameter's steps (per chunk: "chunk_steps";
chunks of one tensor can differ after partial pushes or a restart), and
ps.load_optimizer_state_dict(d) -- or ps.load_state_dict(sd,
optimizer_state=d), in the same upload as the weights -- writes it back
(kAssign phase 4: checked by every shard before anything is written, made
final by the upload's commit). So
    torch.save({"model": ps.state_dict(), "opt": ps.optimizer_state_dict()}, f)
    ... a fresh fleet, a new ParameterServer ...
    ckpt = torch.load(f); ps.load_state_dict(ckpt["model"], optimizer_state=ckpt["opt"])
resumes training where it stopped: under BSP bitwise as an uninterrupted run
(with ps_server's constant --lr or an lr carried by DistributedOptimizer(lr=);
a ps_server lr schedule counts updates from the fresh fleet's start).
SparseEmbedding rows resume the same way (their "tables" entry holds each
row's AdaGrad sum or Adam moments and steps; read with kAssign phase 3
naming rows, written with phase 5: common/protocol.capnp); bitwise under
hybrid consistency (--consistency=bsp --sparse_consistency=asp) with one
worker, as test_sparse_resume checks. Every table is also saved whole in
"tables"[key]["saved"] (ids, rows, optimizer state, admission counts, last-push
clocks: a paged scan of the shards, kAssign phase 6, point-in-time on each
shard: its pages read a snapshot taken at its first one) and restored exactly
from it: each shard first drops every entry of the table (phase 8: rows of
ids that are not in the save -- a fleet that trained on, or saw other ids --
are gone, and read as the initialiser gives them), then sets the saved ones
(phase 7, routed by Client::ShardOfRow), so after the load the table equals
the save. An entry with "saved" is loaded from it, one without (saves made
before) as before: its rows of ids 0..N-1 set, other ids kept.
"""
import collections
import json

import numpy as np

from ._torch_required import torch
from .errors import FailedPrecondition, InvalidArgument


def pulled_state_dict(ps):
    """ps.state_dict(): see the module comment."""
    if not getattr(ps, "_worker_update", False):
        ps.pull()
    out = collections.OrderedDict()
    for k, v in ps.model.state_dict().items():
        out[k] = v.detach().clone()
    for i, e in enumerate(ps.embeddings):
        if e.num_embeddings is not None:
            out[_weight_key(ps, i)] = torch.from_numpy(_read_rows(ps, i)[0])
    return out


# ---- SparseEmbedding tables ------------------------------------------------
# Keys per request when rows are read or written (a shard takes at most
# ps_server --max_sparse_keys, 262144 by default, per request).
_ROW_BATCH = 16384


def _weight_key(ps, i):
    """The state_dict key of embedding i's rows (nn.Embedding's)."""
    name = ps.embedding_names[i]
    return name + ".weight" if name else "weight"


# The row optimizers' state slots (per row [slot 0 | slot 1 ...], dim
# floats each) under torch.optim's names.
_ROW_SLOTS = {"adagrad": ("sum",), "adam": ("exp_avg", "exp_avg_sq"), "sgd": ()}


def _read_rows(ps, i):
    """The shards' rows of ids 0..num_embeddings-1 of embedding i with their
    optimizer state: (values (N, dim), state (N, dim x k), steps (N,))."""
    e = ps.embeddings[i]
    n = e.num_embeddings
    parts = [ps.client.read_rows(i, np.arange(lo, min(n, lo + _ROW_BATCH), dtype=np.uint64))
             for lo in range(0, n, _ROW_BATCH)]
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(3))


# Entries per page of a scan of a table (Client.scan_rows).
_SCAN_PAGE = 4096


def _saved_entries(ps, i):
    """Every entry the shards hold of embedding i's table (rows and
    admission counters, any uint64 id): the "saved" dict of its "tables"
    entry (see table_optimizer_state)."""
    e = ps.embeddings[i]
    keys, kinds, counts, clocks, values, state = ps.client.scan_rows(i, _SCAN_PAGE)
    counter = kinds == 2
    out = {"ids": torch.from_numpy(keys.view(np.int64).copy()),
           "weight": torch.from_numpy(values)}
    for j, slot in enumerate(_ROW_SLOTS[e.spec.optimizer]):
        out[slot] = torch.from_numpy(
            np.ascontiguousarray(state[:, j * e.spec.dim:(j + 1) * e.spec.dim]))
    out["row_steps"] = torch.from_numpy(np.where(counter, 0, counts).astype(np.int64))
    out["counts"] = torch.from_numpy(np.where(counter, counts, 0).astype(np.int64))
    out["clocks"] = torch.from_numpy(clocks.astype(np.int64))
    out["clock"] = int(ps.clock)
    return out


def table_optimizer_state(ps):
    """The "tables" entry of ps.optimizer_state_dict(): for each
    SparseEmbedding, its '<module path>.weight' -> {"optimizer": its row
    optimizer, "saved": every entry the shards hold of the table (any
    uint64 id; TorchRec's (ids, rows, optimizer state, metadata)): {"ids":
    int64 (M,) (uint64 ids as their int64 bits), "weight" (M, dim), slots
    (M, dim) each, "row_steps" int64 (M,), "counts" int64 (M,) pushes
    counted by admission for an id without a row yet (then its weight and
    state are 0 and row_steps 0; 0 for rows), "clocks" int64 (M,) the clock
    of its last push (expiry), "clock": this worker's clock at the save (a
    load shifts "clocks" by the loader's clock minus it, so every entry
    keeps its age: a fresh fleet counts clocks from 0)}; with
    num_embeddings also, as before, slots
    (N, dim) of the rows of ids 0..N-1, "step": the most steps of a row
    (float tensor), "row_steps": int64 (N,)."""
    out = collections.OrderedDict()
    for i, e in enumerate(ps.embeddings):
        entry = {"optimizer": e.spec.optimizer, "saved": _saved_entries(ps, i)}
        out[_weight_key(ps, i)] = entry
        if e.num_embeddings is None:
            continue
        _, state, steps = _read_rows(ps, i)
        steps = torch.from_numpy(steps.astype(np.int64))
        for j, slot in enumerate(_ROW_SLOTS[e.spec.optimizer]):
            entry[slot] = torch.from_numpy(
                np.ascontiguousarray(state[:, j * e.spec.dim:(j + 1) * e.spec.dim]))
        entry["step"] = torch.tensor(float(steps.max()) if len(steps) else 0.0)
        entry["row_steps"] = steps
    return out


def _checked_saved(e, what, saved, clock):
    """The upload tuple's tail (keys, values, optimizer, state, steps,
    kinds, clocks) of a "saved" dict, checked (shapes, finite, counts,
    clocks) before anything is sent; the shards check it again."""
    if not isinstance(saved, dict):
        raise InvalidArgument("%s: 'saved' must be a dict" % what)

    def get(name, dtype, width=None):
        t = saved.get(name)
        if t is None:
            raise InvalidArgument("%s: 'saved' has no '%s'" % (what, name))
        t = torch.as_tensor(t).detach().to("cpu")
        if t.dtype != dtype:
            raise InvalidArgument("%s: saved '%s' must be %s, got %s" % (what, name, dtype,
                                                                         t.dtype))
        return t.contiguous().numpy()

    ids = get("ids", torch.int64)
    m = len(ids)
    arrays = {}
    for name in ("row_steps", "counts", "clocks"):
        arrays[name] = get(name, torch.int64)
    weight = get("weight", torch.float32)
    slots = [get(s, torch.float32) for s in _ROW_SLOTS[e.spec.optimizer]]
    for name, a in list(arrays.items()) + [("ids", ids)]:
        if a.shape != (m,):
            raise InvalidArgument("%s: saved '%s' must be of shape (%d,), got %s"
                                  % (what, name, m, a.shape))
    for name, a in [("weight", weight)] + list(zip(_ROW_SLOTS[e.spec.optimizer], slots)):
        if a.shape != (m, e.spec.dim) or not np.isfinite(a).all():
            raise InvalidArgument("%s: saved '%s' must be finite of shape (%d, %d), got %s"
                                  % (what, name, m, e.spec.dim, a.shape))
    keys = ids.view(np.uint64)
    if len(np.unique(keys)) != m:
        raise InvalidArgument("%s: saved ids repeat" % what)
    steps, counts, clocks = arrays["row_steps"], arrays["counts"], arrays["clocks"]
    counter = counts > 0
    admit = e.spec.admit_after
    if (steps < 0).any() or (counts < 0).any() or (counter & (steps > 0)).any():
        raise InvalidArgument("%s: saved row_steps and counts must be >= 0, and an id "
                              "with counts has no row (row_steps 0)" % what)
    if counter.any() and (admit <= 1 or (counts[counter] >= admit).any()):
        raise InvalidArgument("%s: saved admission counts must be below the table's "
                              "admit_after (%d)" % (what, admit))
    at = saved.get("clock", clock)
    if not isinstance(at, (int, np.integer)) or abs(at) > (1 << 53) or (np.abs(clocks) > (1 << 53)).any():
        raise InvalidArgument("%s: saved clocks must be within +-2^53" % what)
    clocks = clocks + (clock - int(at))  # the same age at the loader's clock
    state = (np.concatenate(slots, axis=1) if slots
             else np.zeros((m, 0), np.float32))
    kinds = np.where(counter, 2, 1).astype(np.uint32)
    return (keys, weight, e.spec.optimizer, np.ascontiguousarray(state),
            np.where(counter, counts, steps).astype(np.uint64), kinds, clocks)


def _checked_table_state(ps, optimizer_state):
    """{embedding index: (row optimizer, state (N, dim x k), steps (N,))} of
    the "tables" of an optimizer_state_dict(), each checked (optimizer,
    slots, shapes, finite, steps) naming the table; {} without "tables"."""
    tables = optimizer_state.get("tables") if isinstance(optimizer_state, dict) else None
    if tables is None:
        return {}
    keys = {_weight_key(ps, i): i for i in range(len(ps.embeddings))}
    unknown = [k for k in tables if k not in keys]
    missing = [k for k, i in keys.items()
               if k not in tables and ps.embeddings[i].num_embeddings is not None]
    if unknown or missing:
        raise InvalidArgument("optimizer state of the tables does not match the model's "
                              "SparseEmbeddings: %s" % "; ".join(
                                  (["unknown " + ", ".join(unknown)] if unknown else []) +
                                  (["missing " + ", ".join(missing)] if missing else [])))
    out = {}
    for key, entry in tables.items():
        e = ps.embeddings[keys[key]]
        what = "optimizer state of %s (SparseEmbedding '%s')" % (key, e.spec.name)
        if entry.get("optimizer") != e.spec.optimizer:
            raise InvalidArgument("%s was saved from %s, the table runs %s: not loaded"
                                  % (what, entry.get("optimizer"), e.spec.optimizer))
        if "saved" in entry:  # every entry of the table: restored exactly
            out[keys[key]] = ("saved",) + _checked_saved(e, what, entry["saved"],
                                                          int(ps.clock))
            continue
        got = entry.get("row_steps", entry.get("step", 0))
        steps = torch.as_tensor(got).detach().reshape(-1).to("cpu", torch.float64)
        n = len(steps) if "row_steps" in entry else e.num_embeddings
        if n is None:
            raise InvalidArgument("%s: no row_steps, and the table's num_embeddings is "
                                  "not known" % what)
        slots = []
        for slot in _ROW_SLOTS[e.spec.optimizer]:
            t = entry.get(slot)
            if t is None:
                raise InvalidArgument("%s has no '%s'" % (what, slot))
            t = torch.as_tensor(t).detach().to("cpu", torch.float32).contiguous()
            if tuple(t.shape) != (n, e.spec.dim) or not bool(torch.isfinite(t).all()):
                raise InvalidArgument("%s: '%s' must be finite of shape (%d, %d), got %s"
                                      % (what, slot, n, e.spec.dim, tuple(t.shape)))
            slots.append(t.numpy())
        if not bool((steps >= 0).all()) or not bool((steps == steps.round()).all()):
            raise InvalidArgument("%s: steps must be whole numbers >= 0" % what)
        state = np.concatenate(slots, axis=1) if slots else np.zeros((n, 0), np.float32)
        out[keys[key]] = (e.spec.optimizer, np.ascontiguousarray(state),
                          np.broadcast_to(steps.numpy().astype(np.uint64), (n,)).copy())
    return out


def _cleared(table_state):
    """The upload's clear argument: the tables restored from "saved" (each
    shard drops their every entry before the saved ones are set)."""
    return sorted(i for i, t in table_state.items() if t[0] == "saved")


def _rows_upload(ps, values, table_state):
    """The upload's rows argument: embedding i's rows of ids 0..N-1 with
    values[i] (else the shards' own) and, from table_state[i], their state."""
    out = []
    for i in sorted(set(values) | set(table_state)):
        if i in table_state and table_state[i][0] == "saved":
            # The table's every entry, as saved (its weights included: they
            # are the state_dict's rows of ids 0..N-1 at the save).
            out.append((i,) + table_state[i][1:])
            continue
        v = values[i] if i in values else _read_rows(ps, i)[0]
        keys = np.arange(len(v), dtype=np.uint64)
        if i not in table_state:
            out.append((i, keys, v))
            continue
        optimizer, state, steps = table_state[i]
        if len(state) != len(v):
            raise InvalidArgument(
                "optimizer state of %s holds %d rows, its weight %d" % (
                    _weight_key(ps, i), len(state), len(v)))
        out.append((i, keys, v, optimizer, state, steps))
    return out


def _split_sparse(ps, state_dict, strict):
    """(the state_dict without the embeddings' rows, {embedding index: its
    rows (N, dim)}, the embeddings' keys missing from it); every row tensor
    checked (shape, finite) before anything is sent."""
    keys = {_weight_key(ps, i): i for i in range(len(ps.embeddings))}
    dense = collections.OrderedDict((k, v) for k, v in state_dict.items() if k not in keys)
    rows, missing = {}, []
    for key, i in keys.items():
        e = ps.embeddings[i]
        if key not in state_dict:
            if e.num_embeddings is not None:
                missing.append(key)
            continue
        t = torch.as_tensor(state_dict[key]).detach().to("cpu", torch.float32).contiguous()
        n = e.num_embeddings
        if t.dim() != 2 or t.shape[1] != e.spec.dim or (n is not None and t.shape[0] != n):
            raise InvalidArgument(
                "size mismatch for %s: (%s, %d) rows of SparseEmbedding '%s', got %s"
                % (key, n if n is not None else "N", e.spec.dim, e.spec.name,
                   tuple(t.shape)))
        if not bool(torch.isfinite(t).all()):
            raise InvalidArgument("%s: the rows of SparseEmbedding '%s' contain NaN or Inf"
                                  % (key, e.spec.name))
        rows[i] = t.numpy()
    if strict and missing:
        raise InvalidArgument("state_dict has no %s (the rows of SparseEmbedding %s; "
                              "strict=False loads without them)" % (
                                  ", ".join(missing), ", ".join(
                                      "'%s'" % ps.embeddings[keys[k]].spec.name
                                      for k in missing)))
    return dense, rows, missing


# The shards' optimizer state slots under torch.optim's names.
_SLOTS = {"adam": ("exp_avg", "exp_avg_sq"), "momentum": ("momentum_buffer",),
          "nesterov": ("momentum_buffer",), "adagrad": ("sum",), "sgd": ()}


def _slot_names(name, k):
    names = _SLOTS.get(name, ())
    return names if len(names) == k else tuple("slot%d" % j for j in range(k))


def _shard_optimizer(ps):
    """ps_server --optimizer of the shards (they must agree)."""
    names = {json.loads(t).get("optimizer", "sgd") for t in ps.client.stats()}
    if len(names) != 1:
        raise FailedPrecondition("the shards run different optimizers: %s"
                                 % ", ".join(sorted(names)))
    return names.pop()


def shard_optimizer_state(ps):
    """ps.optimizer_state_dict(): see ParameterServer.optimizer_state_dict."""
    name = _shard_optimizer(ps)
    k, slots, steps, chunk_steps = ps.client.optimizer_state()
    names = _slot_names(name, k)
    state = collections.OrderedDict()
    for i, pname in enumerate(ps.names):
        entry = {}
        if k:
            per_chunk = torch.from_numpy(chunk_steps[i].astype(np.int64))
            entry["step"] = torch.tensor(float(per_chunk.max()) if len(per_chunk) else 0.0)
            entry["chunk_steps"] = per_chunk
        for j, slot in enumerate(names):
            entry[slot] = torch.from_numpy(slots[j][i])
        state[pname] = entry
    out = {"optimizer": name, "step": int(steps), "state": state}
    if ps.embeddings:
        out["tables"] = table_optimizer_state(ps)
    return out


def _checked_state(ps, state):
    """The upload argument (name, slots, steps) for an optimizer_state_dict()
    `state`, checked against the shards' optimizer and the model (each
    error names the parameter); None for plain SGD (no state to restore)."""
    if not isinstance(state, dict) or "optimizer" not in state or "state" not in state:
        raise InvalidArgument("optimizer state: a dict of ps.optimizer_state_dict() "
                              "({'optimizer', 'step', 'state'}), got %s" % type(state).__name__)
    name = _shard_optimizer(ps)
    saved = state["optimizer"]
    entries = state["state"]
    missing = [n for n in ps.names if n not in entries]
    unknown = [n for n in entries if n not in ps.names]
    if missing or unknown:
        raise InvalidArgument("optimizer state does not match the model: %s" % "; ".join(
            (["missing " + ", ".join("'%s'" % n for n in missing)] if missing else []) +
            (["unknown " + ", ".join("'%s'" % n for n in unknown)] if unknown else [])))
    if saved != name:
        raise InvalidArgument(
            "optimizer state of '%s' was saved from %s, the shards run %s (ps_server "
            "--optimizer): not loaded" % (ps.names[0], saved, name))
    k = len(_SLOTS.get(name, ()))
    if k == 0:
        return None
    names = _slot_names(name, k)
    slots, steps = [[] for _ in names], []
    for i, pname in enumerate(ps.names):
        entry = entries[pname]
        for j, slot in enumerate(names):
            t = entry.get(slot)
            if t is None:
                raise InvalidArgument("optimizer state of '%s' has no '%s' (%s keeps %s)"
                                      % (pname, slot, name, ", ".join(names)))
            t = torch.as_tensor(t).detach().to("cpu", torch.float32).contiguous()
            if tuple(t.shape) != ps._shapes[i] or not bool(torch.isfinite(t).all()):
                raise InvalidArgument("optimizer state of '%s': '%s' must be finite of shape "
                                      "%s, got %s" % (pname, slot, ps._shapes[i],
                                                      tuple(t.shape)))
            slots[j].append(t.numpy())
        got = entry.get("chunk_steps", entry.get("step", state.get("step", 0)))
        got = torch.as_tensor(got).detach().reshape(-1).to("cpu", torch.float64)
        if not bool((got >= 0).all()) or not bool((got == got.round()).all()):
            raise InvalidArgument("optimizer state of '%s': steps must be whole numbers >= 0"
                                  % pname)
        steps.append(got.numpy().astype(np.uint64))
    return (name, slots, steps)


def load_and_upload(ps, state_dict, strict=True, optimizer_state=None):
    """ps.load_state_dict(): see the module comment. Returns the result of
    model.load_state_dict."""
    state, tables = None, {}
    if optimizer_state is not None:
        state = _checked_state(ps, optimizer_state)
        tables = _checked_table_state(ps, optimizer_state)
    dense, values, missing = _split_sparse(ps, state_dict, strict)
    rows = _rows_upload(ps, values, tables)
    result = ps.model.load_state_dict(dense, strict=strict)
    result.missing_keys.extend(missing)
    ps.client.upload([p.detach().to("cpu").contiguous().numpy() for p in ps.params],
                     overwrite=True, state=state, rows=rows, clear=_cleared(tables))
    for i, v in values.items():
        if ps.embeddings[i].num_embeddings is None:
            ps.embeddings[i].num_embeddings = len(v)
    ps.pull()
    return result


def load_shard_optimizer_state(ps, optimizer_state):
    """ps.load_optimizer_state_dict(): see the module comment."""
    state = _checked_state(ps, optimizer_state)
    tables = _checked_table_state(ps, optimizer_state)
    rows = _rows_upload(ps, {}, tables)
    if state is None and not rows:
        return  # plain SGD keeps no state
    ps.client.upload([p.detach().to("cpu").contiguous().numpy() for p in ps.params],
                     overwrite=True, state=state, rows=rows, clear=_cleared(tables))
    ps.pull()


def check_summing_shards(ps):
    """WorkerOptimizer needs shards that only sum: plain SGD, no weight decay,
    no staleness scaling, max_lr >= 1."""
    for i, text in enumerate(ps.client.stats()):
        st = json.loads(text)
        bad = []
        if st.get("optimizer") != "sgd":
            bad.append("--optimizer=%s (needs sgd)" % st.get("optimizer"))
        if st.get("weight_decay", 0) != 0:
            bad.append("--weight_decay=%g (needs 0)" % st["weight_decay"])
        if st.get("staleness_lr", "none") != "none":
            bad.append("--staleness_lr=%s (needs none)" % st["staleness_lr"])
        if st.get("max_lr", 1.0) < 1.0:
            bad.append("--max_lr=%g (needs >= 1)" % st["max_lr"])
        if bad:
            raise FailedPrecondition(
                "WorkerOptimizer: shard %d must only sum gradients (worker-side update): %s"
                % (i, ", ".join(bad)))
        if st.get("consistency") == "bsp":
            ps._bsp = True


class WorkerOptimizer:
    """Runs `optimizer` (any torch.optim.Optimizer over the model's
    parameters) on the worker; the shards sum/average gradients (see the
    module comment). step(): push the gradients (lr 1 carried) and clock,
    pull the shards' sums, set each parameter's .grad to what arrived
    (average scale) and call optimizer.step(). Schedulers attach to
    `optimizer` itself."""

    def __init__(self, ps, optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgument("WorkerOptimizer wraps a torch.optim.Optimizer, got %s"
                                  % type(optimizer).__name__)
        ps._bsp = False
        check_summing_shards(ps)
        self.ps = ps
        self.optimizer = optimizer
        ps._worker_update = True
        # Every push carries lr 1 (the shards add the gradients as they are),
        # from now on: with overlap=True buckets leave during backward, before
        # step() runs.
        ps.client.lr = 1.0
        if ps._overlap is not None:
            # Gradients still leave in buckets during backward; the sums come
            # back as one pull into this optimizer's buffers (step() needs them
            # all before optimizer.step()), not by groups into the model.
            ps._overlap.layered = False
        # What the shards held at the last pull: the model's weights now.
        self._prev = [p.detach().to("cpu", copy=True).contiguous() for p in ps.params]
        self._new = [torch.empty_like(t) for t in self._prev]
        self._new_np = [t.numpy() for t in self._new]
        self._scale = 1.0 if ps._bsp else 1.0 / max(1, ps.num_workers)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.ps.client.lr = 1.0  # before backward, as DistributedOptimizer's
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ps = self.ps
        ps.client.lr = 1.0
        ps.push()
        ps._check_model(structure=False)
        ps.store.pull(ps.clock, self._new_np)
        for p, prev, new in zip(ps.params, self._prev, self._new):
            g = (prev - new).mul_(self._scale)
            p.grad = g.to(p.device)
            prev.copy_(new)
        self.optimizer.step()
        return loss

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)
