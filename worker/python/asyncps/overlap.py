"""Overlap of communication with backward for asyncps.torch (issue 22).

ParameterServer(model, overlap=True, bucket_mb=25) attaches an
OverlapScheduler: a per-step scheduler above the existing Store calls
(DESIGN.md "Overlap in the worker"):

  - Push while backward runs. A hook on each parameter's gradient
    accumulator (the AccumulateGrad node: it fires once p.grad holds this
    backward's gradient; torch >= 2.1's register_post_accumulate_grad_hook is
    used instead where it exists) marks the parameter ready. Ready gradients
    are grouped into buckets of about bucket_mb MiB in the order backward
    produces them (DDP's default: 25 MiB; as in DDP, each step's first bucket
    closes at first_bucket_mb, 1 MiB, so the last layers' gradients leave
    while backward computes the rest) and each full bucket is handed to a
    sender thread, which encodes (compresses) it and starts its push
    (Store.push_chunks: the GIL is released around the encode and the send),
    while the main thread goes on with backward. ParameterServer.push() sends
    what is left, waits until the sender has handed every bucket to the
    client, and sends the clock to the shards not clocked yet (below): on
    each shard's connection the step's pushes precede its clock, so BSP
    rounds and the SSP bound see them all.
  - Per-shard clocks (the pipeline). From the second step on, as soon as
    the sender has started the last push of the step to a shard (every
    chunk it holds was in some bucket), it sends that shard the new clock
    and, behind it, that shard's part of each pull group in forward order
    (Store.clock_shards_and_pull_groups). The shard's round (BSP) can then
    close and its weights come down while the pushes to the next shards go
    up: the link is used both ways at once, as a ring all-reduce does,
    instead of the whole gradient up and then the whole model down. That
    needs the pushes to go in stages: pushes started together share the
    link and all arrive at the end, so with pipeline_shards = k the sender,
    once k shards were clocked, waits until the pushes sent since the last
    wait have arrived (Store.start_receipts right behind each push, a
    heartbeat answered in order; Store.wait_receipts) before the next push. It waits for
    their arrival, not their acknowledgement, which a replicated primary
    holds until the round closed and its backups have it. k = the number of hosts the
    shards run on keeps every shard host's link busy in each stage (2
    shard hosts with 4 shards: 1.25-1.36x of no overlap at 100 Mbit/s,
    where k = 0 gives 1.05x; experiments/results/overlap/REPORT.md).
    Default 0 (no stages: the per-shard clocks alone, which help only where
    shards complete at different times in backward). The store refuses a
    later push of the step to a shard clocked so. Off for
    models with SparseEmbedding tables (their rows go in push(), after
    backward) and on elastic fleets (the store refuses; the clock then goes
    to every shard at the end, as without).
  - BSP: a shard counts one push per worker and round (server/shard/shard.h),
    so under BSP a bucket is one shard's chunks, sent as soon as every tensor
    with a chunk on that shard is ready. With ParameterServer(placement=
    "in_order") the shards holding the last layers' chunks are complete
    early and go out while backward still runs (1.39x of no overlap where
    the default placement, which gives every shard pieces of the large
    layers and so completes every shard at the end, gives 1.24x;
    experiments/results/overlap/REPORT.md). The values pushed are the same
    as without overlap, so BSP results are bitwise equal.
  - Priority (P3 / ByteScheduler): when several buckets wait for the sender,
    the one holding the earliest layer (registration order, which is forward
    order for nn.Sequential-style models) goes first.
  - Pulls in forward order, waited for on first use (P3). The first step
    records the order in which modules holding parameters run (forward
    pre-hooks); the parameters are then cut into pull groups in that order
    (whole modules, each group at least min_pull_group_kb KiB). From then
    on the clock goes to each shard (per shard, above, or all at once in
    step(): Store.clock_and_pull_groups) followed, on its connection, by one
    pull request per group in forward order, and step() returns; each module's forward pre-hook waits only for the groups up
    to its own (Store.wait_pull_group), so the first layers compute while
    the later layers' weights are still on the wire, and the first layers'
    weights, asked for first, arrive first. Parameters of modules the first
    step did not run are in a group of their own, waited for when the
    model's forward starts. With a pull codec or prefetch_ahead the pull is
    one request (Store.clock), waited for when the model's forward starts.

One backward per step: a parameter whose gradient arrives twice in one step
(gradient accumulation over micro-batches) raises FailedPrecondition, since
its first gradient was already sent; use overlap=False there. CUDA
models: each gradient is copied into pinned host memory as backward
produces it (ParameterServer._grad_array) and each pull group is copied to
the device as its module's forward waits for it; a push codec then encodes
on the host (overlap=False compresses on the device, PushDevice). Reading
the weights between step() and the next forward (for
example to save them) needs ParameterServer.pull() first, and so does a
parameter read in forward outside the module that holds it before that
module runs (weights tied across modules): use overlap=False there.

Threads: hooks run on the thread that runs backward (with the GIL); the
sender thread only calls Store.push_chunks and
Store.clock_shards_and_pull_groups (between the step's first bucket and
push(): the pull groups of the step were all waited for before); the
step's other calls stay on the training thread. The asyncps Client serialises the calls of both.
"""
import heapq
import json
import threading

