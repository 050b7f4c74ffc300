"""A discrete-event model of asyncps: workers, shards and links.

What it models (one event queue, times in seconds):

  worker w, step c:  send Pull(c) to every shard; wait for every reply
                     (idle time); be busy for StepTime.sample(w, c) seconds
                     plus the codec's encode time; send Push(c) (carrying
                     Clock(c+1): in asyncps the clock follows the push on the
                     same connection) to every shard, then Pull(c+1).
  shard:             one thread serving its requests in arrival order (FIFO);
                     a push costs per_request + raw bytes x apply_per_byte +
                     elements x the codec's decode cost (BSP: the sum into the
                     round's accumulator, and the round's apply once when its
                     last push arrives); a pull costs per_request and, when it
                     is answered, reply bytes x pull_per_byte. A pull that may
                     not be answered yet is parked (cost per_request) and
                     answered as soon as the rule allows, before the next
                     request is taken (a released pull costs only its reply:
                     it was received and decoded when it was parked; and, as in
                     the shard, a reply copies the weights only for the first
                     pull of a version, later pulls share that snapshot):
                       bsp     pull(c) when round >= c (every worker pushed
                               c-1 and the average was applied),
                       ssp(s)  pull(c) when min worker clock >= c - s,
                       asp     at once.
  link:              every endpoint (worker or shard) has a NIC with an
                     egress and an ingress FIFO of its bandwidth; a message
                     of b bytes from A to B starts when A's egress is free,
                     occupies it b / bw_A seconds, reaches B's ingress one
                     latency later and is delivered once B's ingress (FIFO,
                     b / bw_B seconds) has taken it, never earlier than A's
                     last byte plus the latency (cut-through switching).
  metrics:           per worker the time blocked in Pull (idle) and its
                     wall time (its last push); idle fraction = idle / wall;
                     the shard version (updates: pushes under ASP/SSP,
                     rounds under BSP) and updates / s over the slowest
                     worker's wall; staleness of each applied push = version
                     at apply - version in that worker's last pull reply.

Many shards: `shards` are simulated explicitly (a worker's messages to them
leave its NIC one after the other); `shard_replicas` k > 1 makes each stand
for k identical shards (symmetric shards: each holds 1/k of the bytes and
gets 1/k of every worker's NIC bandwidth). With deterministic shard costs
and a worker NIC shared fairly among its k transfers, the k shards would
see one and the same timeline, which is what the one simulated shard
computes; it makes 1,024 workers over 64 shards as cheap as over one.

Deterministic: all randomness comes from random.Random(seed).
"""
import heapq
import math
import random


# ------------------------------------------------------------- step times
class StepTime:
    """Busy time of one worker step (compute, and whatever else the worker
    does outside Pull): sample(rng, worker, step) -> seconds."""

    def sample(self, rng, worker, step):
        raise NotImplementedError


class Fixed(StepTime):
    """Constant t seconds; `factors` {worker: f} slows single workers."""

    def __init__(self, t, factors=None):
        self.t = float(t)
        self.factors = dict(factors or {})

    def sample(self, rng, worker, step):
        return self.t * self.factors.get(worker, 1.0)


class PerWorker(StepTime):
    """Constant time per worker: times[w]."""

    def __init__(self, times):
        self.times = list(times)

    def sample(self, rng, worker, step):
        return self.times[worker]


class Trace(StepTime):
    """Replays measured busy times: traces[w][step] (cycled past the end)."""

    def __init__(self, traces):
        self.traces = [list(t) for t in traces]

    def sample(self, rng, worker, step):
        t = self.traces[worker]
        return t[step % len(t)]


class Empirical(StepTime):
    """Draws i.i.d. from measured samples (all workers share them), times a
    per-worker factor."""

    def __init__(self, samples, factors=None):
        self.samples = sorted(float(s) for s in samples)
        self.factors = dict(factors or {})

    def sample(self, rng, worker, step):
        return rng.choice(self.samples) * self.factors.get(worker, 1.0)


