"""psrun --elastic PLAN: shards that join and leave while the workers train.

A plan is a comma-separated list of steps, each at a time in seconds after
the workers started (--elastic_from start, the default) or after they began
training (--elastic_from training: every initial shard counted a push, asked
with `ps_ctl stats` every 0.25 s; for workers that take a while to start,
such as PyTorch scripts on a loaded machine):
  +N@T     start N new shards (one at a time) and move chunks onto each:
           ps_server --shard_id=K --num_shards=K+1 (K: the next shard index),
           then `ps_ctl add-shard ENDPOINT`
  -N@T     move every chunk off the N newest shards still holding chunks
           (`ps_ctl remove-shard ENDPOINT`), then stop them
  -#K@T    the same for shard K
e.g. "+1@20s,-1@40s" (2 -> 3 -> 2 shards with --servers 2). The fleet's
elastic layout lives in etcd (psrun starts a local one, or --etcd) under
/asyncps/<run folder name>/elastic. A removed shard keeps answering clients
that still route by the old layout (with the new one) for LINGER_S seconds,
then gets `ps_ctl shutdown`. A step whose time comes after the workers
finished is skipped (recorded as such). Every step's ps_ctl report is in
RUN_DIR/elastic.json and in summary.json ("elastic"); a step that fails
fails the run (the shards are back on the layout they had).

Backends: ps_ctl always runs where psrun runs; a new shard starts as the
backend starts shards (Fleet.start_shard):
  local  a process on this machine;
  ssh    over ssh on the next slot of --hostfile in the launcher's
         round-robin after every process started so far (shards, workers,
         earlier new shards: Member.index); its remote PID is signalled over
         ssh at teardown like any shard's;
  slurm  an srun step of one task of its own (slurm.SlurmFleet.start_shard,
         task.sh with PSRUN_SHARD_OFFSET=K); without --etcd, etcd runs as a
         step too (as for --replicas), so every node reaches it;
  local with --emulate_hosts N
         on a new emulated host of its own (h<N>, h<N+1>, ...: a namespace
         on the same bridge with the same link, cli.emulated_hosts); psrun's
         etcd and ps_ctl run in the hub namespace, on its address;
  k8s    psrun only renders: the plan runs inside the cluster, in a Job of
         its own that scales the shards' StatefulSet and runs ps_ctl there
         (k8s.render_elastic; a scale-down deletes the highest ordinals, so a
         plan adding shards after one is refused).
Shards ask etcd only when a change's ps_ctl went away mid-way: on ssh, the
local etcd (127.0.0.1) suits hosts on this machine; give --etcd ENDPOINTS
for other hosts.

Replica groups (--replicas R): a group that joins starts its R members
together (local: on R new emulated hosts with --emulate_hosts; ssh: the next
R slots of --hostfile; slurm: a step of R tasks; k8s: the StatefulSet
scaled by R pods) and `ps_ctl add-shard "ep1|ep2"` moves chunks onto it; a
group that leaves goes whole.
"""
import json
import re
import signal
import subprocess
import time

from . import summary as summary_mod
from .member import LaunchError, Member

LINGER_S = 2.0
BACKENDS = ("local", "ssh", "slurm", "k8s")
_STEP = re.compile(r"([+-])(#?)(\d+)@(\d+(?:\.\d*)?)s?")


class Step:
    def __init__(self, text, at_s, op, count=1, shard=None):
        self.text = text
        self.at_s = at_s
        self.op = op  # "add" | "remove"
        self.count = count
        self.shard = shard  # remove: an explicit shard index

    def __repr__(self):
        return "Step(%r)" % self.text


def parse_plan(text, servers):
    """The steps of `text` in time order; ValueError naming the bad step
    (syntax, or a plan that would leave no shard)."""
    steps = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        m = _STEP.fullmatch(item)
        if not m:
            raise ValueError("step %r is not +N@SECONDS, -N@SECONDS or -#SHARD@SECONDS "
                             "(e.g. '+1@20s,-1@40s')" % item)
        sign, explicit, n, at = m.groups()
        n = int(n)
        if sign == "+" and explicit:
            raise ValueError("step %r: '+#K' makes no sense; +N adds N new shards" % item)
        if not explicit and n < 1:
            raise ValueError("step %r: N must be >= 1" % item)
        if explicit:
            steps.append(Step(item, float(at), "remove", 1, n))
        else:
            steps.append(Step(item, float(at), "add" if sign == "+" else "remove", n))
    if not steps:
        raise ValueError("no step in %r" % text)
    steps.sort(key=lambda s: s.at_s)
    active, total = set(range(servers)), servers
    for s in steps:
        if s.op == "add":
            active |= set(range(total, total + s.count))
            total += s.count
        elif s.shard is not None:
            if s.shard not in active:
                raise ValueError("step %r: shard %d is not in the fleet then" % (s.text, s.shard))
            active.discard(s.shard)
        else:
            for k in sorted(active, reverse=True)[:s.count]:
                active.discard(k)
        if not active:
            raise ValueError("step %r leaves no shard" % s.text)
    return steps


