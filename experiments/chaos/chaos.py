#!/usr/bin/env python3
"""Chaos test: train Fashion-MNIST on a real fleet (ps_server shards +
ps_worker ranks started directly, as psrun's local backend does) while
kill -9-ing random shards (restarted from RocksDB, same port, --durable) and
random workers (restarted for their remaining steps), then compare with an
undisturbed run of the same seed.

Reports one JSON object:
  kills (shard/worker), final accuracy vs baseline, acknowledged pushes lost
  (per shard: pushes acknowledged to workers, counted from their SUMMARY
  steps or, for a killed incarnation, a lower bound from its last progress
  line, minus the shard's applied-push counter from ps_ctl stats),
  resume time after each shard restart (kill -> the restarted shard's push
  counter moves), deadlock (a run that does not finish within --timeout_s)
  and orphan processes (any started PID still alive at the end).

  experiments/chaos/chaos.py --build build --epochs 3 --kills 10
  experiments/chaos/chaos.py --short          # the CI version (< 60 s)
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

PROGRESS = re.compile(r"\[rank (\d+)\] epoch \d+ step (\d+)/(\d+)")
SUMMARY = re.compile(r"SUMMARY rank=(\d+) final_test_acc=([-\d.]+).* steps=(\d+)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Fleet:
    def __init__(self, a, run_dir, tag):
        self.a, self.dir, self.tag = a, run_dir, tag
        self.bin = os.path.join(a.build, "bin")
        self.eps = ["tcp://127.0.0.1:%d" % free_port() for _ in range(a.shards)]
        self.shards = [None] * a.shards
        self.workers = {}  # rank -> Popen of the current incarnation
        self.incarnations = []  # (rank, log path, popen)
        self.started = []  # every Popen, for the orphan check
        self.shard_starts = [0] * a.shards

    def log(self, name):
        return open(os.path.join(self.dir, "%s.%s.log" % (self.tag, name)), "ab")

    def start_shard(self, s):
        self.shard_starts[s] += 1
        cmd = [os.path.join(self.bin, "ps_server"), "--shard_id=%d" % s,
               "--num_shards=%d" % self.a.shards, "--num_workers=%d" % self.a.workers,
               "--endpoint=" + self.eps[s], "--consistency=asp", "--optimizer=sgd",
               "--lr=%g" % self.a.lr, "--checkpoint_every_s=5",
               "--worker_timeout_s=%g" % self.a.worker_timeout_s,
               "--db_path=" + os.path.join(self.dir, "%s.db%d" % (self.tag, s))]
        if self.a.durable:
            cmd.append("--durable")
        p = subprocess.Popen(cmd, stdout=self.log("shard%d" % s), stderr=subprocess.STDOUT)
        self.shards[s] = p
        self.started.append(p)

    def start_worker(self, r, max_steps=0):
        n = len([i for i in self.incarnations if i[0] == r])
        path = os.path.join(self.dir, "%s.worker%d.%d.log" % (self.tag, r, n))
        cmd = [os.path.join(self.bin, "ps_worker"), "--servers=" + ",".join(self.eps),
               "--rank=%d" % r, "--num_workers=%d" % self.a.workers,
               "--layers=784,256,128,10", "--batch=64", "--threads=1",
               "--seed=%d" % self.a.seed, "--log_every=%d" % self.a.log_every,
               "--timeout_s=%d" % self.a.timeout_s]
        steps = max_steps or self.a.max_steps
        # --max_steps caps --epochs (default 1): give enough epochs for it.
        cmd += ["--max_steps=%d" % steps, "--epochs=1000"] if steps else [
            "--epochs=%d" % self.a.epochs]
        if r == 0:
            cmd.append("--eval=true")
        if getattr(self.a, "push_log", False):
            cmd.append("--push_log=" + path + ".push")
        p = subprocess.Popen(cmd, stdout=open(path, "wb"), stderr=subprocess.STDOUT)
        self.workers[r] = p
        self.incarnations.append((r, path, p))
        self.started.append(p)

    def ctl(self, eps, cmd, timeout_ms=2000):
        out = subprocess.run([os.path.join(self.bin, "ps_ctl"), "--servers=" + ",".join(eps),
                              "--timeout_ms=%d" % timeout_ms, cmd],
                             capture_output=True, text=True)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return None

    def pushes(self, s):
        j = self.ctl([self.eps[s]], "stats", 500)
        try:
            return j["shards"][0]["stats"]["pushes"]
        except (TypeError, KeyError, IndexError):
            return None

    def wait_ready(self, s, deadline):
        while time.time() < deadline:
            if self.pushes(s) is not None:
                return True
            time.sleep(0.05)
        return False


def parse_worker_log(path):
    text = open(path, errors="replace").read()
    m = SUMMARY.search(text)
    last = 0
    for pm in PROGRESS.finditer(text):
        last = int(pm.group(2))
    if m:
        return {"done": True, "acc": float(m.group(2)), "steps": int(m.group(3)), "last": last}
    return {"done": False, "acc": None, "steps": 0, "last": last}


def run(a, run_dir, tag, chaos):
    f = Fleet(a, run_dir, tag)
    rng = random.Random(a.seed * 7919 + (1 if chaos else 0))
    for s in range(a.shards):
        f.start_shard(s)
    for s in range(a.shards):
        if not f.wait_ready(s, time.time() + 20):
            raise RuntimeError("shard %d did not start" % s)
    for r in range(a.workers):
        f.start_worker(r)
    t0 = time.time()
    kills = {"shard": 0, "worker": 0}
    remaining = {r: steps_total(a) for r in range(a.workers)}
    resume = []
    next_kill = t0 + a.first_kill_s
    deadlock = False
    while True:
        alive = [r for r, p in f.workers.items() if p.poll() is None]
        if not alive:
            break
        now = time.time()
        if now - t0 > a.timeout_s:
            deadlock = True
            break
        if chaos and sum(kills.values()) < a.kills and now >= next_kill:
            victims = ["shard"] * a.shards
            victims += ["worker"] * len([r for r in alive if r != 0])
            kind = rng.choice(victims)
            if kind == "shard":
                s = rng.randrange(a.shards)
                before = f.pushes(s) or 0
                t_kill = time.time()
                f.shards[s].send_signal(signal.SIGKILL)
                f.shards[s].wait()
                f.start_shard(s)
                # Resume: the restarted shard applies a push it had not seen.
                t_res = None
                while time.time() - t_kill < 30:
                    p = f.pushes(s)
                    if p is not None and p > before:
                        t_res = time.time()
                        break
                    if not any(w.poll() is None for w in f.workers.values()):
                        break
                    time.sleep(0.02)
                resume.append(None if t_res is None else round(t_res - t_kill, 3))
            else:
                r = rng.choice([r for r in alive if r != 0])
                f.workers[r].send_signal(signal.SIGKILL)
                f.workers[r].wait()
                info = parse_worker_log([i for i in f.incarnations if i[0] == r][-1][1])
                # Restarted for the steps the rank had left (at least a few).
                remaining[r] = max(10, remaining[r] - info["last"])
                f.start_worker(r, max_steps=remaining[r])
            kills[kind] += 1
            next_kill = time.time() + rng.uniform(0.5, 1.5) * a.kill_interval_s
        time.sleep(0.05)
    # Server-side applied pushes, then a clean shutdown.
    applied = [f.pushes(s) for s in range(a.shards)]
    f.ctl(f.eps, "shutdown")
    for p in f.started:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    acked = 0
    acked_lb_killed = 0
    acc = None
    for r, path, p in f.incarnations:
        info = parse_worker_log(path)
        if info["done"]:
            acked += info["steps"]
            if r == 0:
                acc = info["acc"]
        else:
            acked_lb_killed += max(0, info["last"] - 1)
    orphans = [p.pid for p in f.started if p.poll() is None]
    for p in f.started:
        if p.poll() is None:
            p.kill()
            p.wait()
    failed = [path for r, path, p in f.incarnations if p.returncode not in (0, -9)]
    per_shard = []
    for s in range(a.shards):
        ack = acked + acked_lb_killed  # one push request per shard per step
        per_shard.append({"applied": applied[s], "acked_at_least": ack,
                          "lost": None if applied[s] is None else max(0, ack - applied[s]),
                          "applied_unacked": None if applied[s] is None else applied[s] - ack})
    return {"tag": tag, "kills": kills, "final_test_acc": acc, "resume_s": resume,
            "deadlock": deadlock, "orphans": orphans, "failed_workers": failed,
            "wall_s": round(time.time() - t0, 1), "pushes": per_shard,
            "lost_acked_pushes": sum((x["lost"] or 0) for x in per_shard)}


def steps_total(a):
    if a.max_steps:
        return a.max_steps
    return a.epochs * (60000 // a.workers // 64)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max_steps", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--kill_interval_s", type=float, default=4.0)
    ap.add_argument("--first_kill_s", type=float, default=3.0)
    ap.add_argument("--worker_timeout_s", type=float, default=5.0)
    ap.add_argument("--timeout_s", type=int, default=600)
    ap.add_argument("--log_every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no_durable", dest="durable", action="store_false")
    ap.add_argument("--no_baseline", dest="baseline", action="store_false")
    ap.add_argument("--short", action="store_true",
                    help="CI version: 2 shards, 2 workers, 400 steps, 4 kills, no baseline")
    ap.add_argument("--keep", action="store_true", help="keep the run folder")
    a = ap.parse_args()
    if a.short:
        a.workers, a.max_steps, a.kills, a.kill_interval_s = 3, 400, 5, 1.5
        a.first_kill_s, a.baseline, a.timeout_s = 1.5, False, 50
    run_dir = tempfile.mkdtemp(prefix="asyncps-chaos-")
    out = {"config": {k: v for k, v in vars(a).items()}, "run_dir": run_dir}
    if a.baseline:
        out["baseline"] = run(a, run_dir, "baseline", chaos=False)
    out["chaos"] = run(a, run_dir, "chaos", chaos=True)
    c = out["chaos"]
    ok = (not c["deadlock"] and not c["orphans"] and not c["failed_workers"]
          and sum(c["kills"].values()) >= min(a.kills, 1)
          and (not a.durable or c["lost_acked_pushes"] == 0)
          and c["final_test_acc"] is not None)
    if a.baseline:
        b = out["baseline"]["final_test_acc"]
        out["accuracy_delta_points"] = None if b is None or c["final_test_acc"] is None \
            else round(100 * (c["final_test_acc"] - b), 2)
    res = [x for x in c["resume_s"] if x is not None]
    out["resume_s_max"] = max(res) if res else None
    out["ok"] = ok
    print(json.dumps(out))
    if not a.keep and ok:
        subprocess.run(["rm", "-rf", run_dir])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