class HeavyTail(StepTime):
    """Log-normal body with a Pareto tail of transient stragglers:

        t = median * exp(sigma * N(0,1)) * (1 + D),
        D = 0 with probability 1 - p, else Pareto: xm * U^(-1/alpha).

    factors {worker: f} add persistent stragglers."""

    def __init__(self, median, sigma=0.1, p=0.0, xm=1.0, alpha=1.5,
                 factors=None):
        self.median, self.sigma = float(median), float(sigma)
        self.p, self.xm, self.alpha = float(p), float(xm), float(alpha)
        self.factors = dict(factors or {})

    def sample(self, rng, worker, step):
        t = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        if self.p > 0 and rng.random() < self.p:
            t *= 1.0 + self.xm * (1.0 - rng.random()) ** (-1.0 / self.alpha)
        return t * self.factors.get(worker, 1.0)


# ---------------------------------------------------------- configuration
class Codec:
    """Push compression: wire bytes = raw / ratio; encode on the worker and
    decode on the shard cost seconds per fp32 element."""

    def __init__(self, name="none", ratio=1.0, encode_per_elem=0.0,
                 decode_per_elem=0.0):
        self.name = name
        self.ratio = float(ratio)
        self.encode_per_elem = float(encode_per_elem)
        self.decode_per_elem = float(decode_per_elem)


class Config:
    """One simulated job. Sizes in bytes, rates in bytes/s, times in s."""

    def __init__(self, workers=4, shards=1, consistency="asp", staleness=0,
                 steps=100, step_time=None, model_bytes=940584.0,
                 codec=None, pull_ratio=1.0, worker_bandwidth=1.25e9,
                 shard_bandwidth=None, latency=50e-6, per_request=20e-6,
                 apply_per_byte=0.0, pull_per_byte=0.0, bsp_add_per_byte=None,
                 header_bytes=128, shard_replicas=1, seed=1,
                 batch=None):
        if consistency not in ("bsp", "ssp", "asp"):
            raise ValueError("consistency must be bsp, ssp or asp")
        if workers < 1 or shards < 1 or steps < 1 or shard_replicas < 1:
            raise ValueError("workers, shards, steps, shard_replicas >= 1")
        self.workers, self.shards = int(workers), int(shards)
        self.consistency = consistency
        self.staleness = int(staleness)
        self.steps = int(steps)
        self.step_time = step_time or Fixed(0.01)
        self.model_bytes = float(model_bytes)
        self.codec = codec or Codec()
        self.pull_ratio = float(pull_ratio)
        self.worker_bandwidth = float(worker_bandwidth)
        self.shard_bandwidth = float(shard_bandwidth or worker_bandwidth)
        self.latency = float(latency)
        self.per_request = float(per_request)
        self.apply_per_byte = float(apply_per_byte)
        self.pull_per_byte = float(pull_per_byte)
        self.bsp_add_per_byte = float(apply_per_byte if bsp_add_per_byte is None
                                      else bsp_add_per_byte)
        self.header_bytes = float(header_bytes)
        self.shard_replicas = int(shard_replicas)
        self.seed = seed
        self.batch = batch

    # Bytes of this shard's part (fp32), and of each message to/from it.
    @property
    def part_bytes(self):
        return self.model_bytes / (self.shards * self.shard_replicas)

    def push_bytes(self):
        return self.header_bytes + self.part_bytes / self.codec.ratio

    def pull_reply_bytes(self):
        return self.header_bytes + self.part_bytes / self.pull_ratio


# ------------------------------------------------------------------ engine
class _Nic:
    __slots__ = ("bw", "egress_free", "ingress_free")

    def __init__(self, bw):
        self.bw = bw
        self.egress_free = 0.0
        self.ingress_free = 0.0