def check_opts(opts):
    """Why psrun cannot run this plan with these options, or None."""
    if getattr(opts, "emulate_hosts", None) and opts.etcd:
        return ("--elastic with --emulate_hosts and --etcd: the shards and psrun's ps_ctl run "
                "in the emulated network, which reaches nothing outside it; leave --etcd out "
                "(psrun starts etcd in the hub, on its address)")
    if opts.backend not in BACKENDS:
        return "--elastic runs on --backend %s, not --backend %s" % (", ".join(BACKENDS),
                                                                     opts.backend)
    if getattr(opts, "elastic_from", "start") == "training" and opts.backend == "k8s":
        return ("--elastic_from training: the k8s backend runs the plan in a Job of its own, "
                "which counts from the workers' start")
    return None


class Shard:
    """A shard as a plan step names it: its index and its endpoint (a
    replica group's members joined by '|')."""

    def __init__(self, rank, endpoint):
        self.rank = rank
        self.endpoint = endpoint


class Elastic:
    """Runs a plan against a Fleet (fleet.py) from its watch loop."""

    def __init__(self, fleet, steps):
        self.fleet = fleet
        self.steps = list(steps)
        # When the plan's clock started (--elastic_from): the workers' start,
        # or the first time every initial shard had counted a push.
        self.anchor = None
        self.asked_at = 0.0
        self.records = []
        self.stops = []  # (time, member): removed shards to shut down
        self.initial = None

    def prefix(self):
        return "/asyncps/" + self.fleet.etcd_prefix()

    def tick(self):
        """Due steps and stops, now. Raises member.LaunchError on a failure."""
        f = self.fleet
        if self.initial is None:
            self.initial = f.endpoints()  # replica groups as "ep1|ep2"
        now = time.time()
        for due, m in list(self.stops):
            if now >= due:
                self.stops.remove((due, m))
                self.stop(m)
        if self.anchor is None:
            self.anchor = self.training_began(now)
            if self.anchor is None:
                return
        while self.steps and now - self.anchor >= self.steps[0].at_s:
            step = self.steps.pop(0)
            for _ in range(step.count):
                self.run_step(step)

    def training_began(self, now):
        """The plan's time zero, or None while it is not known yet."""
        f = self.fleet
        if getattr(f.o, "elastic_from", "start") != "training":
            return f.worker_start
        if now - self.asked_at < 0.25:
            return None
        self.asked_at = now
        code, out, _ = f.ps_ctl("stats", self.initial, timeout_ms=1000)
        try:
            shards = json.loads(out.strip().splitlines()[-1])["shards"] if out.strip() else []
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        if code != 0 or not shards or not all(
                s.get("ok") and (s.get("stats") or {}).get("pushes", 0) > 0 for s in shards):
            return None
        f.log("psrun: elastic plan counts from now, %.1f s after the workers started: every "
              "shard counted a push" % (now - f.worker_start))
        return now

    def finish(self):
        """The workers are done: steps not run are recorded as skipped,
        removed shards still lingering are stopped."""
        for step in self.steps:
            self.fleet.log("psrun: elastic step %s skipped: the workers finished first" %
                           step.text)
            self.records.append({"step": step.text, "skipped": True})
        self.steps = []
        for _, m in self.stops:
            self.stop(m)
        self.stops = []
        self.write()

    def ctl(self, command, endpoint):
        f = self.fleet
        argv = f.ctl_prefix + [f.ctl, "--etcd=" + f.etcd_endpoints,
                               "--etcd_prefix=" + self.prefix(),
                               "--servers=" + self.initial, "--timeout_ms=5000"
                               ] + f.ctl_flags() + [command, endpoint]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        out = r.stdout.decode("utf-8", "replace").strip().splitlines()
        err = r.stderr.decode("utf-8", "replace").strip()
        try:
            rec = json.loads(out[-1]) if out else None
        except ValueError:
            rec = None
        if r.returncode != 0 or not rec or not rec.get("ok"):
            why = (rec or {}).get("message") or (err.splitlines()[-1:] or ["exit %d" %
                                                                           r.returncode])[0]
            return rec, why
        return rec, None

    def run_step(self, step):
        """One shard (a replica group of --replicas processes) joins or
        leaves through ps_ctl."""
        f = self.fleet
        t0 = time.time()
        at = t0 - self.anchor
        if step.op == "add":
            group = 1 + max(m.group for m in f.shards)
            if f.replicated():
                members = [Member("server", group * f.replicas + r, group, r)
                           for r in range(f.replicas)]
            else:
                members = [Member("server", group)]
            for m in members:
                m.num_shards = group + 1
                m.index = len(f.shards) + len(f.workers)  # ssh: the next slot after all started
                f.shards.append(m)
                f.start_shard(m)
            deadline = time.time() + f.o.start_timeout
            for m in members:
                m.endpoint = f.wait_ready_file(m, deadline)
            for m in members:
                f.wait_stats(m, deadline)
            f.write_pids()
            shard = Shard(group, "|".join(m.endpoint for m in members))
            rec, why = self.ctl("add-shard", shard.endpoint)
            while why and "no model yet" in why and time.time() < deadline:
                f.sleep(0.25)  # the workers have not registered the model yet
                rec, why = self.ctl("add-shard", shard.endpoint)
            if why:
                for m in members:
                    m.done = True
                    m.proc.signal(signal.SIGTERM)
                self.record(step, at, shard, rec, why, t0)
                raise LaunchError(members[0], "elastic step %s: ps_ctl add-shard %s failed: %s" %
                                  (step.text, shard.endpoint, why))
        else:
            live = sorted({m.group for m in f.shards
                           if not m.done and not getattr(m, "removed", False)})
            if step.shard is not None:
                if step.shard not in live:
                    raise LaunchError(None, "elastic step %s: shard %d is not in the fleet" %
                                      (step.text, step.shard))
                live = [step.shard]
            group = max(live)
            members = sorted((m for m in f.shards if m.group == group),
                             key=lambda m: m.replica or 0)
            shard = Shard(group, "|".join(m.endpoint or "" for m in members))
            rec, why = self.ctl("remove-shard", shard.endpoint)
            deadline = time.time() + f.o.start_timeout
            while why and "no model yet" in why and time.time() < deadline:
                f.sleep(0.25)
                rec, why = self.ctl("remove-shard", shard.endpoint)
            if why:
                self.record(step, at, shard, rec, why, t0)
                raise LaunchError(members[0], "elastic step %s: ps_ctl remove-shard %s failed: %s"
                                  % (step.text, shard.endpoint, why))
            for m in members:
                if not m.done:
                    m.removed = True
                    self.stops.append((time.time() + LINGER_S, m))
        self.record(step, at, shard, rec, None, t0)
        f.log("psrun: elastic %s %s (shard %d, %s): epoch %s, %s chunk(s) / %.2f MiB moved, "
              "workers frozen %.0f ms, imbalance %.3f -> %.3f, step took %.1f s" % (
                  step.text, "added" if step.op == "add" else "removed", shard.rank,
                  shard.endpoint, rec.get("epoch"), rec.get("moved_chunks"),
                  rec.get("moved_bytes", 0) / 2**20, rec.get("frozen_ms", 0),
                  rec.get("imbalance_before", 0), rec.get("imbalance_after", 0),
                  time.time() - t0))

    def stop(self, m):
        """A removed shard: shut down (its final checkpoint), not a failure."""
        f = self.fleet
        m.done = True
        code, out, err = f.ps_ctl("shutdown", m.endpoint)
        if code != 0 and f.own_proc(m):
            # Its own process (ssh: `kill` over ssh to its remote PID), never
            # a Slurm step other shards share; teardown SIGKILLs what is left.
            f.log("psrun: ps_ctl shutdown %s failed (%s): SIGTERM to %s" % (
                m.endpoint, ((err or out).strip().splitlines() or ["exit %d" % code])[-1],
                m.name))
            m.proc.signal(signal.SIGTERM)
        f.log("psrun: %s (removed from the fleet) shut down" % m.name)

    def record(self, step, at, m, rec, why, t0):
        """at: seconds after the plan's time zero (--elastic_from); t0/t1 (wall clock, s since
        the epoch): when the step began and ended (a new shard's start
        included)."""
        t1 = time.time()
        r = {"step": step.text, "at_s": round(at, 3), "shard": m.rank,
             "endpoint": m.endpoint, "ok": why is None, "report": rec,
             "t0": t0, "t1": t1, "took_s": round(t1 - t0, 3)}
        if why:
            r["error"] = why
        self.records.append(r)
        self.write()

    def write(self):
        f = self.fleet
        doc = {"steps": self.records, "from": getattr(f.o, "elastic_from", "start")}
        if self.anchor is not None and f.worker_start is not None:
            # When the plan's clock started, in seconds after the workers'.
            doc["from_s"] = round(self.anchor - f.worker_start, 3)
        summary_mod.write_json(f.path("elastic.json"), doc)


# Pauses around a change, from the workers' --push_log files (used by
# tests/launch/elastic_test.py and experiments/bench/bench_elastic.py).
def acked_times(path):
    """Acknowledgement times (s since the epoch) of one --push_log, sorted."""
    out = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 4 and p[0] == "acked":
                out.append(int(p[3]) / 1e6)
    return sorted(out)


def longest_gap(times, lo=None, hi=None):
    """Longest gap between consecutive times; with [lo, hi], only gaps that
    overlap that window. (gap, start) or (0, None)."""
    best = (0.0, None)
    for a, b in zip(times, times[1:]):
        if lo is not None and (b < lo or a > hi):
            continue
        if b - a > best[0]:
            best = (b - a, a)
    return best
