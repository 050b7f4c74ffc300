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
parameters to the shards (overwrite: the shards' optimizer state restarts).
Optimizer state: WorkerOptimizer.state_dict() is the torch optimizer's;
ps.optimizer_state_dict() reads the shards' (server-side update) with
torch.optim's slot names, read only (it restarts from zero after
load_state_dict, as after init="model").
"""
import collections
import json

import torch

from .errors import FailedPrecondition, InvalidArgument


def pulled_state_dict(ps):
    """ps.state_dict(): see the module comment."""
    if not getattr(ps, "_worker_update", False):
        ps.pull()
    out = collections.OrderedDict()
    for k, v in ps.model.state_dict().items():
        out[k] = v.detach().clone()
    return out


# The shards' optimizer state slots under torch.optim's names.
_SLOTS = {"adam": ("exp_avg", "exp_avg_sq"), "momentum": ("momentum_buffer",),
          "nesterov": ("momentum_buffer",), "adagrad": ("sum",), "sgd": ()}


def shard_optimizer_state(ps):
    """ps.optimizer_state_dict(): see ParameterServer.optimizer_state_dict."""
    name = json.loads(ps.client.stats()[0]).get("optimizer", "sgd")
    k, slots, steps = ps.client.optimizer_state()
    names = _SLOTS.get(name, tuple("slot%d" % j for j in range(k)))
    if len(names) != k:
        names = tuple("slot%d" % j for j in range(k))
    state = collections.OrderedDict()
    for i, pname in enumerate(ps.names):
        entry = {"step": torch.tensor(float(steps))} if k else {}
        for j, slot in enumerate(names):
            entry[slot] = torch.from_numpy(slots[j][i])
        state[pname] = entry
    return {"optimizer": name, "step": int(steps), "state": state}


def load_and_upload(ps, state_dict, strict=True):
    """ps.load_state_dict(): see the module comment. Returns the result of
    model.load_state_dict."""
    result = ps.model.load_state_dict(state_dict, strict=strict)
    ps.client.upload([p.detach().to("cpu").contiguous().numpy() for p in ps.params],
                     overwrite=True)
    ps.pull()
    return result


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
        # What the shards held at the last pull: the model's weights now.
        self._prev = [p.detach().to("cpu", copy=True).contiguous() for p in ps.params]
        self._new = [torch.empty_like(t) for t in self._prev]
        self._new_np = [t.numpy() for t in self._new]
        self._scale = 1.0 if ps._bsp else 1.0 / max(1, ps.num_workers)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
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