class Simulation:
    """Runs a Config to completion: Simulation(cfg).run() -> Result."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._events = []
        self._seq = 0
        W, S = cfg.workers, cfg.shards
        # Each simulated shard gets 1/replicas of a worker NIC.
        self.wnic = [_Nic(cfg.worker_bandwidth / cfg.shard_replicas)
                     for _ in range(W)]
        # Explicit shards share the worker's NIC: one _Nic per worker serves
        # all of them (FIFO), scaled above for the replicas.
        self.snic = [_Nic(cfg.shard_bandwidth) for _ in range(S)]
        self.shard = [_Shard(self, s) for s in range(S)]
        self.worker = [_Worker(self, w) for w in range(W)]

    def at(self, t, fn, *args):
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, args))

    def send(self, src, dst, nbytes, fn, *args):
        """Delivers a message of nbytes from NIC src to NIC dst, then calls
        fn(*args) at the delivery time."""
        tx_start = max(self.now, src.egress_free)
        tx_end = tx_start + nbytes / src.bw
        src.egress_free = tx_end
        rx_start = max(tx_start + self.cfg.latency, dst.ingress_free)
        rx_end = max(rx_start + nbytes / dst.bw, tx_end + self.cfg.latency)
        dst.ingress_free = rx_end
        self.at(rx_end, fn, *args)

    def run(self):
        for w in self.worker:
            w.start()
        while self._events:
            t, _, fn, args = heapq.heappop(self._events)
            self.now = t
            fn(*args)
        return Result(self)


class _Worker:
    def __init__(self, sim, w):
        self.sim, self.w = sim, w
        self.clock = 0
        self.pending = 0
        self.wait_start = 0.0
        self.idle = 0.0
        self.end = None
        self.waits = []

    def start(self):
        self._pull(self.clock)

    def _pull(self, c):
        sim = self.sim
        self.pending = len(sim.shard)
        self.wait_start = sim.now
        for s in sim.shard:
            sim.send(sim.wnic[self.w], sim.snic[s.s], sim.cfg.header_bytes,
                     s.arrive, ("pull", self.w, c))

    def reply(self):
        self.pending -= 1
        if self.pending:
            return
        sim = self.sim
        wait = sim.now - self.wait_start
        self.idle += wait
        self.waits.append(wait)
        cfg = sim.cfg
        busy = cfg.step_time.sample(sim.rng, self.w, self.clock)
        busy += cfg.codec.encode_per_elem * cfg.model_bytes / 4.0
        sim.at(sim.now + busy, self._computed)

    def _computed(self):
        sim, c = self.sim, self.clock
        for s in sim.shard:
            sim.send(sim.wnic[self.w], sim.snic[s.s], sim.cfg.push_bytes(),
                     s.arrive, ("push", self.w, c))
        self.clock = c + 1
        if self.clock < sim.cfg.steps:
            self._pull(self.clock)
        else:
            self.end = sim.now


class _Shard:
    def __init__(self, sim, s):
        self.sim, self.s = sim, s
        W = sim.cfg.workers
        self.queue = []          # requests waiting for the thread (FIFO)
        self.qhead = 0
        self.busy = False
        self.busy_time = 0.0
        self.version = 0
        self.round = 0           # BSP: rounds applied
        self.round_pushes = 0
        self.clocks = [0] * W    # a worker's clock: its pushes so far
        self.min_clock = 0
        self.last_read = [0] * W
        self.parked = []
        self.staleness = []
        self.snapshot_version = -1  # version of the shared pull snapshot

    def arrive(self, req):
        self.queue.append(req)
        if not self.busy:
            self._next()

    def _next(self):
        if self.qhead == len(self.queue):
            self.queue, self.qhead = [], 0
            self.busy = False
            return
        req = self.queue[self.qhead]
        self.qhead += 1
        self.busy = True
        cost, done = self._handle(req)
        self.busy_time += cost
        self.sim.at(self.sim.now + cost, self._served, done)

    def _served(self, done):
        for fn in done:
            fn()
        self._next()

    def _ready(self, c):
        cfg = self.sim.cfg
        if cfg.consistency == "asp":
            return True
        if cfg.consistency == "ssp":
            return self.min_clock >= c - cfg.staleness
        return self.round >= c

    def _reply_cost(self):
        """Copying the weights into a new snapshot, once per version."""
        if self.snapshot_version == self.version:
            return 0.0
        self.snapshot_version = self.version
        cfg = self.sim.cfg
        return cfg.pull_per_byte * cfg.part_bytes / cfg.pull_ratio

    def _answer(self, w):
        """Returns the action sending worker w its reply (version now)."""
        self.last_read[w] = self.version
        sim = self.sim

        def send():
            sim.send(sim.snic[self.s], sim.wnic[w], sim.cfg.pull_reply_bytes(),
                     sim.worker[w].reply)
        return send

    def _handle(self, req):
        """(service seconds, [actions at the end of the service])."""
        kind, w, c = req
        cfg = self.sim.cfg
        cost = cfg.per_request
        done = []
        if kind == "pull":
            if self._ready(c):
                cost += self._reply_cost()
                done.append(self._answer(w))
            else:
                self.parked.append((w, c))
            return cost, done
        # push of step c, with Clock(c + 1)
        elems = cfg.part_bytes / 4.0
        cost += elems * cfg.codec.decode_per_elem
        self.staleness.append(self.version - self.last_read[w])
        if cfg.consistency == "bsp":
            cost += cfg.bsp_add_per_byte * cfg.part_bytes
            self.round_pushes += 1
        else:
            cost += cfg.apply_per_byte * cfg.part_bytes
            self.version += 1
        old_min = self.min_clock
        self.clocks[w] = max(self.clocks[w], c + 1)
        self.min_clock = min(self.clocks)
        if cfg.consistency == "bsp" and self.min_clock > self.round:
            # Every worker pushed this round: apply the average once.
            cost += cfg.apply_per_byte * cfg.part_bytes
            self.round = self.min_clock
            self.round_pushes = 0
            self.version += 1
        if self.min_clock != old_min or cfg.consistency == "bsp":
            keep = []
            for pw, pc in self.parked:
                if self._ready(pc):
                    cost += self._reply_cost()
                    done.append(self._answer(pw))
                else:
                    keep.append((pw, pc))
            self.parked = keep
        return cost, done


class Result:
    """Metrics of a finished simulation."""

    def __init__(self, sim):
        cfg = sim.cfg
        self.config = cfg
        ends = [w.end for w in sim.worker]
        if any(e is None for e in ends):
            raise RuntimeError("a worker did not finish (deadlock)")
        self.wall = [e for e in ends]
        self.idle = [w.idle for w in sim.worker]
        self.idle_frac = [i / e if e > 0 else 0.0
                          for i, e in zip(self.idle, self.wall)]
        self.updates = max(s.version for s in sim.shard)
        self.max_wall = max(self.wall)
        self.updates_per_s = self.updates / self.max_wall if self.max_wall \
            else 0.0
        stal = sorted(x for s in sim.shard for x in s.staleness)
        self.staleness_p50 = _quantile(stal, 0.5)
        self.staleness_p99 = _quantile(stal, 0.99)
        self.staleness_max = stal[-1] if stal else 0
        self.shard_busy_frac = max(s.busy_time for s in sim.shard) / \
            self.max_wall if self.max_wall else 0.0
        self.steps = cfg.steps * cfg.workers
        self.samples_per_s = (self.steps * cfg.batch / self.max_wall
                              if cfg.batch and self.max_wall else None)

    @property
    def idle_frac_mean(self):
        return sum(self.idle_frac) / len(self.idle_frac)

    def row(self):
        return {"idle_frac": self.idle_frac_mean,
                "idle_frac_min": min(self.idle_frac),
                "idle_frac_max": max(self.idle_frac),
                "updates": self.updates, "wall_s": self.max_wall,
                "updates_per_s": self.updates_per_s,
                "staleness_p50": self.staleness_p50,
                "staleness_p99": self.staleness_p99,
                "staleness_max": self.staleness_max,
                "shard_busy_frac": self.shard_busy_frac,
                "samples_per_s": self.samples_per_s}


def _quantile(sorted_vals, q):
    if not sorted_vals:
        return 0
    i = min(len(sorted_vals) - 1, max(0, int(math.ceil(q * len(sorted_vals))) - 1))
    return sorted_vals[i]


def simulate(cfg):
    return Simulation(cfg).run()