import numpy as np

from ._torch_required import torch
from .errors import FailedPrecondition, InvalidArgument

DEFAULT_BUCKET_MB = 25.0
# The first bucket of a step closes at this size (DDP's first_bucket_bytes_cap,
# 1 MiB): the last layers' gradients, which backward produces first, leave
# while it computes the rest instead of waiting for bucket_mb MiB.
DEFAULT_FIRST_BUCKET_MB = 1.0


class _Sender(threading.Thread):
    """Pushes the buckets it is given, highest priority (lowest number)
    first, and sends each shard's clock (per-shard clocks) once no bucket
    it was given holds a chunk of that shard any more, whatever the order
    the priorities gave the pushes. drain() waits until every bucket given
    so far was pushed (and the clocks asked for sent) and raises the first
    error of any of them."""

    def __init__(self, store, chunk_shard):
        super().__init__(name="asyncps-overlap-sender", daemon=True)
        self._store = store
        self._chunk_shard = chunk_shard
        self._cv = threading.Condition()
        self._heap = []     # (priority, seq, clock, chunk_ids, arrays)
        self._queued = {}   # shard -> chunks in buckets not yet pushed
        self._clock_wanted = {}  # shard -> (new clock, groups) once pushed
        self._seq = 0
        self._busy = False
        self._stopping = False
        self._error = None
        self.pushes = 0     # push_chunks calls made
        self.shard_clocks = 0  # clock_shards_and_pull_groups calls made
        self.per_shard = True  # False once the store refused per-shard clocks
        # Per-shard clocks: at most `window` clocked shards' pushes on the
        # wire before the next push waits for their acknowledgements (0: no
        # limit). OverlapScheduler sets it.
        self.window = 0
        self._unacked = 0  # shards clocked since the last wait
        self.stage_waits = 0  # wait_receipts calls made

    def put(self, priority, clock, chunk_ids, arrays, clock_shards=(), groups=None):
        """Queues a bucket; then, once every bucket holding chunks of the
        shards clock_shards was pushed, clock + 1 and the pull of `groups`
        go to them (Store.clock_shards_and_pull_groups)."""
        with self._cv:
            for c in chunk_ids:
                s = self._chunk_shard[c]
                self._queued[s] = self._queued.get(s, 0) + 1
            for s in clock_shards:
                self._clock_wanted[s] = (clock + 1, groups)
            heapq.heappush(self._heap, (priority, self._seq, clock, chunk_ids, arrays))
            self._seq += 1
            self._cv.notify_all()

    def drain(self):
        with self._cv:
            while self._heap or self._busy:
                self._cv.wait()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def stop(self):
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self.join()

    def run(self):
        while True:
            with self._cv:
                while not self._heap and not self._stopping:
                    self._cv.wait()
                if not self._heap:
                    return
                _, _, clock, ids, arrays = heapq.heappop(self._heap)
                skip = self._error is not None
                self._busy = True
            todo = []
            try:
                if not skip and self.window and self._unacked >= self.window:
                    # The shards just clocked get the link to themselves:
                    # their rounds close and their pulls come down while
                    # this push goes up (all pushes at once share the link
                    # and every shard's round closes at the end).
                    self._unacked = 0
                    self.stage_waits += 1
                    self._store.wait_receipts()
                if not skip:
                    self._store.push_chunks(clock, ids, arrays)
                    if self.window:
                        # Right behind the push, before its shards' clock
                        # and pulls (whose replies would delay it).
                        self._store.start_receipts(
                            sorted({self._chunk_shard[c] for c in ids}))
                    self.pushes += 1
            except BaseException as e:  # noqa: BLE001 - raised by drain()
                with self._cv:
                    self._error = self._error or e
            finally:
                with self._cv:
                    for c in ids:
                        self._queued[self._chunk_shard[c]] -= 1
                    if self._error is not None:
                        self._clock_wanted.clear()  # the step failed
                    ready = sorted(s for s in self._clock_wanted if self._queued[s] == 0)
                    todo = [(s, self._clock_wanted.pop(s)) for s in ready]
                    self._busy = bool(todo)
                    self._cv.notify_all()
            if not todo:
                continue
            try:
                if self.per_shard:
                    self._clock_shards(todo[0][1][0], [s for s, _ in todo], todo[0][1][1])
            except BaseException as e:  # noqa: BLE001 - raised by drain()
                with self._cv:
                    self._error = self._error or e
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _clock_shards(self, new_clock, shards, groups):
        try:
            self._store.clock_shards_and_pull_groups(new_clock, shards, groups)
            self.shard_clocks += 1
            self._unacked += len(shards)
        except FailedPrecondition:
            # Nothing was sent (an elastic fleet): the clock goes to every
            # shard at the end of the step, as without per-shard clocks.
            self.per_shard = False


class OverlapScheduler:
    """The overlap of one ParameterServer (see the module doc). Made by
    ParameterServer(overlap=True); bucket_mb: bucket size in MiB (> 0;
    BSP shards: one bucket per shard whatever the size); first_bucket_mb:
    the size at which each step's first bucket closes (> 0; as DDP, so the
    first gradients leave early; at most bucket_mb counts); pipeline_shards:
    per-shard clocks' window (module doc; 0: no limit)."""

    def __init__(self, ps, bucket_mb=DEFAULT_BUCKET_MB, min_pull_group_kb=64.0,
                 pipeline_shards=0, first_bucket_mb=DEFAULT_FIRST_BUCKET_MB):
        if not bucket_mb > 0:
            raise InvalidArgument("bucket_mb must be > 0, got %r" % (bucket_mb,))
        if not first_bucket_mb > 0:
            raise InvalidArgument("first_bucket_mb must be > 0, got %r" % (first_bucket_mb,))
        self.ps = ps
        self.bucket_bytes = int(bucket_mb * (1 << 20))
        self.first_bucket_bytes = min(self.bucket_bytes, int(first_bucket_mb * (1 << 20)))
        n = len(ps.params)
        self.bsp = any(json.loads(t).get("consistency") == "bsp" for t in ps.client.stats())
        # Chunks of each tensor and, per shard, the tensors it holds chunks of.
        self.tensor_chunks = [[] for _ in range(n)]
        shard_tensors, chunk_shard = {}, {}
        for cid, tensor, _off, _n, shard in ps.client.chunks():
            self.tensor_chunks[tensor].append(cid)
            shard_tensors.setdefault(shard, set()).add(tensor)
            chunk_shard[cid] = shard
        self.shard_chunks = {s: sorted(c for t in ts for c in self.tensor_chunks[t]
                                       if chunk_shard[c] == s)
                             for s, ts in shard_tensors.items()}
        self.shard_tensors = {s: sorted(ts) for s, ts in shard_tensors.items()}
        self.chunk_shard = chunk_shard
        # Per-shard clocks (module doc); not with sparse tables, whose rows
        # are pushed after backward.
        self.per_shard_clocks = not getattr(ps, "embeddings", None)
        self.tensor_shards = [sorted({chunk_shard[c] for c in self.tensor_chunks[i]})
                              for i in range(n)]
        self.nbytes = [int(p.numel()) * 4 for p in ps.params]
        self._placeholders = {}
        self._sender = _Sender(ps.store, chunk_shard)
        if not pipeline_shards >= 0:
            raise InvalidArgument("pipeline_shards must be >= 0, got %r" % (pipeline_shards,))
        self._sender.window = int(pipeline_shards)
        self._sender.start()
        self._handles = []
        self._accumulators = []  # keeps each AccumulateGrad node (and its hook) alive
        for i, p in enumerate(ps.params):
            self._hook(i, p)
        # Layered pulls: a forward pre-hook on every module holding
        # parameters; the groups follow the first step's order of first use.
        self.layered = True
        self.min_group_bytes = int(min_pull_group_kb * 1024)
        index = {id(p): i for i, p in enumerate(ps.params)}
        self._module_params = {}
        for mod in ps.model.modules():
            mine = sorted({index[id(p)] for p in mod.parameters(recurse=False)
                           if id(p) in index})
            if mine:
                self._module_params[mod] = mine
                self._handles.append(mod.register_forward_pre_hook(self._before_module))
        self._handles.append(ps.model.register_forward_pre_hook(self._before_forward))
        self._first_use = []          # modules in the order the first step ran them
        self.groups = None            # [(tensor indices, chunk ids)] in forward order
        self._module_group = {}       # module -> index of its last group
        self._root_group = -1         # group of parameters no observed module holds
        self._waited = 0              # groups of this step's pull written so far
        self._layered_step = False    # this step's pull is by groups
        self.pull_pending = False
        self.stats = {"buckets": 0, "steps": 0, "pull_groups": 0, "shard_clocks": 0,
                      "stage_waits": 0}
        self._new_step()

    # ---- hooks -------------------------------------------------------------
    def _hook(self, i, p):
        if hasattr(p, "register_post_accumulate_grad_hook"):
            self._handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, i=i: self._ready(i)))
            return
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        self._accumulators.append(acc)
        self._handles.append(acc.register_hook(lambda *_, i=i: self._ready(i)))

    def _before_forward(self, module, inputs):
        """The model's forward starts: without layered pulls, wait for the
        whole pull; with them, for the parameters no module's hook covers."""
        if not self.pull_pending:
            return
        if not self._layered_pending():
            self.pull_pending = False
            self.ps.pull()
        elif self._root_group >= 0:
            self._wait_groups(self._root_group)

    def _before_module(self, module, inputs):
        if self.groups is None and module not in self._first_use:
            self._first_use.append(module)
        if self.pull_pending and self._layered_pending():
            self._wait_groups(self._module_group.get(module, len(self.groups) - 1))

    def _layered_pending(self):
        """Groups of this step's layered pull not yet written into the model.
        The store's count alone may already be the next step's (per-shard
        clocks), ours alone stale after Store.flush() dropped the groups;
        the next step's groups start only once this step's were waited for,
        so both pending means this step's."""
        return (self._layered_step and self._waited < len(self.groups)
                and self.ps.store.pull_groups_pending > 0)

    def _wait_groups(self, last):
        """Writes groups up to `last` of this step's layered pull into the
        model, in order (they arrive in that order)."""
        if self._waited == 0:
            self.ps._check_tensors()  # p.data replaced: write into the new one
        while self._waited <= last:
            self.ps.store.wait_pull_group(self._waited, self.ps._pull_bufs)
            if self.ps._host is not None:  # CUDA: the group's host copies to the device
                with torch.no_grad():
                    for t in self.groups[self._waited][0]:
                        self.ps.params[t].copy_(self.ps._host[t])
            self._waited += 1
        if self._waited == len(self.groups):
            self.pull_pending = False

    def finish_pull(self):
        """ParameterServer.pull(): completes a layered pull in flight (True)
        or leaves the pull to the caller (False)."""
        if self._layered_pending():
            self._wait_groups(len(self.groups) - 1)
            return True
        self.pull_pending = False
        return False

    def _build_groups(self):
        """Pull groups in the order of first use: parameters of modules the
        first step did not run (or ran without a hook) first, then each
        module's, merged until a group holds min_group_bytes."""
        seen, order = set(), []
        for mod in self._first_use:
            mine = [i for i in self._module_params[mod] if i not in seen]
            seen.update(mine)
            order.append((mod, mine))
        rest = [i for i in range(len(self.ps.params)) if i not in seen]
        groups, current, size = [], [], 0
        if rest:
            groups.append(rest)
            self._root_group = 0
        for mod, mine in order:
            current += mine
            size += sum(self.nbytes[i] for i in mine)
            self._module_group[mod] = len(groups)
            if size >= self.min_group_bytes:
                groups.append(current)
                current, size = [], 0
        if current:
            groups.append(current)
        self._module_group = {m: min(g, len(groups) - 1) for m, g in self._module_group.items()}
        self.groups = [(g, sorted(c for t in g for c in self.tensor_chunks[t]))
                       for g in groups if g]
        self._group_chunks = [c for _, c in self.groups]

    def clock(self, new_clock):
        """ParameterServer.push(): announces new_clock and starts the pull
        of its weights, by groups in forward order when the store can (raw
        pulls, no prefetch_ahead)."""
        if self.layered:
            if self.groups is None:
                self._build_groups()
            try:
                self.ps.store.clock_and_pull_groups(new_clock, self._group_chunks)
                self._waited = 0
                self._layered_step = True
                self.stats["pull_groups"] += len(self.groups)
                self.stats["shard_clocks"] = self._sender.shard_clocks
                self.stats["stage_waits"] = self._sender.stage_waits
                return
            except FailedPrecondition:
                if self.ps.store.pull_groups_pending:
                    raise
                self.layered = False  # a pull codec or prefetch_ahead: whole pulls
        self._layered_step = False
        self.ps.store.clock(new_clock)

    def _new_step(self):
        n = len(self.ps.params)
        self.ready = [False] * n
        self.arrays = [None] * n
        self.shard_sent = set()          # BSP: shards whose push was handed over
        self.pending = []                # ready, not yet in a bucket (non-BSP)
        self.pending_bytes = 0
        self.step_buckets = 0            # buckets flushed this step (non-BSP)
        self.shard_left = {s: len(ts) for s, ts in self.shard_tensors.items()}
        # Per shard: its chunks not yet handed to the sender this step.
        self.shard_unsent = {s: len(c) for s, c in self.shard_chunks.items()}

    def _ready(self, i):
        """Parameter i's gradient for this step is complete (training thread)."""
        if self.ready[i]:
            raise FailedPrecondition(
                "parameter '%s' got a second gradient in one step: overlap=True pushes each "
                "gradient as backward produces it (one backward per step); use "
                "overlap=False to accumulate gradients" % self.ps.names[i])
        self.ready[i] = True
        self.arrays[i] = self.ps._grad_array(i)
        if self.bsp:
            for s in self.tensor_shards[i]:
                self.shard_left[s] -= 1
                if self.shard_left[s] == 0:
                    self._send_shard(s)
            return
        self.pending.append(i)
        self.pending_bytes += self.nbytes[i]
        if self.pending_bytes >= (self.first_bucket_bytes if self.step_buckets == 0
                                  else self.bucket_bytes):
            self._flush_pending()

    def _flush_pending(self):
        if self.pending:
            self.step_buckets += 1
            tensors, self.pending, self.pending_bytes = self.pending, [], 0
            self._send(tensors, sorted(c for t in tensors for c in self.tensor_chunks[t]))

    def _send_shard(self, s):
        self.shard_sent.add(s)
        self._send(self.shard_tensors[s], self.shard_chunks[s])

    def _send(self, tensors, chunk_ids):
        arrays = [a if a is not None else self._placeholder(t)
                  for t, a in enumerate(self.arrays)]
        self.stats["buckets"] += 1
        done = []  # shards whose every chunk is now in a bucket
        for c in chunk_ids:
            s = self.chunk_shard[c]
            self.shard_unsent[s] -= 1
            if self.shard_unsent[s] == 0:
                done.append(s)
        if not (done and self.per_shard_clocks and self.layered and self.groups is not None
                and self._sender.per_shard):
            done = ()
        elif self._layered_pending():  # layers the forward pass did not reach
            self._wait_groups(len(self.groups) - 1)
        self._sender.put(min(tensors), self.ps.clock, chunk_ids, arrays, done,
                         self._group_chunks if done else None)

    def _placeholder(self, t):
        """A buffer of tensor t's shape that push_chunks will not read."""
        z = self._placeholders.get(t)
        if z is None:
            z = self._placeholders[t] = np.zeros(self.ps._shapes[t], np.float32)
        return z

    # ---- the step ----------------------------------------------------------
    def push_rest(self):
        """ParameterServer.push(): sends what backward has not (parameters
        without a gradient this step go as their .grad or zeros, as without
        overlap) and waits until every bucket of the step was handed to the
        client; the caller then sends the clock."""
        if self._layered_pending():  # layers the forward pass did not reach
            self._wait_groups(len(self.groups) - 1)
        try:
            for i in range(len(self.ready)):
                if not self.ready[i]:
                    self.ready[i] = True
                    self.arrays[i] = self.ps._grad_array(i)
                    if self.bsp:
                        for s in self.tensor_shards[i]:
                            self.shard_left[s] -= 1
                    else:
                        self.pending.append(i)
            if self.bsp:
                for s in sorted(self.shard_left):
                    if s not in self.shard_sent:
                        self._send_shard(s)
            else:
                self._flush_pending()
            self._sender.drain()
        finally:
            self._new_step()
        self.stats["steps"] += 1

    def close(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._accumulators = []
        if self._sender.is_alive():
            self._sender.stop()
